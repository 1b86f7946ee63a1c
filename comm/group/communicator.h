// Communicator: the collectives and point-to-point transfers between the ranks of one worker
// group (tensor and pipeline parallelism inside a group; the KV transport between groups is
// kv_transport.h). The in-process CPU implementation over threads is thread_communicator.h;
// the NCCL one, for GPUs of one process, is nccl_communicator.h (which says where NCCL gives
// other guarantees than those below).
//
// Every rank of a group holds its own Communicator and calls the collectives in the same order
// with the same sizes (NCCL's contract). Buffers are the backend's memory (host memory on the
// CPU backend) and stay valid until the call returns.
//
// Failure model. A group is either usable or aborted, for all of its ranks at once:
//   - Abort(reason) on any rank's communicator (or an injected fault, or a peer that does not
//     arrive within the deadline) aborts the group;
//   - every collective or transfer in progress on any rank then returns promptly with a status
//     (the reason's code for an abort, DeadlineExceeded for a missed deadline), and every later
//     one returns at once with the same status: nothing ever blocks on a dead group.
// A caller treats a failed collective as fatal for the group (the engine ends every request).
//
// Thread-compatible per rank: one thread drives each rank's communicator; Abort() and status()
// may be called from any thread.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/common/dtype.h"

namespace tandem {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data[i] = Σ over ranks of data[i], in place, `count` elements of `dtype` (F32 or BF16; BF16
  // is summed in fp32 and rounded once). Every rank gets bitwise the same result.
  virtual absl::Status AllReduceSum(void* data, int64_t count, DType dtype) = 0;
  // recv = the ranks' `send` buffers concatenated in rank order: recv holds size() * bytes.
  virtual absl::Status AllGather(const void* send, void* recv, int64_t bytes) = 0;
  // Point to point: Send returns once the bytes are copied out of `data` (it does not wait for
  // the receiver); Recv waits for the next message from `peer` and fails (InvalidArgument, and
  // the group is aborted) when its size is not `bytes`. Messages between a pair keep their order.
  virtual absl::Status Send(const void* data, int64_t bytes, int peer) = 0;
  virtual absl::Status Recv(void* data, int64_t bytes, int peer) = 0;

  // CUDA graphs (engine/model/llama_model.h captures each rank's decode steps, the rank's
  // collectives inside; every rank replays its own graph). SupportsGraphCapture: whether
  // EnqueueAllReduceSum may be called while the rank's stream is being captured, its replays then
  // all-reducing the same buffers with the same peers (NCCL; the peer group's device barriers).
  // EnqueueAllReduceSum is AllReduceSum that only enqueues on the rank's stream: its device-side
  // errors surface at EndGraphReplay. Unimplemented where unsupported.
  virtual bool SupportsGraphCapture() const { return false; }
  virtual absl::Status EnqueueAllReduceSum(void* data, int64_t count, DType dtype) {
    return absl::UnimplementedError("this communicator cannot be captured into a CUDA graph");
  }
  // Around the replay of a graph holding `collectives` captured collectives: Begin returns the
  // group's status, counting the collectives as calls (an injected fault due among them fires:
  // the rank must not replay); End, after the replay is enqueued, the group's status once what
  // the rank's device reported so far is taken into account (NCCL: waits for the stream).
  virtual absl::Status BeginGraphReplay(int64_t collectives) { return status(); }
  virtual absl::Status EndGraphReplay() { return status(); }

  // Aborts the whole group with `reason` (not OK); idempotent, the first reason wins.
  virtual void Abort(const absl::Status& reason) = 0;
  // OK while the group is usable, else why it was aborted.
  virtual absl::Status status() const = 0;
};

}  // namespace tandem
