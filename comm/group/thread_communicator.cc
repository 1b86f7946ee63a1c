#include "comm/group/thread_communicator.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/check.h"

namespace tandem {

// One rank's view of the group.
class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadCommGroup> group, int rank)
      : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  absl::Status AllReduceSum(void* data, int64_t count, DType dtype) override {
    return group_->CollectiveAllReduce(rank_, data, count, dtype);
  }
  absl::Status AllGather(const void* send, void* recv, int64_t bytes) override {
    return group_->CollectiveAllGather(rank_, send, recv, bytes);
  }
  absl::Status Send(const void* data, int64_t bytes, int peer) override {
    return group_->SendTo(rank_, data, bytes, peer);
  }
  absl::Status Recv(void* data, int64_t bytes, int peer) override {
    return group_->RecvFrom(rank_, data, bytes, peer);
  }
  void Abort(const absl::Status& reason) override { group_->Abort(reason); }
  absl::Status status() const override { return group_->status(); }

 private:
  std::shared_ptr<ThreadCommGroup> group_;
  const int rank_;
};

namespace {

float Load(const void* base, int64_t i, DType dtype) {
  if (dtype == DType::kF32) return static_cast<const float*>(base)[i];
  return Bf16ToF32(static_cast<const uint16_t*>(base)[i]);
}

void Store(void* base, int64_t i, DType dtype, float v) {
  if (dtype == DType::kF32) {
    static_cast<float*>(base)[i] = v;
  } else {
    static_cast<uint16_t*>(base)[i] = F32ToBf16(v);
  }
}

}  // namespace

absl::StatusOr<std::shared_ptr<ThreadCommGroup>> ThreadCommGroup::Create(
    int size, ThreadCommOptions options) {
  if (size < 1) return absl::InvalidArgumentError(absl::StrCat("group size ", size, " < 1"));
  if (options.clock == nullptr || options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("a communicator group needs a clock and a timeout > 0");
  }
  return std::shared_ptr<ThreadCommGroup>(new ThreadCommGroup(size, options));
}

ThreadCommGroup::ThreadCommGroup(int size, ThreadCommOptions options)
    : size_(size),
      options_(options),
      failure_(size),
      barrier_(size, &mu_, &failure_.status(), options.clock, options.timeout) {
  absl::MutexLock lock(&mu_);
  mailboxes_.resize(static_cast<size_t>(size) * size);
}

std::unique_ptr<Communicator> ThreadCommGroup::ForRank(int rank) {
  CHECK(rank >= 0 && rank < size_) << "rank " << rank << " of a group of " << size_;
  return std::make_unique<ThreadCommunicator>(shared_from_this(), rank);
}

void ThreadCommGroup::InjectFault(int rank, int64_t calls, absl::Status status) {
  CHECK(rank >= 0 && rank < size_ && calls >= 0 && !status.ok());
  absl::MutexLock lock(&mu_);
  failure_.Inject(rank, calls, std::move(status));
}

void ThreadCommGroup::Abort(const absl::Status& reason) {
  absl::MutexLock lock(&mu_);
  AbortLocked(reason);
}

void ThreadCommGroup::AbortLocked(const absl::Status& reason) { failure_.Fail(reason); }

absl::Status ThreadCommGroup::status() const {
  absl::MutexLock lock(&mu_);
  return failure_.status();
}

absl::Status ThreadCommGroup::Enter(int rank, const char* what) {
  mu_.AssertHeld();
  return failure_.Enter(rank, what);
}

absl::Status ThreadCommGroup::Rendezvous(int rank, const Post& post, const char* what) {
  mu_.AssertHeld();
  if (absl::Status s = Enter(rank, what); !s.ok()) return s;
  if (absl::Status s = barrier_.Arrive(rank, post, what); !s.ok()) {
    AbortLocked(s);
    return failure_.status();
  }
  return absl::OkStatus();
}

void ThreadCommGroup::Complete() {
  mu_.AssertHeld();
  barrier_.Leave();
}

absl::Status ThreadCommGroup::CollectiveAllReduce(int rank, void* data, int64_t count,
                                                  DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("all-reduce of ", std::string(DTypeName(dtype)), ": F32 or BF16 only"));
  }
  if (count < 0) return absl::InvalidArgumentError("all-reduce of a negative count");
  absl::MutexLock lock(&mu_);
  if (absl::Status s =
          Rendezvous(rank, Post{Op::kAllReduce, count, dtype, data, data}, "all-reduce");
      !s.ok()) {
    return s;
  }
  std::vector<void*> buffers(size_);
  for (int r = 0; r < size_; ++r) buffers[r] = barrier_.posts()[r].recv;
  // This rank's share; the other ranks touch other elements, so the copy runs unlocked.
  const int64_t begin = count * rank / size_;
  const int64_t end = count * (rank + 1) / size_;
  mu_.Unlock();
  for (int64_t i = begin; i < end; ++i) {
    float sum = 0.0f;
    for (int r = 0; r < size_; ++r) sum += Load(buffers[r], i, dtype);
    for (int r = 0; r < size_; ++r) Store(buffers[r], i, dtype, sum);
  }
  mu_.Lock();
  Complete();
  return absl::OkStatus();
}

absl::Status ThreadCommGroup::CollectiveAllGather(int rank, const void* send, void* recv,
                                                  int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError("all-gather of a negative size");
  absl::MutexLock lock(&mu_);
  if (absl::Status s =
          Rendezvous(rank, Post{Op::kAllGather, bytes, DType::kF32, send, recv}, "all-gather");
      !s.ok()) {
    return s;
  }
  std::vector<const void*> sends(size_);
  for (int r = 0; r < size_; ++r) sends[r] = barrier_.posts()[r].send;
  mu_.Unlock();
  // Each rank fills its own recv buffer from everyone's send buffer (read only).
  for (int r = 0; r < size_; ++r) {
    if (bytes > 0) std::memcpy(static_cast<uint8_t*>(recv) + r * bytes, sends[r], bytes);
  }
  mu_.Lock();
  Complete();
  return absl::OkStatus();
}

absl::Status ThreadCommGroup::SendTo(int rank, const void* data, int64_t bytes, int peer) {
  if (peer < 0 || peer >= size_ || peer == rank || bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("send from rank ", rank, " to rank ", peer,
                                                   " of ", size_, ", ", bytes, " bytes"));
  }
  const uint8_t* p = static_cast<const uint8_t*>(data);
  std::vector<uint8_t> message(p, p + bytes);
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Enter(rank, "send"); !s.ok()) return s;
  mailboxes_[static_cast<size_t>(rank) * size_ + peer].push_back(std::move(message));
  return absl::OkStatus();
}

absl::Status ThreadCommGroup::RecvFrom(int rank, void* data, int64_t bytes, int peer) {
  if (peer < 0 || peer >= size_ || peer == rank || bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("recv on rank ", rank, " from rank ", peer,
                                                   " of ", size_, ", ", bytes, " bytes"));
  }
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Enter(rank, "recv"); !s.ok()) return s;
  std::deque<std::vector<uint8_t>>& box = mailboxes_[static_cast<size_t>(peer) * size_ + rank];
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !box.empty() || !failure_.status().ok();
  };
  if (!options_.clock->AwaitWithDeadline(&mu_, absl::Condition(&ready),
                                         options_.clock->Now() + options_.timeout)) {
    AbortLocked(absl::DeadlineExceededError(absl::StrCat("rank ", rank, " waited ",
                                                         absl::FormatDuration(options_.timeout),
                                                         " for a message from rank ", peer)));
  }
  if (!failure_.status().ok()) return failure_.status();
  std::vector<uint8_t> message = std::move(box.front());
  box.pop_front();
  if (static_cast<int64_t>(message.size()) != bytes) {
    AbortLocked(absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, " expected ", bytes, " bytes from rank ", peer, ", got ", message.size())));
    return failure_.status();
  }
  if (bytes > 0) std::memcpy(data, message.data(), bytes);
  return absl::OkStatus();
}

}  // namespace tandem
