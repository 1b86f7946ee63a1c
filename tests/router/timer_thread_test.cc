// TimerThread on a FakeClock: each callback runs once its deadline is reached and not before,
// in deadline order; the thread always sleeps until the earliest deadline (a task added for
// earlier wakes it); RunEvery repeats one period after each run; destruction drops the rest.
#include "router/timer_thread.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/base/fake_clock.h"

namespace tandem::router {
namespace {

using ::tandem::testing::FakeClock;

// What the callbacks did, in order (they run on the timer thread).
class Log {
 public:
  std::function<void()> Add(std::string name) {
    return [this, name] {
      absl::MutexLock l(&mu_);
      entries_.push_back(name);
    };
  }
  // Waits (real time) until there are `n` entries; returns them.
  std::vector<std::string> Await(size_t n) {
    absl::MutexLock l(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return entries_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    return entries_;
  }
  std::vector<std::string> entries() {
    absl::MutexLock l(&mu_);
    return entries_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> entries_ ABSL_GUARDED_BY(mu_);
};

TEST(TimerThreadTest, RunsEachCallbackWhenItsDeadlineIsReachedInDeadlineOrder) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  Log log;
  TimerThread timers(&clock);
  timers.RunAfter(absl::Milliseconds(100), log.Add("b"));
  timers.RunAfter(absl::Milliseconds(30), log.Add("a"));
  timers.RunAfter(absl::Milliseconds(100), log.Add("c"));  // same deadline: after "b"
  ASSERT_TRUE(clock.AwaitWaiterUntil(start + absl::Milliseconds(30)));
  clock.Advance(absl::Milliseconds(29));
  EXPECT_TRUE(clock.AwaitWaiterUntil(start + absl::Milliseconds(30)));  // still asleep
  EXPECT_TRUE(log.entries().empty());
  clock.Advance(absl::Milliseconds(1));
  EXPECT_EQ(log.Await(1), std::vector<std::string>({"a"}));
  ASSERT_TRUE(clock.AwaitWaiterUntil(start + absl::Milliseconds(100)));
  EXPECT_EQ(log.entries().size(), 1u);
  clock.Advance(absl::Milliseconds(500));  // past both at once
  EXPECT_EQ(log.Await(3), std::vector<std::string>({"a", "b", "c"}));
}

TEST(TimerThreadTest, AnEarlierTaskWakesTheThreadSleepingOnALaterOne) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  Log log;
  TimerThread timers(&clock);
  timers.RunAfter(absl::Hours(1), log.Add("late"));
  ASSERT_TRUE(clock.AwaitWaiterUntil(start + absl::Hours(1)));
  timers.RunAfter(absl::Milliseconds(10), log.Add("early"));
  ASSERT_TRUE(clock.AwaitWaiterUntil(start + absl::Milliseconds(10)));
  clock.Advance(absl::Milliseconds(10));
  EXPECT_EQ(log.Await(1), std::vector<std::string>({"early"}));
  ASSERT_TRUE(clock.AwaitWaiterUntil(start + absl::Hours(1)));
  EXPECT_EQ(log.entries().size(), 1u);
  // A task with no delay runs without time moving.
  timers.RunAfter(absl::ZeroDuration(), log.Add("now"));
  EXPECT_EQ(log.Await(2), std::vector<std::string>({"early", "now"}));
}

TEST(TimerThreadTest, RunEveryRepeatsOnePeriodAfterEachRunUntilDestroyed) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  Log log;
  {
    TimerThread timers(&clock);
    timers.RunEvery(absl::Milliseconds(50), log.Add("tick"));
    for (size_t i = 1; i <= 3; ++i) {
      ASSERT_TRUE(clock.AwaitWaiterUntil(start + absl::Milliseconds(50) * i));
      EXPECT_EQ(log.entries().size(), i - 1);
      clock.Advance(absl::Milliseconds(50));
      EXPECT_EQ(log.Await(i).size(), i);
    }
    // Late by more than a period: it runs once, and again one period after that run.
    ASSERT_TRUE(clock.AwaitWaiterUntil(start + absl::Milliseconds(200)));
    clock.Advance(absl::Milliseconds(120));
    EXPECT_EQ(log.Await(4).size(), 4u);
    ASSERT_TRUE(clock.AwaitWaiterUntil(start + absl::Milliseconds(270 + 50)));
    EXPECT_EQ(log.entries().size(), 4u);
    timers.RunAfter(absl::Milliseconds(10), log.Add("dropped"));  // pending at destruction
  }
  EXPECT_EQ(clock.num_waiters(), 0);
  clock.Advance(absl::Hours(1));
  EXPECT_EQ(log.entries().size(), 4u);
}

}  // namespace
}  // namespace tandem::router
