// An in-process fake of NCCL (comm/nccl_api.h) for the CPU tests of the NCCL KV transport: each
// FakeNccl is one "process" (one GPU, named by its device id), and the ranks of a communicator
// are threads of the test that share one FakeNcclWorld. "Device memory" is host memory: a
// matched send and receive memcpy the bytes, so a transfer moves real bytes without a GPU.
//
// Like non-blocking NCCL, nothing here waits: an init is in progress until the other rank has
// joined, a send completes once the peer's matching receive (FIFO per communicator, equal sizes)
// was enqueued and the send's stream event (StreamWaitEvent on a FakeEvent) fired. The work is
// done by whichever call finds it possible (every call makes progress), so the transport's own
// polls drive it. Injectable faults, per process: an init that fails (at once or later, as an
// async error), an async error after a number of completed operations (mid-transfer), a hang
// (no operation of this process completes, until CommAbort), and death (Kill: the process's
// communicators stop; its peers' operations hang, as a survivor's do when a peer is killed).
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
  struct Op {
    bool send = false;
    char* buf = nullptr;
    int64_t bytes = 0;
    Stream* stream = nullptr;
    FakeEvent* after = nullptr;
  };
  enum class State { kInit, kReady, kFailed, kAborted };
  struct Comm {
    FakeNccl* owner = nullptr;
    std::string id;
    int rank = 0;
    int device = 0;
    State state = State::kInit;
    absl::Status error;
    bool fail_when_joined = false;  // an async init failure
    Comm* peer = nullptr;
    std::deque<Op> sends;  // enqueued, not completed, in order
    std::deque<Op> recvs;
  };

  absl::Mutex mu;
  int next_id ABSL_GUARDED_BY(mu) = 0;
  std::map<std::string, std::vector<Comm*>> rendezvous ABSL_GUARDED_BY(mu);
  std::vector<std::unique_ptr<Comm>> comms ABSL_GUARDED_BY(mu);
  std::vector<std::unique_ptr<Stream>> streams ABSL_GUARDED_BY(mu);

  // Completes every operation that can complete now.
  void Progress() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
};

class FakeNccl : public NcclApi {
 public:
  FakeNccl(FakeNcclWorld* world, std::string device_id, int device = 0)
      : world_(world), device_id_(std::move(device_id)), device_(device) {}

  // --- faults ---
  std::atomic<int> fail_next_inits{0};        // CommInitRank returns an error at once
  std::atomic<int> fail_next_inits_async{0};  // the init later fails (CommReady's error)
  std::atomic<int> fail_after_ops{-1};        // >= 0: after that many more completed
                                              // operations, every comm of this process fails
  std::atomic<bool> hang{false};              // no operation of this process completes
  void Kill() {
    absl::MutexLock l(&world_->mu);
    dead_ = true;
  }

  // --- counters ---
  std::atomic<int> inits{0}, aborts{0}, destroys{0}, sends{0}, recvs{0}, groups{0};
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
    if (nranks != 2 || rank < 0 || rank > 1 || device != device_) {
      return absl::InvalidArgumentError("fake: bad init arguments");
    }
    absl::MutexLock l(&world_->mu);
    auto it = world_->rendezvous.find(unique_id);
    if (it == world_->rendezvous.end()) return absl::InvalidArgumentError("fake: unknown id");
    auto c = std::make_unique<FakeNcclWorld::Comm>();
    c->owner = this;
    c->id = unique_id;
    c->rank = rank;
    c->device = device;
    if (fail_next_inits_async.load() > 0) {
      --fail_next_inits_async;
      c->fail_when_joined = true;
    }
    FakeNcclWorld::Comm* raw = c.get();
    world_->comms.push_back(std::move(c));
    std::vector<FakeNcclWorld::Comm*>& ranks = it->second;
    ranks.push_back(raw);
    if (ranks.size() == 2) {
      ranks[0]->peer = ranks[1];
      ranks[1]->peer = ranks[0];
      for (FakeNcclWorld::Comm* r : ranks) {
        if (r->state != FakeNcclWorld::State::kInit) continue;
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
    return Post(true, const_cast<void*>(buf), bytes, peer, comm, stream);
  }
  absl::Status Recv(void* buf, int64_t bytes, int peer, Comm comm, Stream stream) override {
    ++recvs;
    return Post(false, buf, bytes, peer, comm, stream);
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

  absl::Status Post(bool send, void* buf, int64_t bytes, int peer, Comm comm, Stream stream) {
    auto* c = static_cast<FakeNcclWorld::Comm*>(comm);
    if (peer != 1 - c->rank || bytes < 0) return absl::InvalidArgumentError("fake: bad peer");
    FakeNcclWorld::Op op;
    op.send = send;
    op.buf = static_cast<char*>(buf);
    op.bytes = bytes;
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
    (op.send ? c->sends : c->recvs).push_back(op);
    return absl::OkStatus();
  }

  void End(Comm comm) {
    absl::MutexLock l(&world_->mu);
    auto* c = static_cast<FakeNcclWorld::Comm*>(comm);
    c->state = FakeNcclWorld::State::kAborted;
    // Its operations end (the kernels are killed): nothing of them moves any more.
    for (auto* q : {&c->sends, &c->recvs}) {
      for (FakeNcclWorld::Op& op : *q) op.stream->pending--;
      q->clear();
    }
    if (c->peer != nullptr) c->peer->peer = nullptr;  // the survivor's operations hang
    c->peer = nullptr;
  }

  FakeNcclWorld* const world_;
  const std::string device_id_;
  const int device_;
  bool dead_ ABSL_GUARDED_BY(world_->mu) = false;
};

inline void FakeNcclWorld::Progress() {
  bool moved = true;
  while (moved) {
    moved = false;
    for (auto& owned : comms) {
      Comm* s = owned.get();
      Comm* r = s->peer;
      if (r == nullptr || s->state != State::kReady || r->state != State::kReady) continue;
      if (s->owner->dead() || r->owner->dead() || s->owner->hung() || r->owner->hung()) continue;
      if (s->sends.empty() || r->recvs.empty()) continue;
      Op& send = s->sends.front();
      Op& recv = r->recvs.front();
      if ((send.after != nullptr && !send.after->fired.HasBeenNotified()) ||
          (recv.after != nullptr && !recv.after->fired.HasBeenNotified())) {
        continue;
      }
      if (send.bytes != recv.bytes) {
        for (Comm* c : {s, r}) {
          c->state = State::kFailed;
          c->error = absl::InternalError("fake: send and receive sizes differ");
        }
        continue;
      }
      std::memcpy(recv.buf, send.buf, static_cast<size_t>(send.bytes));
      send.stream->pending--;
      recv.stream->pending--;
      s->sends.pop_front();
      r->recvs.pop_front();
      s->owner->CountCompletion(s);
      r->owner->CountCompletion(r);
      moved = true;
    }
  }
}

}  // namespace tandem
