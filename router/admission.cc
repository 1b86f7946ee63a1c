#include "router/admission.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem::router {

AdmissionController::AdmissionController(int max_running, int max_waiting)
    : max_running_(std::max(1, max_running)), max_waiting_(std::max(0, max_waiting)) {}

absl::StatusOr<uint64_t> AdmissionController::Admit(std::function<void()> start) {
  uint64_t ticket;
  {
    absl::MutexLock lock(&mu_);
    ticket = next_ticket_++;
    if (running_ >= max_running_) {
      if (static_cast<int>(waiting_.size()) >= max_waiting_) {
        return absl::ResourceExhaustedError(
            absl::StrCat("the server is overloaded: ", running_, " requests running and ",
                         waiting_.size(), " waiting (the queue is full); retry later"));
      }
      waiting_.push_back(Waiter{ticket, std::move(start)});
      return ticket;
    }
    ++running_;
  }
  start();
  return ticket;
}

bool AdmissionController::CancelWaiting(uint64_t ticket) {
  absl::MutexLock lock(&mu_);
  auto it = std::find_if(waiting_.begin(), waiting_.end(),
                         [ticket](const Waiter& w) { return w.ticket == ticket; });
  if (it == waiting_.end()) return false;
  waiting_.erase(it);
  return true;
}

void AdmissionController::Release() {
  std::function<void()> next;
  {
    absl::MutexLock lock(&mu_);
    --running_;
    if (waiting_.empty() || running_ >= max_running_) return;
    next = std::move(waiting_.front().start);
    waiting_.pop_front();
    ++running_;
  }
  next();
}

int AdmissionController::running() const {
  absl::MutexLock lock(&mu_);
  return running_;
}

int AdmissionController::waiting() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(waiting_.size());
}

}  // namespace tandem::router
