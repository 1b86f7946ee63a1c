// NcclCommGroup: the Communicator (communicator.h) of a worker group whose ranks are GPUs of one
// process, one thread driving each rank (one process per group), over NCCL through NcclApi
// (comm/nccl_api.h; the real one is MakeCudaNccl(), engine/cuda/cuda_nccl.cc), so this library
// needs neither CUDA nor NCCL. The CPU tests drive it through the in-process fake
// (tests/comm/fake_nccl.h). Rank r runs on its own GPU: NCCL allows one rank per GPU.
//
// Creation (MakeNcclGroup): rank 0's ncclGetUniqueId, then ncclCommInitRankConfig with blocking
// = 0 for every rank on its GPU, all from the creating thread inside one ncclGroupStart /
// ncclGroupEnd (what ncclCommInitAll does; the id never leaves the process and a non-blocking
// init returns at once, so no thread per rank is needed), then every comm polled until ready
// under `timeout`. A failure (an init error, an async init error, the deadline) aborts every
// comm made and is returned.
//
// Blocking calls (the Communicator interface). Each enqueues its NCCL operation on the rank's
// stream and polls — ncclCommGetAsyncError (NcclApi::CommReady) and cudaStreamQuery
// (StreamDone), `poll_interval` apart — until the stream has completed it, under `timeout`
// from the call's start. The rank's stream is the caller's (NcclRank::stream, e.g. the CUDA
// backend's compute stream: the operation then runs after the kernels enqueued before it, and
// the wait covers them) or a non-blocking stream the group creates on the rank's GPU. Where the
// NCCL group differs from the interface's contract (and from ThreadCommGroup):
//   - BF16 all-reduce is NCCL's own bf16 sum: each addition of two elements is one bf16 add,
//     rounded to bf16, in NCCL's order (ring or tree, chosen per message size and topology).
//     With 2 ranks that is the contract (the sum of the two values, rounded once). With N > 2
//     ranks the result may differ from the fp32 sum rounded once by one bf16 rounding per
//     addition (N - 1 of them), and may change with NCCL's choice of algorithm. The ranks still
//     end with the same bits: NCCL's algorithms (ring, tree, NVLS) reduce each element once and
//     copy that sum to every rank, though NCCL's documentation does not promise it. No fp32
//     scratch is used: it would need a conversion kernel here and twice the bytes on the wire.
//     F32 sums are likewise in NCCL's order (the same bits on every rank, not ThreadCommGroup's
//     rank order).
//   - Send returns once NCCL's send completed, which for all but small messages means once the
//     peer's Recv took the bytes (an NCCL send is a rendezvous), not as soon as they are copied
//     out; so two ranks that both Send to each other before they Recv wait for one another
//     until the deadline, where ThreadCommGroup's buffered Send would not.
//   - Sizes are not checked across ranks: NCCL matches operations by their order alone, so a
//     Recv of another size than its Send, or collectives of different counts on different ranks,
//     are undefined (wrong bytes, or a hang that ends at the deadline), not InvalidArgument.
//   - A collective or transfer of 0 elements / bytes enqueues nothing (OK at once, on every rank
//     alike, once the group's status is checked).
//
// Enqueue only, for CUDA graphs: AllReduceSumAsync, AllGatherAsync, SendAsync and RecvAsync
// enqueue on the caller's `stream` and return once NCCL took the operation (CommReady polled out
// of ncclInProgress, host state only), with no stream query and no wait for the GPU: they may be
// called while `stream` is being captured into a CUDA graph (whose replays then run the NCCL
// kernel). Their errors — an NCCL error, a peer that never arrives — surface at the rank's next
// synchronizing call: a blocking call, or Synchronize(stream) (never while `stream` is captured:
// it queries the stream).
//
// Failures, as the interface says, for the whole group at once. Abort(reason) from any thread,
// an NCCL error on any rank (an enqueue's or an async one) and a wait that passes its deadline
// (DeadlineExceeded) abort the group: the first reason is kept (status()) and every rank's comm
// is aborted at once (ncclCommAbort: its kernels end, nothing in flight completes, no byte moves
// by it afterwards), each under its rank's lock, so no rank is inside an NCCL call on its comm
// while it is freed, and a rank thread blocked outside this class (a stream synchronize of the
// backend's, behind a hung NCCL kernel) is freed too. Every call waiting on any rank returns the
// group's status once its own comm is aborted, and every later call at once. The group's end
// (the last communicator and holder gone) aborts the comms too: ncclCommAbort never waits for a
// peer, where ncclCommDestroy waits for everything enqueued (and a hung operation would hang the
// destructor); destroy it once the ranks' streams are idle.
//
// Thread-safe as the interface: one thread drives each rank's communicator; Abort and status from
// any thread. The real NcclApi makes each call with its rank's GPU current (cudaSetDevice), so a
// rank thread's current device is its rank's after a call, and MakeNcclGroup's caller's, or an
// aborting thread's, may be any of the group's.
//
// Used by the CUDA backend's tensor-parallel ranks on GPUs of their own (LoadCudaParallelModel,
// engine/model/parallel_model.h: the blocking calls, on each rank's compute stream); ranks
// sharing a GPU use comm/group/peer_communicator.h instead.
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
#include "comm/group/communicator.h"
#include "comm/nccl_api.h"

namespace tandem {

// One rank of an NCCL group: its GPU, and the stream of its blocking calls (null: the group
// creates one on `device`, and destroys it at its end; else the caller's, which outlives the
// group).
struct NcclRank {
  int device = 0;
  NcclApi::Stream stream = nullptr;
};

struct NcclGroupOptions {
  // How long the init may take, and each blocking call or Synchronize; measured on `clock`.
  absl::Duration timeout = absl::Seconds(60);
  Clock* clock = Clock::Real();
  // Real time between two polls of a comm and its stream (0: poll again at once).
  absl::Duration poll_interval = absl::Microseconds(20);
};

class NcclCommGroup;

// One rank's view of the group: the Communicator interface, plus the enqueue-only calls.
class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<NcclCommGroup> group, int rank);

  int rank() const override { return rank_; }
  int size() const override;
  // The blocking calls; see the file comment for what NCCL gives beside the interface.
  absl::Status AllReduceSum(void* data, int64_t count, DType dtype) override;
  absl::Status AllGather(const void* send, void* recv, int64_t bytes) override;
  absl::Status Send(const void* data, int64_t bytes, int peer) override;
  absl::Status Recv(void* data, int64_t bytes, int peer) override;
  void Abort(const absl::Status& reason) override;
  absl::Status status() const override;
  // CUDA graphs (communicator.h): the capturable all-reduce is AllReduceSumAsync on the rank's
  // stream; after a replay, Synchronize(), where an NCCL error or a peer that never replayed
  // surfaces under the deadline.
  bool SupportsGraphCapture() const override { return true; }
  absl::Status EnqueueAllReduceSum(void* data, int64_t count, DType dtype) override {
    return AllReduceSumAsync(data, count, dtype, nullptr);
  }
  absl::Status EndGraphReplay() override { return Synchronize(); }

  // Enqueue only, on `stream` (of this rank's GPU; null: the rank's stream), capturable into a
  // CUDA graph: the file comment. The blocking calls' arguments; the buffers stay valid until
  // the stream (or the graph's replay) has run the operation.
  absl::Status AllReduceSumAsync(void* data, int64_t count, DType dtype, NcclApi::Stream stream);
  absl::Status AllGatherAsync(const void* send, void* recv, int64_t bytes, NcclApi::Stream stream);
  absl::Status SendAsync(const void* data, int64_t bytes, int peer, NcclApi::Stream stream);
  absl::Status RecvAsync(void* data, int64_t bytes, int peer, NcclApi::Stream stream);
  // Waits under the deadline until `stream` (null: this rank's stream) completed everything
  // enqueued on it, polling this rank's comm: where the async calls' errors surface.
  absl::Status Synchronize(NcclApi::Stream stream = nullptr);

  int device() const;
  NcclApi::Stream stream() const;  // the stream of the blocking calls

 private:
  enum class Op { kAllReduce, kAllGather, kSend, kRecv };
  // Checks the arguments, enqueues the operation on `stream` (null: this rank's) and, when
  // `wait`, waits for the stream to complete it.
  absl::Status Enqueue(Op op, const void* send, void* recv, int64_t n, DType dtype, int peer,
                       NcclApi::Stream stream, bool wait);

  std::shared_ptr<NcclCommGroup> group_;
  const int rank_;
};

class NcclCommGroup : public std::enable_shared_from_this<NcclCommGroup> {
 public:
  ~NcclCommGroup();

  int size() const { return static_cast<int>(ranks_.size()); }
  // Rank `rank`'s communicator (each rank's once; it keeps the group alive).
  std::unique_ptr<NcclCommunicator> ForRank(int rank);

  void Abort(const absl::Status& reason);
  absl::Status status() const;

 private:
  friend class NcclCommunicator;
  friend absl::StatusOr<std::shared_ptr<NcclCommGroup>> MakeNcclGroup(std::shared_ptr<NcclApi>,
                                                                      std::vector<NcclRank>,
                                                                      NcclGroupOptions);
  struct RankState {
    int device = 0;
    NcclApi::Stream stream = nullptr;
    bool owns_stream = false;
    // Held while this rank's comm is inside an NCCL call, and while it is aborted.
    absl::Mutex mu;
    NcclApi::Comm comm ABSL_GUARDED_BY(mu) = nullptr;  // null before init and once aborted
  };
  enum class Wait { kComm, kStream };  // ready to take the next call; or its stream done too

  NcclCommGroup(std::shared_ptr<NcclApi> api, NcclGroupOptions options,
                const std::vector<NcclRank>& ranks);
  absl::Status Init();

  // Runs call(comm, stream) (null `stream`: the rank's) on the rank's comm and waits (kComm:
  // until NCCL took it; kStream: until the stream completed it) until `deadline`; an error or
  // the deadline aborts the group.
  template <typename Call>
  absl::Status Run(int rank, const char* what, Call call, Wait wait, NcclApi::Stream stream,
                   absl::Time deadline);
  absl::Status Await(int rank, const char* what, Wait wait, NcclApi::Stream stream,
                     absl::Time deadline);
  // A call with nothing to move: the group's status (this rank's comm aborted if it failed).
  absl::Status Empty(int rank);
  // Aborts the group with `error`, naming the rank and the call; returns the group's status.
  absl::Status Fail(int rank, const char* what, const absl::Status& error);
  // The group's status once this rank's comm is aborted (the group has failed).
  absl::Status Failed(int rank);
  void AbortComm(int rank);
  void AbortComms();

  const std::shared_ptr<NcclApi> api_;
  const NcclGroupOptions options_;
  std::vector<std::unique_ptr<RankState>> ranks_;
  mutable absl::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// A group of ranks.size() (>= 1) ranks, rank r on ranks[r].device (distinct: InvalidArgument
// otherwise), initialized and ready; the init's error otherwise (every comm made aborted).
absl::StatusOr<std::shared_ptr<NcclCommGroup>> MakeNcclGroup(std::shared_ptr<NcclApi> api,
                                                             std::vector<NcclRank> ranks,
                                                             NcclGroupOptions options = {});

}  // namespace tandem
