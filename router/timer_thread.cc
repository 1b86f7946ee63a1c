#include "router/timer_thread.h"

#include <memory>

namespace tandem::router {

TimerThread::TimerThread() : thread_([this] { Loop(); }) {}

TimerThread::~TimerThread() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.Signal();
  thread_.join();
}

void TimerThread::RunAfter(absl::Duration delay, std::function<void()> callback) {
  absl::MutexLock lock(&mu_);
  tasks_.emplace(absl::Now() + delay, std::move(callback));
  cv_.Signal();
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
    if (tasks_.empty()) {
      cv_.Wait(&mu_);
      continue;
    }
    const absl::Time next = tasks_.begin()->first;
    if (absl::Now() < next) {
      cv_.WaitWithDeadline(&mu_, next);  // woken early when an earlier task arrives
      continue;
    }
    std::function<void()> task = std::move(tasks_.begin()->second);
    tasks_.erase(tasks_.begin());
    mu_.Unlock();
    task();
    mu_.Lock();
  }
}

}  // namespace tandem::router
