// FakeClock: a Clock (base/clock.h) that stands still until a test moves it with Advance().
// Sleeps and timed waits on it block until time is advanced to or past their deadline (or, for
// a timed wait, until its condition holds); time never moves by itself, so whatever a component
// decides from time happens exactly when the test says.
//
// Observing a component from a test: after Advance(), threads whose deadline passed wake
// asynchronously; AwaitWaiterUntil(t) blocks (in real time) until some thread waits on the clock
// with deadline t, i.e. until the component has decided when it wants to wake next. Tests use it
// to check that decision and to know that a component has gone back to waiting.
//
// How a timed wait wakes (the part that needs care): the waiter registers {its mutex, deadline}
// and waits on its own mutex for "condition || fired". Advance() sets `fired` under the
// waiter's mutex, which makes absl::Mutex re-evaluate the condition. Advance() never holds the
// clock's lock while taking a waiter's mutex (a waiter calls Now() with its mutex held), and a
// waiter does not return (its mutex may die with it) while Advance() still has it pinned.
#pragma once

#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"

namespace tandem::testing {

class FakeClock final : public Clock {
 public:
  // An arbitrary fixed instant, far from the real now: a fake time that leaks into something
  // measured by the real clock (a gRPC or socket deadline) shows up as an obvious failure.
  static constexpr absl::Time kDefaultStart = absl::FromUnixSeconds(1'000'000'000);

  explicit FakeClock(absl::Time start = kDefaultStart) : now_(start) {}
  ~FakeClock() override;  // CHECKs that no thread still waits on it

  absl::Time Now() override;
  void SleepUntil(absl::Time deadline) override;
  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& condition,
                         absl::Time deadline) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Moves time forward by `duration` (>= 0) and wakes every sleep and timed wait whose deadline
  // is now reached. Returns once each of them has been told (not once it has run). Never call it
  // while holding a mutex that a waiter on this clock uses.
  void Advance(absl::Duration duration);

  // Threads waiting on this clock right now (sleeping or in a timed wait).
  int num_waiters() const;
  // Blocks, in real time up to `timeout`, until some thread waits on this clock with exactly
  // `deadline`; false on timeout.
  bool AwaitWaiterUntil(absl::Time deadline, absl::Duration timeout = absl::Seconds(10));
  // Blocks, in real time up to `timeout`, until at least `n` threads wait on this clock.
  bool AwaitWaiters(int n, absl::Duration timeout = absl::Seconds(10));

 private:
  struct Waiter {
    absl::Mutex* mu;      // the waiting thread's mutex
    absl::Time deadline;  // by this clock
    bool fired = false;   // guarded by *mu: the deadline was reached
    int pins = 0;         // guarded by FakeClock::mu_: Advance() will still touch *mu
  };

  // With *w.mu held: takes w off the list; waits for Advance() to unpin it (releasing *w.mu
  // meanwhile) so that the caller may return.
  void Unregister(Waiter& w);

  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  std::vector<Waiter*> waiters_ ABSL_GUARDED_BY(mu_);  // deadlines all after now_
};

}  // namespace tandem::testing
