// TimerThread: runs callbacks after a delay on one background thread (retries, heartbeat
// expiry checks). Callbacks must be short; they run in deadline order, each once its deadline
// is reached on the clock given at construction. Thread-safe. The destructor drops callbacks
// that have not run yet.
#pragma once

#include <functional>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"

namespace tandem::router {

class TimerThread {
 public:
  // `clock` must outlive the timer thread.
  explicit TimerThread(Clock* clock = Clock::Real());
  ~TimerThread();
  TimerThread(const TimerThread&) = delete;
  TimerThread& operator=(const TimerThread&) = delete;

  void RunAfter(absl::Duration delay, std::function<void()> callback);
  // Runs `callback` every `period` until destruction.
  void RunEvery(absl::Duration period, std::function<void()> callback);

 private:
  void Loop();

  Clock* const clock_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::multimap<absl::Time, std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace tandem::router
