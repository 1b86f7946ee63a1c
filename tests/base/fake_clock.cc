#include "tests/base/fake_clock.h"

#include <algorithm>

#include "base/check.h"

namespace tandem::testing {

FakeClock::~FakeClock() {
  absl::MutexLock l(&mu_);
  CHECK(waiters_.empty()) << waiters_.size()
                          << " threads still wait on a FakeClock being destroyed";
}

absl::Time FakeClock::Now() {
  absl::MutexLock l(&mu_);
  return now_;
}

void FakeClock::SleepUntil(absl::Time deadline) {
  absl::Mutex mu;
  absl::MutexLock l(&mu);
  static constexpr bool kNever = false;
  AwaitWithDeadline(&mu, absl::Condition(&kNever), deadline);
}

bool FakeClock::AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& condition,
                                  absl::Time deadline) {
  if (condition.Eval()) return true;
  Waiter w{mu, deadline};
  {
    absl::MutexLock l(&mu_);
    if (now_ >= deadline) return false;
    waiters_.push_back(&w);
  }
  auto woken = [&w, &condition] { return w.fired || condition.Eval(); };
  mu->Await(absl::Condition(&woken));
  Unregister(w);
  return condition.Eval();
}

void FakeClock::Unregister(Waiter& w) {
  mu_.Lock();
  waiters_.erase(std::remove(waiters_.begin(), waiters_.end(), &w), waiters_.end());
  if (w.pins == 0) {
    mu_.Unlock();
    return;
  }
  // Advance() took w off the list and is about to lock *w.mu: let it, then wait until it is done
  // (no new pin can come: w is no longer listed).
  w.mu->Unlock();
  auto unpinned = [&w]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return w.pins == 0; };
  mu_.Await(absl::Condition(&unpinned));
  mu_.Unlock();
  w.mu->Lock();
}

void FakeClock::Advance(absl::Duration duration) {
  CHECK(duration >= absl::ZeroDuration()) << "time only moves forward";
  std::vector<Waiter*> due;
  {
    absl::MutexLock l(&mu_);
    now_ += duration;
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if ((*it)->deadline <= now_) {
        ++(*it)->pins;
        due.push_back(*it);
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (Waiter* w : due) {
    absl::MutexLock l(w->mu);  // unlocking re-evaluates the waiter's condition
    w->fired = true;
  }
  absl::MutexLock l(&mu_);
  for (Waiter* w : due) --w->pins;
}

int FakeClock::num_waiters() const {
  absl::MutexLock l(&mu_);
  return static_cast<int>(waiters_.size());
}

bool FakeClock::AwaitWaiterUntil(absl::Time deadline, absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  auto waiting = [this, deadline]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return std::any_of(waiters_.begin(), waiters_.end(),
                       [deadline](const Waiter* w) { return w->deadline == deadline; });
  };
  return mu_.AwaitWithTimeout(absl::Condition(&waiting), timeout);
}

bool FakeClock::AwaitWaiters(int n, absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<int>(waiters_.size()) >= n;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
}

}  // namespace tandem::testing
