// PeerCommGroup: the Communicator (communicator.h) of a worker group whose ranks are threads of
// one process driving device streams that can address each other's buffers — ranks sharing one
// GPU (NCCL refuses two ranks on a GPU), or GPUs with peer access. The device work goes through
// PeerDeviceApi (the CUDA one is MakeCudaPeerApi(), engine/cuda/cuda_group.h; the CPU tests run
// a host fake), so this library needs no CUDA.
//
// A collective never waits for the device: the calling rank thread only enqueues work on its
// stream, ordered against the other ranks' streams by events, and returns:
//   1. record the rank's `ready` event on its stream (its buffer is written up to here);
//   2. rendezvous: every rank posts its call and buffer; the last to arrive checks that all
//      posted the same collective with the same size (InvalidArgument and the group aborted
//      otherwise); a rank that waits past the deadline aborts the group (DeadlineExceeded);
//   3. the rank's stream waits for every peer's `ready`, then runs its share:
//      all-reduce: PeerReduceSum (kernels/peer_reduce/) of elements [r·n/size, (r+1)·n/size)
//      over every rank's buffer, in rank order in fp32, written into every rank's buffer — so
//      every rank ends with bitwise the same values, the same values ThreadCommGroup gives;
//      all-gather: copies of every rank's send buffer into its own recv buffer;
//   4. record the rank's `done` event, wait (unconditionally: past step 2 every rank only
//      enqueues, which cannot block) until every rank has, and make its stream wait for every
//      peer's `done` — no rank's later kernels touch its buffer before the peers' writes into it
//      and reads of it are complete.
// The events are reused call after call; the two host waits order each rank's re-record after
// its peers' waits on the previous record.
//
// CUDA graphs: not capturable (a rank's stream waits on events its peers record outside its
// capture); the CUDA ranks using this group run eagerly (engine/model/parallel_model.h).
//
// Failures as the interface says, for the whole group at once: Abort from any thread, a missed
// deadline, a mismatched call, an injected fault (InjectFault, as ThreadCommGroup's), or a device
// API error (a failed enqueue: its status, Internal for a CUDA error). An error only returns; the
// device work already enqueued by other ranks still runs to its end (it only moves memory), so a
// rank's buffers hold undefined values after a failed call. Send and Recv (pipeline stages) are
// Unimplemented.
//
// Thread-safe: each rank's communicator is driven by its own thread; Abort, InjectFault and
// status from any thread.
#pragma once

#include <cstdint>
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
  // Device-to-device (or peer) copy on `stream`.
  virtual absl::Status Copy(void* dst, const void* src, int64_t bytes, Stream stream) = 0;
};

// One rank: its device and the stream its buffers are written on (the backend's compute
// stream), which outlives the group.
struct PeerRank {
  int device = 0;
  PeerDeviceApi::Stream stream = nullptr;
};

struct PeerCommOptions {
  // How long a rank waits for its peers to arrive at a collective; measured on `clock`.
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

  // That rank's calls-th collective from now (0: the next) aborts the group with `status`
  // instead of running (a dead rank thread, a lost device).
  void InjectFault(int rank, int64_t calls, absl::Status status);
  void Abort(const absl::Status& reason);
  absl::Status status() const;

 private:
  friend class PeerCommunicator;
  using Op = CollectiveOp;
  using Post = CollectivePost;
  struct RankState {
    PeerRank place;
    PeerDeviceApi::Event ready = nullptr;
    PeerDeviceApi::Event done = nullptr;
  };

  PeerCommGroup(std::shared_ptr<PeerDeviceApi> api, std::vector<PeerRank> ranks,
                PeerCommOptions options);
  absl::Status Init();
  // Steps 1-4 of the file comment for `post` on `rank`; `share` enqueues step 3's own work.
  absl::Status Collective(int rank, const Post& post, const char* what);
  absl::Status Share(int rank, const Post& post, const std::vector<Post>& posts);
  absl::Status Rendezvous(int rank, const Post& post, const char* what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Complete() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Fail(int rank, const char* what, const absl::Status& error);
  void AbortLocked(const absl::Status& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<PeerDeviceApi> api_;
  const PeerCommOptions options_;
  std::vector<RankState> ranks_;
  mutable absl::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> fault_calls_ ABSL_GUARDED_BY(mu_);  // [rank]; -1: none armed
  std::vector<absl::Status> fault_status_ ABSL_GUARDED_BY(mu_);
  CollectiveBarrier barrier_ ABSL_GUARDED_BY(mu_);  // the current collective's two waits
};

}  // namespace tandem
