#include "comm/group/collective_barrier.h"

#include "absl/strings/str_cat.h"

namespace tandem {

void GroupFailure::Fail(const absl::Status& reason) {
  if (status_.ok()) status_ = reason.ok() ? absl::AbortedError("communicator aborted") : reason;
}

void GroupFailure::Inject(int rank, int64_t calls, absl::Status status) {
  fault_calls_[rank] = calls;
  faults_[rank] = std::move(status);
}

absl::Status GroupFailure::Enter(int rank, const char* what) {
  if (status_.ok() && fault_calls_[rank] >= 0 && fault_calls_[rank]-- == 0) {
    const absl::Status& f = faults_[rank];
    Fail(absl::Status(f.code(), absl::StrCat("rank ", rank, " in ", what, ": ", f.message())));
  }
  return status_;
}

const char* CollectiveOpName(CollectiveOp op) {
  return op == CollectiveOp::kAllReduce ? "all-reduce" : "all-gather";
}

CollectiveBarrier::CollectiveBarrier(int size, absl::Mutex* mu, const absl::Status* group_status,
                                     Clock* clock, absl::Duration timeout)
    : size_(size),
      mu_(mu),
      group_status_(group_status),
      clock_(clock),
      timeout_(timeout),
      posts_(size) {}

absl::Status CollectiveBarrier::Arrive(int rank, const CollectivePost& post, const char* what) {
  mu_->AssertHeld();
  posts_[rank] = post;
  const uint64_t generation = generation_;
  if (++arrived_ == size_) {
    // A mismatch is a caller bug that would otherwise read past a buffer.
    for (int r = 0; r < size_; ++r) {
      const CollectivePost& p = posts_[r];
      if (p.op != post.op || p.count != post.count || p.dtype != post.dtype) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": rank ", r, " called ", CollectiveOpName(p.op), " of ", p.count, " while rank ",
            rank, " called ", CollectiveOpName(post.op), " of ", post.count));
      }
    }
    arrived_ = 0;
    ++generation_;
    return absl::OkStatus();
  }
  // Whether the rendezvous completed is decided by the generation alone, so every rank agrees:
  // either all go on to their share, or none does.
  auto passed = [&]() { return generation_ != generation || !group_status_->ok(); };
  const bool woke =
      clock_->AwaitWithDeadline(mu_, absl::Condition(&passed), clock_->Now() + timeout_);
  if (generation_ != generation) return absl::OkStatus();
  if (!woke) {
    return absl::DeadlineExceededError(
        absl::StrCat("rank ", rank, " waited ", absl::FormatDuration(timeout_), " in ", what,
                     " for its peers (", size_ - arrived_, " of ", size_, " missing)"));
  }
  return *group_status_;
}

void CollectiveBarrier::Leave() {
  mu_->AssertHeld();
  const uint64_t generation = leave_generation_;
  if (++left_ == size_) {
    left_ = 0;
    ++leave_generation_;
    return;
  }
  auto done = [&]() { return leave_generation_ != generation; };
  mu_->Await(absl::Condition(&done));
}

}  // namespace tandem
