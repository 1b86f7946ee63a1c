#include "comm/group/peer_communicator.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/check.h"

namespace tandem {

// One rank's view of the group.
class PeerCommunicator final : public Communicator {
 public:
  PeerCommunicator(std::shared_ptr<PeerCommGroup> group, int rank)
      : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  absl::Status AllReduceSum(void* data, int64_t count, DType dtype) override {
    if (dtype != DType::kF32 && dtype != DType::kBF16) {
      return absl::InvalidArgumentError(
          absl::StrCat("all-reduce of ", std::string(DTypeName(dtype)), ": F32 or BF16 only"));
    }
    if (count < 0) return absl::InvalidArgumentError("all-reduce of a negative count");
    return group_->Collective(
        rank_, PeerCommGroup::Post{PeerCommGroup::Op::kAllReduce, count, dtype, data, data},
        "all-reduce");
  }
  absl::Status AllGather(const void* send, void* recv, int64_t bytes) override {
    if (bytes < 0) return absl::InvalidArgumentError("all-gather of a negative size");
    return group_->Collective(
        rank_, PeerCommGroup::Post{PeerCommGroup::Op::kAllGather, bytes, DType::kU8, send, recv},
        "all-gather");
  }
  absl::Status Send(const void*, int64_t, int) override { return PointToPoint(); }
  absl::Status Recv(void*, int64_t, int) override { return PointToPoint(); }
  void Abort(const absl::Status& reason) override { group_->Abort(reason); }
  absl::Status status() const override { return group_->status(); }

 private:
  static absl::Status PointToPoint() {
    return absl::UnimplementedError(
        "send / recv between ranks of an in-process device group (pipeline stages on the CUDA "
        "backend) are not built yet");
  }

  std::shared_ptr<PeerCommGroup> group_;
  const int rank_;
};

namespace {}  // namespace

absl::StatusOr<std::shared_ptr<PeerCommGroup>> PeerCommGroup::Create(
    std::shared_ptr<PeerDeviceApi> api, std::vector<PeerRank> ranks, PeerCommOptions options) {
  if (api == nullptr) return absl::InvalidArgumentError("a peer group needs a PeerDeviceApi");
  if (ranks.empty() || ranks.size() > 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("a peer group of ", ranks.size(), " ranks (1 to 8)"));
  }
  if (options.clock == nullptr || options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("a communicator group needs a clock and a timeout > 0");
  }
  std::shared_ptr<PeerCommGroup> group(
      new PeerCommGroup(std::move(api), std::move(ranks), options));
  if (absl::Status s = group->Init(); !s.ok()) return s;
  return group;
}

PeerCommGroup::PeerCommGroup(std::shared_ptr<PeerDeviceApi> api, std::vector<PeerRank> ranks,
                             PeerCommOptions options)
    : api_(std::move(api)),
      options_(options),
      barrier_(static_cast<int>(ranks.size()), &mu_, &status_, options.clock, options.timeout) {
  for (const PeerRank& r : ranks) ranks_.push_back(RankState{r});
  absl::MutexLock lock(&mu_);
  fault_calls_.assign(ranks_.size(), -1);
  fault_status_.resize(ranks_.size());
}

PeerCommGroup::~PeerCommGroup() {
  for (RankState& r : ranks_) {
    if (r.ready != nullptr) api_->DestroyEvent(r.ready);
    if (r.done != nullptr) api_->DestroyEvent(r.done);
  }
}

absl::Status PeerCommGroup::Init() {
  std::vector<int> devices;
  for (const RankState& r : ranks_) {
    if (r.place.device < 0 || r.place.stream == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("a peer group's rank on device ", r.place.device, " without a stream"));
    }
    devices.push_back(r.place.device);
  }
  for (int device : std::set<int>(devices.begin(), devices.end())) {
    if (absl::Status s = api_->EnablePeers(device, devices); !s.ok()) return s;
  }
  for (RankState& r : ranks_) {
    absl::StatusOr<PeerDeviceApi::Event> ready = api_->CreateEvent(r.place.device);
    if (!ready.ok()) return ready.status();
    r.ready = *ready;
    absl::StatusOr<PeerDeviceApi::Event> done = api_->CreateEvent(r.place.device);
    if (!done.ok()) return done.status();
    r.done = *done;
  }
  return absl::OkStatus();
}

std::unique_ptr<Communicator> PeerCommGroup::ForRank(int rank) {
  CHECK(rank >= 0 && rank < size()) << "rank " << rank << " of a group of " << size();
  return std::make_unique<PeerCommunicator>(shared_from_this(), rank);
}

void PeerCommGroup::InjectFault(int rank, int64_t calls, absl::Status status) {
  CHECK(rank >= 0 && rank < size() && calls >= 0 && !status.ok());
  absl::MutexLock lock(&mu_);
  fault_calls_[rank] = calls;
  fault_status_[rank] = std::move(status);
}

void PeerCommGroup::Abort(const absl::Status& reason) {
  absl::MutexLock lock(&mu_);
  AbortLocked(reason);
}

void PeerCommGroup::AbortLocked(const absl::Status& reason) {
  if (status_.ok()) {
    status_ = reason.ok() ? absl::AbortedError("communicator aborted") : reason;
  }
}

absl::Status PeerCommGroup::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

absl::Status PeerCommGroup::Fail(int rank, const char* what, const absl::Status& error) {
  absl::MutexLock lock(&mu_);
  AbortLocked(absl::Status(error.code(), absl::StrCat("rank ", rank, " of ", size(), " in ", what,
                                                      ": ", error.message())));
  return status_;
}

absl::Status PeerCommGroup::Collective(int rank, const Post& post, const char* what) {
  RankState& me = ranks_[rank];
  {
    absl::MutexLock lock(&mu_);
    if (!status_.ok()) return status_;
    if (fault_calls_[rank] >= 0 && fault_calls_[rank]-- == 0) {
      const absl::Status& f = fault_status_[rank];
      AbortLocked(
          absl::Status(f.code(), absl::StrCat("rank ", rank, " in ", what, ": ", f.message())));
      return status_;
    }
  }
  if (absl::Status s = api_->Record(me.ready, me.place.stream); !s.ok()) {
    return Fail(rank, what, s);
  }
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Rendezvous(rank, post, what); !s.ok()) return s;
  const std::vector<Post> posts = barrier_.posts();  // stable until every rank has completed
  mu_.Unlock();
  const absl::Status shared = Share(rank, post, posts);
  mu_.Lock();
  if (!shared.ok()) {
    AbortLocked(absl::Status(shared.code(), absl::StrCat("rank ", rank, " of ", size(), " in ",
                                                         what, ": ", shared.message())));
  }
  Complete();
  if (!status_.ok()) return status_;
  mu_.Unlock();
  absl::Status waited;
  for (int q = 0; q < size() && waited.ok(); ++q) {
    if (q != rank) waited = api_->Wait(me.place.stream, ranks_[q].done);
  }
  mu_.Lock();
  if (!waited.ok()) {
    AbortLocked(absl::Status(waited.code(), absl::StrCat("rank ", rank, " of ", size(), " in ",
                                                         what, ": ", waited.message())));
    return status_;
  }
  return absl::OkStatus();
}

absl::Status PeerCommGroup::Share(int rank, const Post& post, const std::vector<Post>& posts) {
  const RankState& me = ranks_[rank];
  const int n = size();
  for (int q = 0; q < n; ++q) {
    if (q == rank) continue;
    if (absl::Status s = api_->Wait(me.place.stream, ranks_[q].ready); !s.ok()) return s;
  }
  if (post.op == Op::kAllReduce) {
    std::vector<void*> buffers;
    for (const Post& p : posts) buffers.push_back(p.recv);
    const int64_t begin = post.count * rank / n, end = post.count * (rank + 1) / n;
    if (end > begin) {
      if (absl::Status s = api_->ReduceSum(buffers, begin, end, post.dtype, me.place.stream);
          !s.ok()) {
        return s;
      }
    }
  } else if (post.count > 0) {
    for (int q = 0; q < n; ++q) {
      void* dst = static_cast<uint8_t*>(post.recv) + q * post.count;
      if (absl::Status s = api_->Copy(dst, posts[q].send, post.count, me.place.stream); !s.ok()) {
        return s;
      }
    }
  }
  return api_->Record(me.done, me.place.stream);
}

absl::Status PeerCommGroup::Rendezvous(int rank, const Post& post, const char* what) {
  // Aborted since the caller's check: the peers that were waiting have left (none will complete).
  if (!status_.ok()) return status_;
  if (absl::Status s = barrier_.Arrive(rank, post, what); !s.ok()) {
    AbortLocked(s);
    return status_;
  }
  return absl::OkStatus();
}

void PeerCommGroup::Complete() { barrier_.Leave(); }

}  // namespace tandem
