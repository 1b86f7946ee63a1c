#include "router/admission.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem::router {

AdmissionController::AdmissionController(AdmissionOptions options)
    : options_([&] {
        options.max_running = std::max(1, options.max_running);
        options.max_waiting = std::max(0, options.max_waiting);
        return options;
      }()) {}

bool AdmissionController::FitsLocked(int64_t kv_tokens) const {
  if (static_cast<int>(running_.size()) >= options_.max_running) return false;
  if (running_.empty() || capacity_ <= 0) return true;
  return running_kv_tokens_ + kv_tokens <= capacity_;
}

void AdmissionController::RunLocked(uint64_t ticket, int64_t kv_tokens) {
  running_[ticket] = kv_tokens;
  running_kv_tokens_ += kv_tokens;
}

std::vector<std::function<void()>> AdmissionController::TakeStartableLocked() {
  std::vector<std::function<void()>> starts;
  while (!waiting_.empty() && FitsLocked(waiting_.front().kv_tokens)) {
    Waiter& w = waiting_.front();
    RunLocked(w.ticket, w.kv_tokens);
    starts.push_back(std::move(w.start));
    waiting_.pop_front();
  }
  return starts;
}

absl::Status AdmissionController::Admit(uint64_t ticket, std::function<void()> start,
                                        std::function<void(const absl::Status&)> reject,
                                        int64_t kv_tokens) {
  {
    absl::MutexLock lock(&mu_);
    if (!waiting_.empty() || !FitsLocked(kv_tokens)) {
      if (static_cast<int>(waiting_.size()) >= options_.max_waiting) {
        return absl::ResourceExhaustedError(
            absl::StrCat("the server is overloaded: ", running_.size(), " requests running and ",
                         waiting_.size(), " waiting (the queue is full); retry later"));
      }
      waiting_.push_back(
          Waiter{ticket, kv_tokens, options_.clock->Now(), std::move(start), std::move(reject)});
      return absl::OkStatus();
    }
    RunLocked(ticket, kv_tokens);
  }
  start();
  return absl::OkStatus();
}

bool AdmissionController::CancelWaiting(uint64_t ticket) {
  std::vector<std::function<void()>> starts;
  {
    absl::MutexLock lock(&mu_);
    auto it = std::find_if(waiting_.begin(), waiting_.end(),
                           [ticket](const Waiter& w) { return w.ticket == ticket; });
    if (it == waiting_.end()) return false;
    const bool front = it == waiting_.begin();
    waiting_.erase(it);
    if (front) starts = TakeStartableLocked();  // it may have blocked smaller ones
  }
  for (auto& start : starts) start();
  return true;
}

void AdmissionController::Release(uint64_t ticket) {
  std::vector<std::function<void()>> starts;
  {
    absl::MutexLock lock(&mu_);
    auto it = running_.find(ticket);
    if (it == running_.end()) return;
    running_kv_tokens_ -= it->second;
    running_.erase(it);
    starts = TakeStartableLocked();
  }
  for (auto& start : starts) start();
}

void AdmissionController::SetCapacity(int64_t kv_tokens) {
  std::vector<std::function<void()>> starts;
  {
    absl::MutexLock lock(&mu_);
    capacity_ = std::max<int64_t>(0, kv_tokens);
    starts = TakeStartableLocked();
  }
  for (auto& start : starts) start();
}

int AdmissionController::ExpireWaiting() {
  if (options_.max_queue_time <= absl::ZeroDuration()) return 0;
  std::vector<std::function<void(const absl::Status&)>> rejects;
  std::vector<std::function<void()>> starts;
  absl::Duration waited_limit = options_.max_queue_time;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time cutoff = options_.clock->Now() - waited_limit;
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (it->queued_at > cutoff || !it->reject) {
        ++it;
        continue;
      }
      rejects.push_back(std::move(it->reject));
      it = waiting_.erase(it);
    }
    if (!rejects.empty()) starts = TakeStartableLocked();
  }
  for (auto& start : starts) start();
  const absl::Status status = absl::ResourceExhaustedError(absl::StrCat(
      "the server is overloaded: the request waited ", absl::FormatDuration(waited_limit),
      " (--max-queue-time-s) for a slot; retry later"));
  for (auto& reject : rejects) reject(status);
  return static_cast<int>(rejects.size());
}

int AdmissionController::running() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(running_.size());
}

int AdmissionController::waiting() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(waiting_.size());
}

int64_t AdmissionController::running_kv_tokens() const {
  absl::MutexLock lock(&mu_);
  return running_kv_tokens_;
}

}  // namespace tandem::router
