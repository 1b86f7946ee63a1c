// An in-process fake of NCCL (comm/nccl_api.h) for the CPU tests of the NCCL KV transport and of
// the group communicator (comm/group/nccl_communicator.h): each FakeNccl is one "process" (one
// GPU, named by its device id, or `num_devices` GPUs from `device` on), and the ranks of a
// communicator are threads of the test that share one FakeNcclWorld. "Device memory" is host
// memory: a matched send and receive memcpy the bytes, a collective reads every rank's buffer
// and writes every rank's result, so a transfer moves real bytes without a GPU.
//
// Like non-blocking NCCL, nothing here waits: an init is in progress until every rank has
// joined, a send completes once the peer's matching receive (FIFO per pair of ranks, equal
// sizes) was enqueued, a collective once every rank enqueued its own (FIFO per communicator;
// ranks that enqueue different collectives fail the communicator), and each only once its
// stream events (StreamWaitEvent on a FakeEvent) fired. The work is done by whichever call finds
// it possible (every call makes progress), so the callers' own polls drive it. Sums as NCCL
// computes them: in rank order, each addition rounded to the element type (a bf16 sum rounds
// after every add). Injectable faults, per process: an init that fails (at once or later, as an
// async error) or never completes (hang_inits), an async error after a number of completed
// operations (mid-transfer), a hang (no operation of this process completes, until CommAbort),
// and death (Kill: the process's communicators stop; its peers' operations hang, as a
// survivor's do when a peer is killed).
#pragma once

#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "comm/nccl_api.h"
#include "kernels/common/dtype.h"

namespace tandem {

// A device event of the fake (KvPushListener's per-layer event): "completes" when fired.
struct FakeEvent {
  absl::Notification fired;
};

class FakeNccl;

class FakeNcclWorld {
 public:
  struct Stream {
    int pending = 0;             // operations enqueued and not completed (or aborted)
    FakeEvent* after = nullptr;  // the last StreamWaitEvent: later operations wait for it
    bool destroyed = false;
  };
  enum class Kind { kSend, kRecv, kAllReduce, kAllGather };
  struct Op {
    Kind kind = Kind::kSend;
    int peer = 0;               // send / recv
    const char* src = nullptr;  // send, all-reduce, all-gather
    char* buf = nullptr;        // recv, all-reduce, all-gather
    int64_t bytes = 0;          // send / recv / all-gather (per rank)
    int64_t count = 0;          // all-reduce elements
    NcclApi::ReduceType type = NcclApi::ReduceType::kF32;
    Stream* stream = nullptr;
    FakeEvent* after = nullptr;
  };
  enum class State { kInit, kReady, kFailed, kAborted };
  struct Comm {
    FakeNccl* owner = nullptr;
    std::string id;
    int rank = 0;
    int nranks = 0;
    int device = 0;
    State state = State::kInit;
    absl::Status error;
    bool fail_when_joined = false;  // an async init failure
    bool hang_when_joined = false;  // an init that never completes
    // [rank] once every rank joined (this one too); a peer's entry is null once it ended.
    std::vector<Comm*> peers;
    std::deque<Op> sends;  // enqueued, not completed, in order
    std::deque<Op> recvs;
    std::deque<Op> collectives;
  };

  absl::Mutex mu;
  int next_id ABSL_GUARDED_BY(mu) = 0;
  std::map<std::string, std::vector<Comm*>> rendezvous ABSL_GUARDED_BY(mu);
  std::vector<std::unique_ptr<Comm>> comms ABSL_GUARDED_BY(mu);
  std::vector<std::unique_ptr<Stream>> streams ABSL_GUARDED_BY(mu);

  // Completes every operation that can complete now.
  void Progress() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

 private:
  // Whether `c` and every peer of it can move (joined, ready, alive and not hung).
  static bool Live(const Comm* c);
  bool ProgressPointToPoint(Comm* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  bool ProgressCollective(Comm* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  static void Fail(const std::vector<Comm*>& comms, const char* why);
};

class FakeNccl : public NcclApi {
 public:
  // A process with GPUs [device, device + num_devices), all named `device_id`.
  FakeNccl(FakeNcclWorld* world, std::string device_id, int device = 0, int num_devices = 1)
      : world_(world),
        device_id_(std::move(device_id)),
        device_(device),
        num_devices_(num_devices) {}

  // --- faults ---
  std::atomic<int> fail_next_inits{0};        // CommInitRank returns an error at once
  std::atomic<int> fail_next_inits_async{0};  // the init later fails (CommReady's error)
  std::atomic<int> fail_after_ops{-1};        // >= 0: after that many more completed
                                              // operations, every comm of this process fails
  std::atomic<bool> hang{false};              // no operation of this process completes
  std::atomic<bool> hang_inits{false};        // inits of this process never complete
  void Kill() {
    absl::MutexLock l(&world_->mu);
    dead_ = true;
  }

  // --- counters ---
  std::atomic<int> inits{0}, aborts{0}, destroys{0}, sends{0}, recvs{0}, groups{0};
  std::atomic<int> all_reduces{0}, all_gathers{0};  // enqueued (or refused)
  std::atomic<int> streams_created{0}, streams_destroyed{0};

  bool dead() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(world_->mu) { return dead_; }
  bool hung() const { return hang.load(); }

  absl::StatusOr<int> DeviceOf(const void* ptr) override {
    if (ptr == nullptr) return absl::FailedPreconditionError("fake: not device memory");
    return device_;
  }
  absl::StatusOr<std::string> DeviceId(int device) override { return device_id_; }

  absl::StatusOr<std::string> GetUniqueId() override {
    absl::MutexLock l(&world_->mu);
    std::string id = absl::StrCat("fake-nccl-id-", world_->next_id++);
    world_->rendezvous[id];
    return id;
  }

  absl::StatusOr<Comm> CommInitRank(const std::string& unique_id, int nranks, int rank,
                                    int device) override {
    ++inits;
    if (fail_next_inits.load() > 0) {
      --fail_next_inits;
      return absl::InternalError("fake: ncclCommInitRankConfig failed (injected)");
    }
    if (nranks < 1 || rank < 0 || rank >= nranks || device < device_ ||
        device >= device_ + num_devices_) {
      return absl::InvalidArgumentError("fake: bad init arguments");
    }
    absl::MutexLock l(&world_->mu);
    auto it = world_->rendezvous.find(unique_id);
    if (it == world_->rendezvous.end()) return absl::InvalidArgumentError("fake: unknown id");
    std::vector<FakeNcclWorld::Comm*>& ranks = it->second;
    for (FakeNcclWorld::Comm* r : ranks) {
      if (r->rank == rank || r->nranks != nranks) {
        return absl::InvalidArgumentError("fake: rank joined twice, or sizes differ");
      }
    }
    auto c = std::make_unique<FakeNcclWorld::Comm>();
    c->owner = this;
    c->id = unique_id;
    c->rank = rank;
    c->nranks = nranks;
    c->device = device;
    if (fail_next_inits_async.load() > 0) {
      --fail_next_inits_async;
      c->fail_when_joined = true;
    }
    c->hang_when_joined = hang_inits.load();
    FakeNcclWorld::Comm* raw = c.get();
    world_->comms.push_back(std::move(c));
    ranks.push_back(raw);
    if (static_cast<int>(ranks.size()) == nranks) {
      std::vector<FakeNcclWorld::Comm*> by_rank(nranks);
      for (FakeNcclWorld::Comm* r : ranks) by_rank[r->rank] = r;
      for (FakeNcclWorld::Comm* r : ranks) {
        r->peers = by_rank;
        if (r->state != FakeNcclWorld::State::kInit || r->hang_when_joined) continue;
        if (r->fail_when_joined) {
          r->state = FakeNcclWorld::State::kFailed;
          r->error = absl::InternalError("fake: init failed (injected async error)");
        } else {
          r->state = FakeNcclWorld::State::kReady;
        }
      }
    }
    return static_cast<Comm>(raw);
  }

  absl::StatusOr<bool> CommReady(Comm comm) override {
    absl::MutexLock l(&world_->mu);
    world_->Progress();
    auto* c = static_cast<FakeNcclWorld::Comm*>(comm);
    switch (c->state) {
      case FakeNcclWorld::State::kInit:
        return false;
      case FakeNcclWorld::State::kReady:
        return true;
      case FakeNcclWorld::State::kFailed:
        return c->error;
      case FakeNcclWorld::State::kAborted:
        return absl::FailedPreconditionError("fake: comm used after abort");
    }
    return absl::InternalError("fake: bad state");
  }

  absl::Status GroupStart() override {
    ++groups;
    Group().depth++;
    return absl::OkStatus();
  }
  absl::Status GroupEnd() override {
    ThreadGroup& g = Group();
    if (g.depth == 0) return absl::InvalidArgumentError("fake: GroupEnd without GroupStart");
    if (--g.depth > 0) return absl::OkStatus();
    absl::MutexLock l(&world_->mu);
    absl::Status st;
    for (auto& [comm, op] : g.ops) st.Update(EnqueueLocked(comm, op));
    // A stream's event wait orders the group after it (later operations are behind these in
    // their FIFO anyway), and no event is looked at once its group is enqueued.
    for (auto& [comm, op] : g.ops) op.stream->after = nullptr;
    g.ops.clear();
    world_->Progress();
    return st;
  }
  absl::Status Send(const void* buf, int64_t bytes, int peer, Comm comm, Stream stream) override {
    ++sends;
    FakeNcclWorld::Op op;
    op.kind = FakeNcclWorld::Kind::kSend;
    op.peer = peer;
    op.src = static_cast<const char*>(buf);
    op.bytes = bytes;
    return Post(op, comm, stream);
  }
  absl::Status Recv(void* buf, int64_t bytes, int peer, Comm comm, Stream stream) override {
    ++recvs;
    FakeNcclWorld::Op op;
    op.kind = FakeNcclWorld::Kind::kRecv;
    op.peer = peer;
    op.buf = static_cast<char*>(buf);
    op.bytes = bytes;
    return Post(op, comm, stream);
  }
  absl::Status AllReduceSum(const void* send, void* recv, int64_t count, ReduceType type, Comm comm,
                            Stream stream) override {
    ++all_reduces;
    FakeNcclWorld::Op op;
    op.kind = FakeNcclWorld::Kind::kAllReduce;
    op.src = static_cast<const char*>(send);
    op.buf = static_cast<char*>(recv);
    op.count = count;
    op.type = type;
    return Post(op, comm, stream);
  }
  absl::Status AllGather(const void* send, void* recv, int64_t bytes, Comm comm,
                         Stream stream) override {
    ++all_gathers;
    FakeNcclWorld::Op op;
    op.kind = FakeNcclWorld::Kind::kAllGather;
    op.src = static_cast<const char*>(send);
    op.buf = static_cast<char*>(recv);
    op.bytes = bytes;
    return Post(op, comm, stream);
  }

  void CommAbort(Comm comm) override {
    ++aborts;
    End(comm);
  }
  absl::Status CommDestroy(Comm comm) override {
    ++destroys;
    End(comm);
    return absl::OkStatus();
  }

  absl::StatusOr<Stream> CreateStream(int device) override {
    ++streams_created;
    absl::MutexLock l(&world_->mu);
    world_->streams.push_back(std::make_unique<FakeNcclWorld::Stream>());
    return static_cast<Stream>(world_->streams.back().get());
  }
  void DestroyStream(Stream stream) override {
    ++streams_destroyed;
    absl::MutexLock l(&world_->mu);
    static_cast<FakeNcclWorld::Stream*>(stream)->destroyed = true;
  }
  absl::Status StreamWaitEvent(Stream stream, void* event) override {
    absl::MutexLock l(&world_->mu);
    static_cast<FakeNcclWorld::Stream*>(stream)->after = static_cast<FakeEvent*>(event);
    return absl::OkStatus();
  }
  absl::StatusOr<bool> StreamDone(Stream stream) override {
    absl::MutexLock l(&world_->mu);
    world_->Progress();
    return static_cast<FakeNcclWorld::Stream*>(stream)->pending == 0;
  }

  // Called by the world when one of this process's operations completed.
  void CountCompletion(FakeNcclWorld::Comm* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(world_->mu) {
    int left = fail_after_ops.load();
    if (left < 0) return;
    if (left > 0) {
      fail_after_ops.store(left - 1);
      if (left - 1 > 0) return;
    }
    fail_after_ops.store(-1);
    for (auto& comm : world_->comms) {
      if (comm->owner == this && comm->state == FakeNcclWorld::State::kReady) {
        comm->state = FakeNcclWorld::State::kFailed;
        comm->error = absl::InternalError("fake: remote process exited or network error");
      }
    }
  }

 private:
  struct ThreadGroup {
    int depth = 0;
    std::vector<std::pair<FakeNcclWorld::Comm*, FakeNcclWorld::Op>> ops;
  };
  static ThreadGroup& Group() {
    thread_local ThreadGroup g;
    return g;
  }

  absl::Status Post(FakeNcclWorld::Op op, Comm comm, Stream stream) {
    auto* c = static_cast<FakeNcclWorld::Comm*>(comm);
    using Kind = FakeNcclWorld::Kind;
    const bool p2p = op.kind == Kind::kSend || op.kind == Kind::kRecv;
    if (p2p && (op.peer < 0 || op.peer >= c->nranks || op.peer == c->rank)) {
      return absl::InvalidArgumentError("fake: bad peer");
    }
    if (op.bytes < 0 || op.count < 0) return absl::InvalidArgumentError("fake: negative size");
    op.stream = static_cast<FakeNcclWorld::Stream*>(stream);
    if (Group().depth > 0) {
      Group().ops.emplace_back(c, op);
      return absl::OkStatus();
    }
    absl::MutexLock l(&world_->mu);
    absl::Status st = EnqueueLocked(c, op);
    op.stream->after = nullptr;
    world_->Progress();
    return st;
  }

  absl::Status EnqueueLocked(FakeNcclWorld::Comm* c, FakeNcclWorld::Op op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(world_->mu) {
    if (c->state == FakeNcclWorld::State::kFailed) return c->error;
    if (c->state != FakeNcclWorld::State::kReady) {
      return absl::FailedPreconditionError("fake: operation on a comm that is not ready");
    }
    op.after = op.stream->after;
    op.stream->pending++;
    switch (op.kind) {
      case FakeNcclWorld::Kind::kSend:
        c->sends.push_back(op);
        break;
      case FakeNcclWorld::Kind::kRecv:
        c->recvs.push_back(op);
        break;
      default:
        c->collectives.push_back(op);
        break;
    }
    return absl::OkStatus();
  }

  void End(Comm comm) {
    absl::MutexLock l(&world_->mu);
    auto* c = static_cast<FakeNcclWorld::Comm*>(comm);
    c->state = FakeNcclWorld::State::kAborted;
    // Its operations end (the kernels are killed): nothing of them moves any more.
    for (auto* q : {&c->sends, &c->recvs, &c->collectives}) {
      for (FakeNcclWorld::Op& op : *q) op.stream->pending--;
      q->clear();
    }
    // The survivors' operations with it hang.
    for (FakeNcclWorld::Comm* p : c->peers) {
      if (p != nullptr && p != c) p->peers[c->rank] = nullptr;
    }
    c->peers.clear();
  }

  FakeNcclWorld* const world_;
  const std::string device_id_;
  const int device_;
  const int num_devices_;
  bool dead_ ABSL_GUARDED_BY(world_->mu) = false;
};

inline bool FakeNcclWorld::Live(const Comm* c) {
  if (c->state != State::kReady || static_cast<int>(c->peers.size()) != c->nranks) return false;
  for (const Comm* p : c->peers) {
    if (p == nullptr || p->state != State::kReady || p->owner->dead() || p->owner->hung()) {
      return false;
    }
  }
  return true;
}

inline void FakeNcclWorld::Fail(const std::vector<Comm*>& comms, const char* why) {
  for (Comm* c : comms) {
    c->state = State::kFailed;
    c->error = absl::InternalError(why);
  }
}

inline bool FakeNcclWorld::ProgressPointToPoint(Comm* s) {
  // The oldest send of `s` to each peer, against that peer's oldest receive from `s`.
  std::vector<bool> seen(s->nranks, false);
  for (auto send = s->sends.begin(); send != s->sends.end(); ++send) {
    if (seen[send->peer]) continue;
    seen[send->peer] = true;
    Comm* r = s->peers[send->peer];
    if (r == nullptr || r->state != State::kReady || r->owner->dead() || r->owner->hung()) {
      continue;
    }
    auto recv = r->recvs.begin();
    while (recv != r->recvs.end() && recv->peer != s->rank) ++recv;
    if (recv == r->recvs.end()) continue;
    if ((send->after != nullptr && !send->after->fired.HasBeenNotified()) ||
        (recv->after != nullptr && !recv->after->fired.HasBeenNotified())) {
      continue;
    }
    if (send->bytes != recv->bytes) {
      Fail({s, r}, "fake: send and receive sizes differ");
      return true;
    }
    std::memcpy(recv->buf, send->src, static_cast<size_t>(send->bytes));
    send->stream->pending--;
    recv->stream->pending--;
    s->sends.erase(send);
    r->recvs.erase(recv);
    s->owner->CountCompletion(s);
    r->owner->CountCompletion(r);
    return true;  // the iterators are gone: the caller looks again
  }
  return false;
}

inline bool FakeNcclWorld::ProgressCollective(Comm* c) {
  // Rank 0 drives its communicator's collectives, once every rank enqueued the next one.
  if (c->rank != 0 || c->collectives.empty() || !Live(c)) return false;
  const int n = c->nranks;
  std::vector<Op*> ops(n);
  for (int r = 0; r < n; ++r) {
    Comm* p = c->peers[r];
    if (p->collectives.empty()) return false;
    ops[r] = &p->collectives.front();
    if (ops[r]->after != nullptr && !ops[r]->after->fired.HasBeenNotified()) return false;
  }
  for (int r = 1; r < n; ++r) {
    if (ops[r]->kind != ops[0]->kind || ops[r]->count != ops[0]->count ||
        ops[r]->bytes != ops[0]->bytes || ops[r]->type != ops[0]->type) {
      Fail(c->peers, "fake: the ranks enqueued different collectives");
      return true;
    }
  }
  // Every input is read before any output is written: buffers may alias (in place).
  if (ops[0]->kind == Kind::kAllReduce) {
    const int64_t count = ops[0]->count;
    const bool bf16 = ops[0]->type == NcclApi::ReduceType::kBF16;
    std::vector<float> sum(count, 0.0f);
    for (int r = 0; r < n; ++r) {
      for (int64_t i = 0; i < count; ++i) {
        float v;
        if (bf16) {
          uint16_t bits;
          std::memcpy(&bits, ops[r]->src + 2 * i, 2);
          v = Bf16ToF32(bits);
        } else {
          std::memcpy(&v, ops[r]->src + 4 * i, 4);
        }
        // NCCL's arithmetic: an add of the element type, so bf16 rounds after every add.
        sum[i] = r == 0 ? v : (bf16 ? RoundToBf16(sum[i] + v) : sum[i] + v);
      }
    }
    for (int r = 0; r < n; ++r) {
      for (int64_t i = 0; i < count; ++i) {
        if (bf16) {
          const uint16_t bits = F32ToBf16(sum[i]);
          std::memcpy(ops[r]->buf + 2 * i, &bits, 2);
        } else {
          std::memcpy(ops[r]->buf + 4 * i, &sum[i], 4);
        }
      }
    }
  } else {
    const int64_t bytes = ops[0]->bytes;
    std::vector<char> gathered(static_cast<size_t>(bytes) * n);
    for (int r = 0; r < n; ++r) {
      if (bytes > 0) std::memcpy(gathered.data() + r * bytes, ops[r]->src, bytes);
    }
    for (int r = 0; r < n; ++r) {
      if (bytes > 0) std::memcpy(ops[r]->buf, gathered.data(), gathered.size());
    }
  }
  for (int r = 0; r < n; ++r) {
    Comm* p = c->peers[r];
    p->collectives.front().stream->pending--;
    p->collectives.pop_front();
    p->owner->CountCompletion(p);
  }
  return true;
}

inline void FakeNcclWorld::Progress() {
  bool moved = true;
  while (moved) {
    moved = false;
    for (auto& owned : comms) {
      Comm* s = owned.get();
      if (s->state != State::kReady || s->owner->dead() || s->owner->hung()) continue;
      if (ProgressPointToPoint(s) || ProgressCollective(s)) moved = true;
    }
  }
}

}  // namespace tandem
