// EventChannel: hands one request's events from the engine loop thread to the gRPC handler
// thread that streams them. Push/Close never block (the loop must not wait on a slow client);
// Next blocks the handler with a timeout so it can poll for client cancellation (gRPC's sync
// API has no notification for it), in real time: a poll interval, not a deadline of the request.
// Thread-safe.
#pragma once

#include <deque>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"

namespace tandem {

template <typename Event>
class EventChannel {
 public:
  enum class Result { kEvent, kClosed, kTimeout };

  void Push(Event event) {
    absl::MutexLock l(&mu_);
    if (!closed_) events_.push_back(std::move(event));
  }
  // Ends the stream with `status` after the queued events (first Close wins).
  void Close(absl::Status status) {
    absl::MutexLock l(&mu_);
    if (closed_) return;
    closed_ = true;
    status_ = std::move(status);
  }
  bool closed() const {
    absl::MutexLock l(&mu_);
    return closed_;
  }
  // kEvent: *event is the next event; kClosed: all events consumed, *status is the verdict;
  // kTimeout: nothing within `timeout`.
  Result Next(Event* event, absl::Status* status, absl::Duration timeout) {
    absl::MutexLock l(&mu_);
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return closed_ || !events_.empty(); };
    Clock::Real()->AwaitWithTimeout(&mu_, absl::Condition(&ready), timeout);
    if (!events_.empty()) {
      *event = std::move(events_.front());
      events_.pop_front();
      return Result::kEvent;
    }
    if (closed_) {
      *status = status_;
      return Result::kClosed;
    }
    return Result::kTimeout;
  }

 private:
  mutable absl::Mutex mu_;
  std::deque<Event> events_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem
