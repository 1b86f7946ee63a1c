// The NCCL and CUDA stream calls the NCCL KV transport (comm/nccl_kv_transport.h) and the NCCL
// communicator of a worker group (comm/group/nccl_communicator.h) make, behind an
// interface: the real implementation is engine/cuda/cuda_nccl.cc over libnccl and the CUDA
// runtime (target tandem_cuda_nccl; a stub saying why where CUDA or libnccl is missing), and the
// CPU tests drive the transport through an in-process fake (tests/comm/fake_nccl.h). So comm/
// itself needs neither CUDA nor NCCL.
//
// Communicators are non-blocking (ncclConfig_t::blocking = 0): no call here waits for a peer. A
// call that starts work (CommInitRank, GroupEnd, an enqueue outside a group) returns at once and
// the caller polls CommReady until the comm is ready or failed, under its own deadline, before
// its next call on that comm; a failed or hung comm is ended with CommAbort, which never waits
// for the peer.
//
// Thread-safety: as NCCL's. One communicator is used by one thread at a time (the transport and
// the group communicator serialize their users); Group* calls are per thread; CommAbort may be
// called from any thread (not while another thread is inside a call on the same comm: it frees
// the comm).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem {

class NcclApi {
 public:
  using Comm = void*;    // an ncclComm_t (and its device)
  using Stream = void*;  // a cudaStream_t

  virtual ~NcclApi() = default;

  // The CUDA device (ordinal in this process) that holds `ptr`; FailedPrecondition when it is
  // not device memory.
  virtual absl::StatusOr<int> DeviceOf(const void* ptr) = 0;
  // A stable name of `device` that another process can compare with its own (the GPU's UUID):
  // two workers' pools are on the same GPU exactly when their ids are equal.
  virtual absl::StatusOr<std::string> DeviceId(int device) = 0;

  // ncclGetUniqueId: the opaque bytes rank 0 hands to the other ranks.
  virtual absl::StatusOr<std::string> GetUniqueId() = 0;
  // ncclCommInitRankConfig on `device` with blocking = 0: returns at once; the comm is usable
  // once CommReady says true. An error here (bad id, no device) leaves nothing to abort.
  virtual absl::StatusOr<Comm> CommInitRank(const std::string& unique_id, int nranks, int rank,
                                            int device) = 0;
  // ncclCommGetAsyncError: true when the comm is ready (its init, and the enqueueing of the last
  // group, are done), false while in progress, the error once it failed (then CommAbort it).
  virtual absl::StatusOr<bool> CommReady(Comm comm) = 0;

  // ncclGroupStart / ncclGroupEnd (ncclInProgress from GroupEnd is OK: poll CommReady).
  virtual absl::Status GroupStart() = 0;
  virtual absl::Status GroupEnd() = 0;
  // ncclSend / ncclRecv of `bytes` bytes (ncclInt8) with rank `peer`, enqueued on `stream`.
  virtual absl::Status Send(const void* buf, int64_t bytes, int peer, Comm comm, Stream stream) = 0;
  virtual absl::Status Recv(void* buf, int64_t bytes, int peer, Comm comm, Stream stream) = 0;

  // The element types of the reductions (ncclFloat32, ncclBfloat16).
  enum class ReduceType { kF32, kBF16 };
  // ncclAllReduce with ncclSum of `count` elements from `send` into `recv` (in place when they
  // are equal), enqueued on `stream`. NCCL's own arithmetic: each addition of two elements is
  // one add of `type`, rounded to `type` (bf16 adds round to bf16), in NCCL's order.
  virtual absl::Status AllReduceSum(const void* send, void* recv, int64_t count, ReduceType type,
                                    Comm comm, Stream stream) = 0;
  // ncclAllGather of `bytes` bytes (ncclInt8) per rank: recv holds nranks * bytes, rank r's
  // `send` at r * bytes (in place when send == recv + rank * bytes), enqueued on `stream`.
  virtual absl::Status AllGather(const void* send, void* recv, int64_t bytes, Comm comm,
                                 Stream stream) = 0;

  // ncclCommAbort: ends the comm at once, whatever its state (in-flight operations end with it;
  // no byte moves by it afterwards), and frees it.
  virtual void CommAbort(Comm comm) = 0;
  // ncclCommDestroy of a ready, idle comm (the orderly end; CommAbort when in doubt).
  virtual absl::Status CommDestroy(Comm comm) = 0;

  // A non-blocking stream on `device` for one communicator's operations.
  virtual absl::StatusOr<Stream> CreateStream(int device) = 0;
  // Waits (bounded) for what the stream still holds, then destroys it.
  virtual void DestroyStream(Stream stream) = 0;
  // cudaStreamWaitEvent: later work on `stream` runs after `event` (a cudaEvent_t of this
  // process; KvPushListener's per-layer event).
  virtual absl::Status StreamWaitEvent(Stream stream, void* event) = 0;
  // cudaStreamQuery: true when everything enqueued on the stream has completed.
  virtual absl::StatusOr<bool> StreamDone(Stream stream) = 0;
};

// The libnccl implementation (engine/cuda/cuda_nccl.cc), or Unimplemented saying why in a build
// without CUDA or without libnccl.
absl::StatusOr<std::shared_ptr<NcclApi>> MakeCudaNccl();

}  // namespace tandem
