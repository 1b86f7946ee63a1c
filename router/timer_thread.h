// TimerThread: runs callbacks after a delay on one background thread (retries, heartbeat
// expiry checks). Callbacks must be short; they run in deadline order. Thread-safe. The
// destructor drops callbacks that have not run yet.
#pragma once

#include <functional>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tandem::router {

class TimerThread {
 public:
  TimerThread();
  ~TimerThread();
  TimerThread(const TimerThread&) = delete;
  TimerThread& operator=(const TimerThread&) = delete;

  void RunAfter(absl::Duration delay, std::function<void()> callback);
  // Runs `callback` every `period` until destruction.
  void RunEvery(absl::Duration period, std::function<void()> callback);

 private:
  void Loop();

  absl::Mutex mu_;
  absl::CondVar cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::multimap<absl::Time, std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace tandem::router
