// AdmissionController: bounds the requests the router works on. At most max_running requests run
// (are routed to workers) at once; up to max_waiting more wait in FIFO order; beyond that a
// request is refused with ResourceExhausted (HTTP 429 + Retry-After). Thread-safe; the start
// callbacks run outside the lock, on the thread that admitted or released.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace tandem::router {

class AdmissionController {
 public:
  AdmissionController(int max_running, int max_waiting);

  // Runs `start` now if a running slot is free, else queues it. Returns a ticket for
  // CancelWaiting. ResourceExhausted when the queue is full.
  absl::StatusOr<uint64_t> Admit(std::function<void()> start);
  // Removes a queued request; true if it was still waiting (its start will never run).
  bool CancelWaiting(uint64_t ticket);
  // A running request finished: frees its slot and starts the next waiter, if any.
  void Release();

  int running() const;
  int waiting() const;

 private:
  struct Waiter {
    uint64_t ticket;
    std::function<void()> start;
  };

  const int max_running_;
  const int max_waiting_;
  mutable absl::Mutex mu_;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  std::deque<Waiter> waiting_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::router
