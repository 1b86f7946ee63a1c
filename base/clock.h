// Clock: the one way tandem reads time and waits for it (LevelDB's Env idea, for time only).
//
// Components take a Clock* through their constructor or options (default Clock::Real()) and use
// it for every piece of time *logic*: timestamps (arrival, TTFT, durations), deadlines, TTLs,
// heartbeat expiry, retry budgets, periodic ticks and the timed waits that serve them. Tests
// hand them a FakeClock (tests/base/fake_clock.h) and move time by hand, so such logic is tested
// exactly instead of with wall-clock slack.
//
// What stays on Clock::Real() by name, whatever a component was given: deadlines handed to
// something that measures them itself (gRPC call deadlines, poll(2) on a socket), and polls for
// events that have no notification (a gRPC server's cancellation flag, a child process's exit).
// Those are mechanism, not policy; a fake time there would be meaningless.
//
// Outside base/clock.cc nothing calls absl::Now(), absl::SleepFor() or a mutex's timed wait
// directly; the loadgen keeps its own monotonic BenchClock (loadgen/bench_clock.h).
//
// Thread-safe. Never hold a mutex that another thread waits on through the same clock while
// advancing a fake clock (see FakeClock::Advance).
#pragma once

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tandem {

class Clock {
 public:
  // The system clock: absl::Now(), absl::SleepFor(), absl::Mutex's own timed waits. Lives for
  // the whole process.
  static Clock* Real();

  virtual ~Clock() = default;

  virtual absl::Time Now() = 0;
  // Blocks the calling thread until Now() >= deadline.
  virtual void SleepUntil(absl::Time deadline) = 0;
  void SleepFor(absl::Duration duration) { SleepUntil(Now() + duration); }

  // absl::Mutex::AwaitWithDeadline measured by this clock: with `mu` held, releases it until
  // `condition` holds or Now() >= deadline, then reacquires it. Returns the condition's value
  // (false: the deadline passed first). As with absl::Mutex, the condition is re-evaluated
  // whenever `mu` is released, so whoever makes it true must do so under `mu`.
  virtual bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& condition,
                                 absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;
  bool AwaitWithTimeout(absl::Mutex* mu, const absl::Condition& condition, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return AwaitWithDeadline(mu, condition, Now() + timeout);
  }
};

}  // namespace tandem
