// The real clock does what absl does; the fake clock stands still until advanced, and every
// sleep and timed wait on it wakes exactly when time reaches its deadline (or, for a wait, when
// its condition comes true), including waits on mutexes that die right after the wait.
#include "absl/time/clock.h"

#include <atomic>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "gtest/gtest.h"
#include "tests/base/fake_clock.h"

namespace tandem {
namespace {

using testing::FakeClock;

TEST(RealClockTest, ReadsAndWaitsOnTheSystemClock) {
  Clock* clock = Clock::Real();
  EXPECT_EQ(Clock::Real(), clock);
  const absl::Time before = absl::Now();
  const absl::Time now = clock->Now();
  EXPECT_LE(before, now);
  EXPECT_LE(now, absl::Now());
  clock->SleepFor(absl::Milliseconds(20));
  EXPECT_GE(absl::Now() - before, absl::Milliseconds(20));
  absl::Mutex mu;
  bool flag = false;
  absl::MutexLock l(&mu);
  const absl::Time start = absl::Now();
  EXPECT_FALSE(clock->AwaitWithTimeout(&mu, absl::Condition(&flag), absl::Milliseconds(20)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(20));
  flag = true;
  EXPECT_TRUE(clock->AwaitWithDeadline(&mu, absl::Condition(&flag), absl::InfiniteFuture()));
}

TEST(FakeClockTest, StandsStillUntilAdvanced) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  EXPECT_EQ(start, FakeClock::kDefaultStart);
  absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(clock.Now(), start);
  clock.Advance(absl::Milliseconds(250));
  EXPECT_EQ(clock.Now(), start + absl::Milliseconds(250));
  clock.Advance(absl::ZeroDuration());
  EXPECT_EQ(clock.Now(), start + absl::Milliseconds(250));
  EXPECT_EQ(FakeClock(absl::UnixEpoch()).Now(), absl::UnixEpoch());
}

TEST(FakeClockTest, SleepEndsExactlyWhenTimeReachesItsDeadline) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  std::atomic<bool> woke{false};
  std::thread sleeper([&] {
    clock.SleepFor(absl::Milliseconds(100));
    woke = true;
  });
  ASSERT_TRUE(clock.AwaitWaiterUntil(start + absl::Milliseconds(100)));
  clock.Advance(absl::Milliseconds(99));
  EXPECT_EQ(clock.num_waiters(), 1);  // not due: Advance did not touch it
  EXPECT_FALSE(woke);
  clock.Advance(absl::Milliseconds(1));
  sleeper.join();
  EXPECT_TRUE(woke);
  EXPECT_EQ(clock.num_waiters(), 0);
  clock.SleepUntil(start);  // in the past: returns at once
  clock.SleepFor(absl::ZeroDuration());
}

TEST(FakeClockTest, OneAdvanceWakesEveryWaiterItPassesAndNoOther) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  std::atomic<int> woke{0};
  std::vector<std::thread> threads;
  for (int ms : {10, 20, 30}) {
    threads.emplace_back([&, ms] {
      clock.SleepFor(absl::Milliseconds(ms));
      ++woke;
    });
  }
  ASSERT_TRUE(clock.AwaitWaiters(3));
  clock.Advance(absl::Milliseconds(25));
  EXPECT_TRUE(clock.AwaitWaiterUntil(start + absl::Milliseconds(30)));
  EXPECT_EQ(clock.num_waiters(), 1);
  clock.Advance(absl::Hours(1));
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(woke, 3);
}

TEST(FakeClockTest, TimedWaitReturnsTheConditionAtEitherEnd) {
  FakeClock clock;
  absl::Mutex mu;
  bool ready = false;
  {
    absl::MutexLock l(&mu);
    EXPECT_FALSE(clock.AwaitWithDeadline(&mu, absl::Condition(&ready), clock.Now()));  // passed
    ready = true;
    EXPECT_TRUE(clock.AwaitWithTimeout(&mu, absl::Condition(&ready), absl::Seconds(1)));
    ready = false;
  }
  // Made true by another thread, under the mutex, long before the deadline.
  std::thread setter([&] {
    ASSERT_TRUE(clock.AwaitWaiters(1));
    absl::MutexLock l(&mu);
    ready = true;
  });
  {
    absl::MutexLock l(&mu);
    EXPECT_TRUE(clock.AwaitWithTimeout(&mu, absl::Condition(&ready), absl::Hours(1)));
  }
  setter.join();
  EXPECT_EQ(clock.num_waiters(), 0);
  // The deadline first: false, and the caller holds the mutex again.
  const absl::Time deadline = clock.Now() + absl::Seconds(3);
  std::thread waiter([&] {
    absl::MutexLock l(&mu);
    ready = false;
    EXPECT_FALSE(clock.AwaitWithDeadline(&mu, absl::Condition(&ready), deadline));
    ready = true;  // still under the lock
  });
  ASSERT_TRUE(clock.AwaitWaiterUntil(deadline));
  clock.Advance(absl::Seconds(3));
  waiter.join();
  absl::MutexLock l(&mu);
  EXPECT_TRUE(ready);
}

TEST(FakeClockTest, WaitsOnShortLivedMutexesSurviveConcurrentAdvances) {
  // Each wait's mutex dies right after the wait returns, while another thread keeps advancing
  // and a third makes some conditions true: the pinning in Advance/Unregister must hold.
  FakeClock clock;
  constexpr int kThreads = 4;
  constexpr int kWaits = 300;
  std::atomic<int> done{0};
  std::atomic<int> timed_out{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kWaits; ++i) {
        absl::Mutex mu;
        bool flag = false;
        std::thread setter;
        if ((i + t) % 3 == 0) {
          setter = std::thread([&] {
            absl::MutexLock l(&mu);
            flag = true;
          });
        }
        {
          absl::MutexLock l(&mu);
          if (!clock.AwaitWithTimeout(&mu, absl::Condition(&flag), absl::Microseconds(1 + i % 5))) {
            ++timed_out;
          }
        }
        if (setter.joinable()) setter.join();
      }
      ++done;
    });
  }
  while (done < kThreads) clock.Advance(absl::Microseconds(1));
  for (std::thread& t : threads) t.join();
  EXPECT_GT(timed_out, 0);
  EXPECT_EQ(clock.num_waiters(), 0);
}

}  // namespace
}  // namespace tandem
