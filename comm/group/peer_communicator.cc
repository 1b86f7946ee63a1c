#include "comm/group/peer_communicator.h"

#include <algorithm>
#include <atomic>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "base/status_macros.h"

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
  absl::Status Send(const void* data, int64_t bytes, int peer) override {
    return group_->SendTo(rank_, data, bytes, peer);
  }
  absl::Status Recv(void* data, int64_t bytes, int peer) override {
    return group_->RecvFrom(rank_, data, bytes, peer);
  }
  bool SupportsGraphCapture() const override { return true; }
  // AllReduceSum only enqueues (the file comment of the header).
  absl::Status EnqueueAllReduceSum(void* data, int64_t count, DType dtype) override {
    return AllReduceSum(data, count, dtype);
  }
  absl::Status BeginGraphReplay(int64_t collectives) override {
    return group_->EnterGraph(rank_, collectives);
  }
  absl::Status EndGraphReplay() override { return group_->status(); }
  void Abort(const absl::Status& reason) override { group_->Abort(reason); }
  absl::Status status() const override { return group_->status(); }

 private:
  std::shared_ptr<PeerCommGroup> group_;
  const int rank_;
};

namespace {

// A staging slot's size for a message of `bytes`: a power of two of at least 4 KiB, so a pair
// whose messages grow (longer prefill chunks) regrows its slots a few times only.
int64_t SlotCapacity(int64_t bytes) {
  int64_t capacity = 4096;
  while (capacity < bytes) capacity *= 2;
  return capacity;
}

absl::Status CheckPeer(const char* what, int rank, int size, int peer, int64_t bytes) {
  if (peer < 0 || peer >= size || peer == rank || bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " between rank ", rank, " and rank ", peer,
                                                   " of ", size, ", ", bytes, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

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
      failure_(static_cast<int>(ranks.size())),
      barrier_(static_cast<int>(ranks.size()), &mu_, &failure_.status(), options.clock,
               options.timeout) {
  for (const PeerRank& r : ranks) {
    RankState state;
    state.place = r;
    ranks_.push_back(std::move(state));
  }
  absl::MutexLock lock(&mu_);
  pairs_ = std::vector<Pair>(ranks_.size() * ranks_.size());  // Pair is not copyable
}

PeerCommGroup::~PeerCommGroup() {
  for (RankState& r : ranks_) {
    if (r.barrier_words != nullptr) api_->Free(r.place.device, r.barrier_words);
  }
  if (host_words_ != nullptr) api_->FreeHostMapped(host_words_);
  absl::MutexLock lock(&mu_);
  for (size_t p = 0; p < pairs_.size(); ++p) {
    for (const std::unique_ptr<Slot>& slot : pairs_[p].slots) {
      const int device = ranks_[p / ranks_.size()].place.device;
      if (slot->buffer != nullptr) api_->Free(device, slot->buffer);
      for (void* old : slot->retired) api_->Free(device, old);
      if (slot->sent != nullptr) api_->DestroyEvent(slot->sent);
      if (slot->received != nullptr) api_->DestroyEvent(slot->received);
    }
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
  const int n = size();
  ASSIGN_OR_RETURN(void* host, api_->AllocateHostMapped((1 + n) * int64_t{sizeof(int32_t)}));
  host_words_ = static_cast<int32_t*>(host);
  for (RankState& r : ranks_) {
    ASSIGN_OR_RETURN(void* words, api_->AllocateZeroed(r.place.device,
                                                       kBarrierWords * int64_t{sizeof(uint32_t)}));
    r.barrier_words = static_cast<uint32_t*>(words);
  }
  for (int r = 0; r < n; ++r) {
    PeerDeviceApi::BarrierArgs& b = ranks_[r].barrier;
    b.epoch = ranks_[r].barrier_words;
    for (const RankState& q : ranks_) b.slots.push_back(q.barrier_words + 1);
    b.rank = r;
    b.abort = host_words_;
    b.error = host_words_ + 1 + r;
    b.timeout = options_.timeout;
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
  failure_.Inject(rank, calls, std::move(status));
}

void PeerCommGroup::Abort(const absl::Status& reason) {
  absl::MutexLock lock(&mu_);
  AbortLocked(reason);
}

void PeerCommGroup::AbortLocked(const absl::Status& reason) {
  failure_.Fail(reason);
  // Every barrier enqueued on any device stops waiting (peer_barrier.h).
  if (host_words_ != nullptr) {
    std::atomic_ref<int32_t>(host_words_[0]).store(1, std::memory_order_release);
  }
}

absl::Status PeerCommGroup::DeviceStatus() const {
  // A barrier that timed out sets the abort word, so its peers' report Aborted: the timeout is
  // the cause.
  absl::Status aborted;
  if (host_words_ == nullptr) return aborted;  // Init failed before its barrier memory
  for (int r = 0; r < size(); ++r) {
    const int32_t why =
        std::atomic_ref<int32_t>(host_words_[1 + r]).load(std::memory_order_acquire);
    if (why == PeerDeviceApi::kBarrierTimedOut) {
      return absl::DeadlineExceededError(absl::StrCat(
          "rank ", r, " of ", size(), "'s device barrier waited ",
          absl::FormatDuration(options_.timeout), " for its peers (one never launched its part)"));
    }
    if (why != 0 && aborted.ok()) {
      aborted = absl::AbortedError(
          absl::StrCat("rank ", r, " of ", size(), "'s device barrier saw the group's abort word"));
    }
  }
  return aborted;
}

absl::Status PeerCommGroup::CheckedStatusLocked() {
  if (failure_.status().ok()) {
    if (absl::Status device = DeviceStatus(); !device.ok()) AbortLocked(device);
  }
  return failure_.status();
}

absl::Status PeerCommGroup::status() const {
  absl::MutexLock lock(&mu_);
  if (!failure_.status().ok()) return failure_.status();
  return DeviceStatus();
}

absl::Status PeerCommGroup::EnterLocked(int rank, const char* what) {
  RETURN_IF_ERROR(CheckedStatusLocked());
  return failure_.Enter(rank, what);
}

absl::Status PeerCommGroup::EnterGraph(int rank, int64_t collectives) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckedStatusLocked());
  for (int64_t i = 0; i < collectives; ++i) {
    RETURN_IF_ERROR(failure_.Enter(rank, "a collective of a CUDA graph"));
  }
  return absl::OkStatus();
}

absl::Status PeerCommGroup::Fail(int rank, const char* what, const absl::Status& error) {
  absl::MutexLock lock(&mu_);
  AbortLocked(absl::Status(error.code(), absl::StrCat("rank ", rank, " of ", size(), " in ", what,
                                                      ": ", error.message())));
  return failure_.status();
}

absl::Status PeerCommGroup::Collective(int rank, const Post& post, const char* what) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(EnterLocked(rank, what));
  RETURN_IF_ERROR(Rendezvous(rank, post, what));
  const std::vector<Post> posts = barrier_.posts();  // stable until every rank has completed
  mu_.Unlock();
  const absl::Status shared = Share(rank, post, posts);
  mu_.Lock();
  if (!shared.ok()) {
    AbortLocked(absl::Status(shared.code(), absl::StrCat("rank ", rank, " of ", size(), " in ",
                                                         what, ": ", shared.message())));
  }
  Complete();
  return CheckedStatusLocked();
}

absl::Status PeerCommGroup::Share(int rank, const Post& post, const std::vector<Post>& posts) {
  const RankState& me = ranks_[rank];
  const int n = size();
  RETURN_IF_ERROR(api_->Barrier(me.barrier, me.place.stream));  // every buffer written
  if (post.op == Op::kAllReduce) {
    std::vector<void*> buffers;
    for (const Post& p : posts) buffers.push_back(p.recv);
    const int64_t begin = post.count * rank / n, end = post.count * (rank + 1) / n;
    if (end > begin) {
      RETURN_IF_ERROR(api_->ReduceSum(buffers, begin, end, post.dtype, me.place.stream));
    }
  } else if (post.count > 0) {
    for (int q = 0; q < n; ++q) {
      void* dst = static_cast<uint8_t*>(post.recv) + q * post.count;
      RETURN_IF_ERROR(api_->Copy(dst, posts[q].send, post.count, me.place.stream));
    }
  }
  return api_->Barrier(me.barrier, me.place.stream);  // every peer done with this rank's buffer
}

absl::Status PeerCommGroup::Rendezvous(int rank, const Post& post, const char* what) {
  // Aborted since the caller's check: the peers that were waiting have left (none will complete).
  if (!failure_.status().ok()) return failure_.status();
  if (absl::Status s = barrier_.Arrive(rank, post, what); !s.ok()) {
    AbortLocked(s);
    return failure_.status();
  }
  return absl::OkStatus();
}

void PeerCommGroup::Complete() { barrier_.Leave(); }

absl::Status PeerCommGroup::SendTo(int rank, const void* data, int64_t bytes, int peer) {
  RETURN_IF_ERROR(CheckPeer("send", rank, size(), peer, bytes));
  int index = 0;
  Slot* slot = nullptr;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(EnterLocked(rank, "send"));
    Pair& pair = PairOf(rank, peer);
    // A free slot large enough, else any free one (regrown), else a new one.
    auto it = std::find_if(pair.free.begin(), pair.free.end(),
                           [&](int i) { return pair.slots[i]->capacity >= bytes; });
    if (it == pair.free.end() && !pair.free.empty()) it = pair.free.begin();
    if (it != pair.free.end()) {
      index = *it;
      pair.free.erase(it);
    } else {
      index = static_cast<int>(pair.slots.size());
      pair.slots.push_back(std::make_unique<Slot>());
    }
    slot = pair.slots[index].get();
  }
  // The slot is this thread's until it is queued.
  PeerDeviceApi::Stream stream = ranks_[rank].place.stream;
  absl::Status s = PrepareSlot(rank, peer, *slot, bytes);
  if (s.ok() && slot->used) s = api_->Wait(stream, slot->received);
  if (s.ok() && bytes > 0) s = api_->Copy(slot->buffer, data, bytes, stream);
  if (s.ok()) s = api_->Record(slot->sent, stream);
  if (!s.ok()) return Fail(rank, "send", s);
  absl::MutexLock lock(&mu_);
  if (!failure_.status().ok()) return failure_.status();
  PairOf(rank, peer).queue.push_back(Message{index, bytes});
  return absl::OkStatus();
}

absl::Status PeerCommGroup::PrepareSlot(int src, int dst, Slot& slot, int64_t bytes) {
  const int device = ranks_[src].place.device;
  if (slot.sent == nullptr) {
    ASSIGN_OR_RETURN(slot.sent, api_->CreateEvent(device));
  }
  if (slot.received == nullptr) {
    ASSIGN_OR_RETURN(slot.received, api_->CreateEvent(ranks_[dst].place.device));
  }
  if (slot.capacity >= bytes) return absl::OkStatus();
  const int64_t capacity = SlotCapacity(bytes);
  ASSIGN_OR_RETURN(void* buffer, api_->Allocate(device, capacity));
  // The old buffer's last receiver may still be copying out of it, and freeing device memory
  // may wait for the whole device (behind a peer's collective that waits for this thread): it is
  // kept until the group's end instead (powers of two: less than the slot's new size in all).
  if (slot.buffer != nullptr) slot.retired.push_back(slot.buffer);
  slot.buffer = buffer;
  slot.capacity = capacity;
  return absl::OkStatus();
}

absl::Status PeerCommGroup::RecvFrom(int rank, void* data, int64_t bytes, int peer) {
  RETURN_IF_ERROR(CheckPeer("recv", rank, size(), peer, bytes));
  Message message;
  Slot* slot = nullptr;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(EnterLocked(rank, "recv"));
    Pair& pair = PairOf(peer, rank);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !pair.queue.empty() || !failure_.status().ok();
    };
    if (!options_.clock->AwaitWithDeadline(&mu_, absl::Condition(&ready),
                                           options_.clock->Now() + options_.timeout)) {
      AbortLocked(absl::DeadlineExceededError(absl::StrCat("rank ", rank, " waited ",
                                                           absl::FormatDuration(options_.timeout),
                                                           " for a message from rank ", peer)));
    }
    if (!failure_.status().ok()) return failure_.status();
    message = pair.queue.front();
    pair.queue.pop_front();
    if (message.bytes != bytes) {
      AbortLocked(absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank, " expected ", bytes, " bytes from rank ", peer, ", got ", message.bytes)));
      return failure_.status();
    }
    slot = pair.slots[message.slot].get();
  }
  // The slot is this thread's until it is handed back.
  PeerDeviceApi::Stream stream = ranks_[rank].place.stream;
  absl::Status s = api_->Wait(stream, slot->sent);
  if (s.ok() && bytes > 0) s = api_->Copy(data, slot->buffer, bytes, stream);
  if (s.ok()) s = api_->Record(slot->received, stream);
  if (!s.ok()) return Fail(rank, "recv", s);
  absl::MutexLock lock(&mu_);
  slot->used = true;
  PairOf(peer, rank).free.push_back(message.slot);
  return absl::OkStatus();
}

}  // namespace tandem
