// AdmissionController: bounds the requests the router works on, so that an overload is queued
// where its wait is bounded (here) instead of in the workers' queues, where it is not.
//
// A request runs (is routed to workers) when a slot is free: fewer than max_running requests
// run, and the KV tokens they may need (prompt + max_tokens each) fit in what the workers can
// hold (SetCapacity: the KV pools of the healthy decode-side workers; a request larger than all
// of it still runs alone). Otherwise it waits, in FIFO order (the first waiter blocks the
// others: a large request is not starved by small ones). Refused with ResourceExhausted (HTTP
// 429 + Retry-After): a request arriving when max_waiting wait already, and a waiter still
// queued after max_queue_time (ExpireWaiting). Thread-safe; the start and reject callbacks run
// outside the lock, on the thread that admitted, released or expired.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"

namespace tandem::router {

struct AdmissionOptions {
  int max_running = 1024;
  int max_waiting = 4096;
  absl::Duration max_queue_time = absl::Seconds(30);  // <= 0: no bound
  Clock* clock = Clock::Real();
};

class AdmissionController {
 public:
  explicit AdmissionController(AdmissionOptions options);
  AdmissionController(int max_running, int max_waiting)
      : AdmissionController(AdmissionOptions{max_running, max_waiting, absl::ZeroDuration()}) {}

  // Runs `start` now if a slot is free, else queues it; `reject` is called instead of `start`
  // if it waits too long. `ticket` is the caller's unique id of the request (for CancelWaiting
  // and Release). ResourceExhausted when the queue is full. `kv_tokens`: the KV the request may
  // need (prompt + max_tokens).
  absl::Status Admit(uint64_t ticket, std::function<void()> start,
                     std::function<void(const absl::Status&)> reject = nullptr,
                     int64_t kv_tokens = 0);
  // Removes a queued request; true if it was still waiting (neither callback will run).
  bool CancelWaiting(uint64_t ticket);
  // A running request finished: frees its slot and starts the waiters that now fit.
  void Release(uint64_t ticket);

  // The KV tokens the workers can hold; 0: unknown (only max_running bounds). Starts the
  // waiters that fit if it grew.
  void SetCapacity(int64_t kv_tokens);
  // Rejects the waiters queued for longer than max_queue_time; returns how many.
  int ExpireWaiting();

  int running() const;
  int waiting() const;
  int64_t running_kv_tokens() const;

 private:
  struct Waiter {
    uint64_t ticket;
    int64_t kv_tokens;
    absl::Time queued_at;
    std::function<void()> start;
    std::function<void(const absl::Status&)> reject;
  };

  bool FitsLocked(int64_t kv_tokens) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunLocked(uint64_t ticket, int64_t kv_tokens) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the waiters that fit now, front first; the caller starts them outside the lock.
  std::vector<std::function<void()>> TakeStartableLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const AdmissionOptions options_;
  mutable absl::Mutex mu_;
  int64_t capacity_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t running_kv_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, int64_t> running_ ABSL_GUARDED_BY(mu_);  // ticket → kv tokens
  std::deque<Waiter> waiting_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::router
