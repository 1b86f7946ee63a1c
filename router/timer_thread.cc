#include "router/timer_thread.h"

#include <memory>

namespace tandem::router {

TimerThread::TimerThread(Clock* clock) : clock_(clock), thread_([this] { Loop(); }) {}

TimerThread::~TimerThread() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void TimerThread::RunAfter(absl::Duration delay, std::function<void()> callback) {
  absl::MutexLock lock(&mu_);
  tasks_.emplace(clock_->Now() + delay, std::move(callback));
}

void TimerThread::RunEvery(absl::Duration period, std::function<void()> callback) {
  auto shared = std::make_shared<std::function<void()>>(std::move(callback));
  auto tick = std::make_shared<std::function<void()>>();
  *tick = [this, period, shared, weak = std::weak_ptr<std::function<void()>>(tick)] {
    (*shared)();
    if (auto self = weak.lock()) RunAfter(period, [self] { (*self)(); });
  };
  // The task map holds the only strong reference to `tick` (through the scheduled closure).
  RunAfter(period, [tick] { (*tick)(); });
}

void TimerThread::Loop() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    const absl::Time next = tasks_.empty() ? absl::InfiniteFuture() : tasks_.begin()->first;
    // Woken early by stop or by a task due before `next` (the condition is re-evaluated
    // whenever a RunAfter releases mu_).
    auto changed = [this, next]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stop_ || (!tasks_.empty() && tasks_.begin()->first < next);
    };
    if (clock_->AwaitWithDeadline(&mu_, absl::Condition(&changed), next)) continue;
    // The deadline `next` passed with no earlier task: the first task is due.
    std::function<void()> task = std::move(tasks_.begin()->second);
    tasks_.erase(tasks_.begin());
    mu_.Unlock();
    task();
    mu_.Lock();
  }
}

}  // namespace tandem::router
