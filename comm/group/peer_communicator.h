// PeerCommGroup: the Communicator (communicator.h) of a worker group whose ranks are threads of
// one process driving device streams that can address each other's buffers — ranks sharing one
// GPU (NCCL refuses two ranks on a GPU), or GPUs with peer access. The device work goes through
// PeerDeviceApi (the CUDA one is MakeCudaPeerApi(), engine/cuda/cuda_group.h; the CPU tests run
// a host fake), so this library needs no CUDA.
//
// A collective never waits for the device: the calling rank thread only enqueues work on its
// stream, ordered against the other ranks' streams by a device barrier (below), and returns:
//   1. rendezvous: every rank posts its call and buffer; the last to arrive checks that all
//      posted the same collective with the same size (InvalidArgument and the group aborted
//      otherwise); a rank that waits past the deadline aborts the group (DeadlineExceeded);
//   2. enqueue a device barrier: no rank's share starts before every rank's buffer is written
//      (each rank's earlier kernels on its stream are done);
//   3. enqueue its share: all-reduce: PeerReduceSum (kernels/peer_reduce/) of elements
//      [r·n/size, (r+1)·n/size) over every rank's buffer, in rank order in fp32, written into
//      every rank's buffer — so every rank ends with bitwise the same values, the same values
//      ThreadCommGroup gives; all-gather: copies of every rank's send buffer into its own recv;
//   4. enqueue a second device barrier: no rank's later kernels touch its buffer before the
//      peers' writes into it and reads of it are complete;
//   5. wait (on the host, unconditionally: past step 1 every rank only enqueues) until every
//      rank has enqueued, so the posts can be reused.
//
// Device barrier (kernels/peer_barrier/peer_barrier.h: a 1-CTA kernel, PeerDeviceApi::Barrier).
// Each rank has an epoch counter and flag slots in memory of its own device, which the kernel
// itself advances at every launch, so the barriers of a captured CUDA graph take no host
// argument: each rank captures its own graph of its steps (engine/model/llama_model.h), the
// rendezvous of step 1 happening once, at capture, where the buffers' addresses are exchanged
// (they must be the same at every replay: the step buffers are fixed once ReserveStep ran), and
// replays of every rank then synchronise on the device alone; eager calls and replays continue
// one count. The spin polls the group's abort word (host-mapped memory, set by Abort and by any
// failure of the group) and gives up after the group's timeout, writing why into the rank's
// error word (host-mapped), which status() reads: a rank that never replays (its thread failed
// before) or a dead group never hangs the GPU. Ranks sharing a GPU: each spinning barrier holds
// one CTA of one warp, so with at most 8 ranks the rank being waited for always has the rest of
// the device (132 SMs on an H200) to run the kernels before its own barrier. Eager calls use
// the same protocol as graphs (one path for both), with the rendezvous at every call.
//
// Send / Recv (pipeline stages: the residual stream from a stage's rank to the next stage's),
// enqueue-only too, through staging slots of each ordered pair (src, dst) — device memory on
// src's device with two events, `sent` (on src's device) and `received` (on dst's):
//   Send: take a slot the receiver is done with (or a new one; one too small gets a new buffer
//     of the next power of two, the old one kept until the group's end), make src's stream
//     wait for the slot's last `received`, copy `data` into it on src's stream, record `sent`,
//     and queue (slot, bytes) in the pair's FIFO mailbox. It waits neither for the receiver
//     nor for the device (the interface's buffered Send: `data` is free for later work on src's
//     stream; beyond the enqueues it only allocates, when a slot is new or outgrown), so
//     consecutive micro-batches queue one slot each;
//   Recv: wait (on the host, under the deadline, abortable) for the pair's oldest message,
//     check its size (InvalidArgument, the group aborted, when it is not `bytes`), make dst's
//     stream wait for its `sent`, copy it into `data` on dst's stream, record `received`, and
//     hand the slot back to the sender.
// Messages of a pair keep their order (one FIFO per pair) and never wait for each other's
// device work on the host; a slot is reused only after its receiver's copy out (the stream
// wait on `received`). A message of 0 bytes still takes its place in the FIFO (no copy).
//
// CUDA graphs: the collectives are capturable (SupportsGraphCapture; EnqueueAllReduceSum is
// AllReduceSum), a replay's barriers synchronising the ranks' replays; BeginGraphReplay counts a
// graph's collectives as calls (InjectFault) and checks the group, EndGraphReplay reports what
// the device barriers wrote so far. Send / Recv are not capturable (their host mailbox is
// consulted per message): pipeline stages run eagerly.
//
// Failures as the interface says, for the whole group at once: Abort from any thread, a missed
// deadline, a mismatched call, an injected fault (InjectFault, as ThreadCommGroup's), a device
// API error (a failed enqueue: its status, Internal for a CUDA error), or a device barrier that
// gave up (its error word: DeadlineExceeded for its timeout, Aborted when it saw the abort word
// first). Every failure sets the abort word, so no barrier already enqueued keeps spinning. An
// error only returns; the device work already enqueued by other ranks still runs to its end (it
// only moves memory), so a rank's buffers hold undefined values after a failed call. A fault
// injected with InjectFault counts every collective and every Send or Recv of the rank.
//
// Thread-safe: each rank's communicator is driven by its own thread; Abort, InjectFault and
// status from any thread.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "comm/group/collective_barrier.h"
#include "comm/group/communicator.h"
#include "kernels/common/dtype.h"

namespace tandem {

// The device calls of a PeerCommGroup. Streams and events are opaque (cudaStream_t,
// cudaEvent_t). Called from the ranks' threads, each with its own stream.
class PeerDeviceApi {
 public:
  using Stream = void*;
  using Event = void*;
  virtual ~PeerDeviceApi() = default;

  // OK when a stream on `device` can read and write memory of every device in `devices`
  // (enabling peer access where needed); FailedPrecondition naming the pair otherwise.
  virtual absl::Status EnablePeers(int device, const std::vector<int>& devices) = 0;
  virtual absl::StatusOr<Event> CreateEvent(int device) = 0;
  virtual void DestroyEvent(Event event) = 0;
  virtual absl::Status Record(Event event, Stream stream) = 0;
  // Later work on `stream` runs after the last Record of `event`.
  virtual absl::Status Wait(Stream stream, Event event) = 0;
  // kernels/peer_reduce/peer_reduce.h on `stream`: elements [begin, end) of every buffer.
  virtual absl::Status ReduceSum(const std::vector<void*>& buffers, int64_t begin, int64_t end,
                                 DType dtype, Stream stream) = 0;
  // kernels/peer_barrier/peer_barrier.h on `stream`: `args` is that header's PeerBarrierArgs
  // field for field (this library does not see the kernels).
  // An error word's values (PeerBarrierError).
  static constexpr int32_t kBarrierAborted = 1;
  static constexpr int32_t kBarrierTimedOut = 2;
  struct BarrierArgs {
    uint32_t* epoch = nullptr;
    std::vector<uint32_t*> slots;  // [rank]
    int rank = 0;
    int32_t* abort = nullptr;
    int32_t* error = nullptr;
    absl::Duration timeout;
  };
  virtual absl::Status Barrier(const BarrierArgs& args, Stream stream) = 0;
  // Device-to-device (or peer) copy on `stream`.
  virtual absl::Status Copy(void* dst, const void* src, int64_t bytes, Stream stream) = 0;
  // Staging memory of Send / Recv: `bytes` (> 0) of device memory on `device`, contents
  // undefined; ResourceExhausted when it has no room. Free releases it at the group's end.
  virtual absl::StatusOr<void*> Allocate(int device, int64_t bytes) = 0;
  virtual void Free(int device, void* memory) = 0;
  // The barrier's memory: `bytes` of device memory on `device`, zero-filled when it returns
  // (freed with Free); and `bytes` of zero-filled host memory that every device reads and writes
  // at the same address (CUDA: mapped pinned memory under unified addressing).
  virtual absl::StatusOr<void*> AllocateZeroed(int device, int64_t bytes) = 0;
  virtual absl::StatusOr<void*> AllocateHostMapped(int64_t bytes) = 0;
  virtual void FreeHostMapped(void* memory) = 0;
};

// One rank: its device and the stream its buffers are written on (the backend's compute
// stream), which outlives the group.
struct PeerRank {
  int device = 0;
  PeerDeviceApi::Stream stream = nullptr;
};

struct PeerCommOptions {
  // How long a rank waits for its peers to arrive at a collective, or for a message; measured
  // on `clock`.
  absl::Duration timeout = absl::Seconds(60);
  Clock* clock = Clock::Real();
};

class PeerCommGroup : public std::enable_shared_from_this<PeerCommGroup> {
 public:
  // A group of ranks.size() (1 to 8: kMaxPeerReduceBuffers) ranks; the peer-access error, an
  // event's, or InvalidArgument.
  static absl::StatusOr<std::shared_ptr<PeerCommGroup>> Create(std::shared_ptr<PeerDeviceApi> api,
                                                               std::vector<PeerRank> ranks,
                                                               PeerCommOptions options = {});
  ~PeerCommGroup();

  int size() const { return static_cast<int>(ranks_.size()); }
  // Rank `rank`'s communicator (each rank's once; it keeps the group alive).
  std::unique_ptr<Communicator> ForRank(int rank);

  // That rank's calls-th collective or transfer (Send, Recv) from now (0: the next) aborts the
  // group with `status` instead of running (a dead rank thread, a lost device).
  void InjectFault(int rank, int64_t calls, absl::Status status);
  void Abort(const absl::Status& reason);
  absl::Status status() const;

 private:
  friend class PeerCommunicator;
  using Op = CollectiveOp;
  using Post = CollectivePost;
  struct RankState {
    PeerRank place;
    // kBarrierWords uint32 on its device: [0] its epoch, [1 + q] the flag slot rank q writes.
    uint32_t* barrier_words = nullptr;
    PeerDeviceApi::BarrierArgs barrier;  // its barriers' arguments, the same at every launch
  };
  static constexpr int kBarrierWords = 1 + 8;

  // A staging slot of one ordered pair (the file comment). Not guarded by mu_: its owner is
  // whoever took it under mu_ — the sender from the pair's free list until it queues it, the
  // receiver from the queue until it hands it back.
  struct Slot {
    void* buffer = nullptr;  // on the sender's device, `capacity` bytes
    int64_t capacity = 0;
    std::vector<void*> retired;               // outgrown buffers, freed at the group's end
    PeerDeviceApi::Event sent = nullptr;      // sender's device
    PeerDeviceApi::Event received = nullptr;  // receiver's device
    bool used = false;                        // `received` recorded at least once
  };
  struct Message {
    int slot = 0;
    int64_t bytes = 0;
  };
  struct Pair {
    std::vector<std::unique_ptr<Slot>> slots;  // every slot made, at stable addresses
    std::vector<int> free;                     // slots the sender may take
    std::deque<Message> queue;                 // sent, not received; oldest first
  };

  PeerCommGroup(std::shared_ptr<PeerDeviceApi> api, std::vector<PeerRank> ranks,
                PeerCommOptions options);
  absl::Status Init();
  // The group's status, or the rank's armed fault fired (aborting the group) by this call.
  absl::Status EnterLocked(int rank, const char* what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status SendTo(int rank, const void* data, int64_t bytes, int peer);
  absl::Status RecvFrom(int rank, void* data, int64_t bytes, int peer);
  // Makes a slot taken for a Send of `bytes` from `src` to `dst` ready to be written: events
  // made, capacity grown.
  absl::Status PrepareSlot(int src, int dst, Slot& slot, int64_t bytes);
  Pair& PairOf(int src, int dst) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return pairs_[static_cast<size_t>(src) * ranks_.size() + dst];
  }
  // Steps 1-4 of the file comment for `post` on `rank`; `share` enqueues step 3's own work.
  absl::Status Collective(int rank, const Post& post, const char* what);
  absl::Status Share(int rank, const Post& post, const std::vector<Post>& posts);
  absl::Status Rendezvous(int rank, const Post& post, const char* what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Complete() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Fail(int rank, const char* what, const absl::Status& error);
  // A failure a device barrier wrote into an error word (OK when none did).
  absl::Status DeviceStatus() const;
  // The group's status with DeviceStatus() folded in (the group fails with it).
  absl::Status CheckedStatusLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // BeginGraphReplay of `rank` (Communicator): `collectives` calls counted.
  absl::Status EnterGraph(int rank, int64_t collectives);
  void AbortLocked(const absl::Status& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<PeerDeviceApi> api_;
  const PeerCommOptions options_;
  std::vector<RankState> ranks_;
  // Host-mapped, 1 + size int32: [0] the abort word, [1 + r] rank r's error word
  // (PeerBarrierError). Written by the devices and by AbortLocked, so not guarded by mu_.
  int32_t* host_words_ = nullptr;
  mutable absl::Mutex mu_;
  GroupFailure failure_ ABSL_GUARDED_BY(mu_);
  CollectiveBarrier barrier_ ABSL_GUARDED_BY(mu_);  // the current collective's two waits
  std::vector<Pair> pairs_ ABSL_GUARDED_BY(mu_);    // [src * size + dst]
};

}  // namespace tandem
