// cuda_group.h over the CUDA runtime.
#include "engine/cuda/cuda_group.h"

#include <cuda_runtime.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "engine/cuda/cuda_ops.h"
#include "kernels/peer_barrier/peer_barrier.h"
#include "kernels/peer_reduce/peer_reduce.h"

namespace tandem {
namespace {

// Restores the calling thread's current device when it goes.
class DeviceGuard {
 public:
  DeviceGuard() {
    if (cudaGetDevice(&saved_) != cudaSuccess) {
      cudaGetLastError();
      saved_ = -1;
    }
  }
  ~DeviceGuard() {
    if (saved_ >= 0) cudaSetDevice(saved_);
  }

 private:
  int saved_ = -1;
};

class CudaPeerApi final : public PeerDeviceApi {
 public:
  absl::Status EnablePeers(int device, const std::vector<int>& devices) override {
    DeviceGuard guard;
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    for (int peer : devices) {
      if (peer == device) continue;
      int can = 0;
      CUDA_RETURN_IF_ERROR(cudaDeviceCanAccessPeer(&can, device, peer));
      if (can == 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("GPU ", device, " cannot access GPU ", peer,
                         "'s memory (no peer access): their ranks need NCCL"));
      }
      const cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();  // enabled by an earlier group: fine
      } else {
        CUDA_RETURN_IF_ERROR(e);
      }
    }
    return absl::OkStatus();
  }
  absl::StatusOr<Event> CreateEvent(int device) override {
    DeviceGuard guard;
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    cudaEvent_t e = nullptr;
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return static_cast<Event>(e);
  }
  void DestroyEvent(Event event) override { cudaEventDestroy(static_cast<cudaEvent_t>(event)); }
  absl::Status Record(Event event, Stream stream) override {
    CUDA_RETURN_IF_ERROR(
        cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)));
    return absl::OkStatus();
  }
  absl::Status Wait(Stream stream, Event event) override {
    CUDA_RETURN_IF_ERROR(
        cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0));
    return absl::OkStatus();
  }
  absl::Status ReduceSum(const std::vector<void*>& buffers, int64_t begin, int64_t end, DType dtype,
                         Stream stream) override {
    if (buffers.size() > static_cast<size_t>(kMaxPeerReduceBuffers)) {
      return absl::InvalidArgumentError(
          absl::StrCat("PeerReduceSum of ", buffers.size(), " buffers"));
    }
    PeerReduceArgs args;
    for (size_t i = 0; i < buffers.size(); ++i) args.buffers[i] = buffers[i];
    args.num_buffers = static_cast<int>(buffers.size());
    args.begin = begin;
    args.end = end;
    args.dtype = dtype;
    return PeerReduceSum(args, static_cast<cudaStream_t>(stream));
  }
  absl::Status Barrier(const BarrierArgs& b, Stream stream) override {
    if (b.slots.size() > static_cast<size_t>(kMaxPeerBarrierRanks)) {
      return absl::InvalidArgumentError(absl::StrCat("PeerBarrier of ", b.slots.size(), " ranks"));
    }
    PeerBarrierArgs args;
    args.epoch = b.epoch;
    for (size_t q = 0; q < b.slots.size(); ++q) args.slots[q] = b.slots[q];
    args.rank = b.rank;
    args.num_ranks = static_cast<int>(b.slots.size());
    args.abort = b.abort;
    args.error = b.error;
    args.timeout_ns = absl::ToInt64Nanoseconds(b.timeout);
    return PeerBarrier(args, static_cast<cudaStream_t>(stream));
  }
  absl::Status Copy(void* dst, const void* src, int64_t bytes, Stream stream) override {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault,
                                         static_cast<cudaStream_t>(stream)));
    return absl::OkStatus();
  }
  absl::StatusOr<void*> Allocate(int device, int64_t bytes) override {
    DeviceGuard guard;
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    void* memory = nullptr;
    const cudaError_t e = cudaMalloc(&memory, static_cast<size_t>(bytes));
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(absl::StrCat("GPU ", device, " has no room for a ", bytes,
                                                       "-byte pipeline staging buffer"));
    }
    CUDA_RETURN_IF_ERROR(e);
    return memory;
  }
  void Free(int device, void* memory) override {
    DeviceGuard guard;
    if (cudaSetDevice(device) == cudaSuccess) cudaFree(memory);
    cudaGetLastError();
  }
  absl::StatusOr<void*> AllocateZeroed(int device, int64_t bytes) override {
    ASSIGN_OR_RETURN(void* memory, Allocate(device, bytes));
    DeviceGuard guard;
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
    // Synchronous: the words are zero before any rank's stream launches a barrier.
    CUDA_RETURN_IF_ERROR(cudaMemset(memory, 0, static_cast<size_t>(bytes)));
    CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    return memory;
  }
  absl::StatusOr<void*> AllocateHostMapped(int64_t bytes) override {
    void* memory = nullptr;
    // Portable and mapped: every device of the process reads and writes it, at the host address
    // (unified addressing), which PeerBarrierArgs hands to the kernel as is.
    CUDA_RETURN_IF_ERROR(cudaHostAlloc(&memory, static_cast<size_t>(bytes),
                                       cudaHostAllocMapped | cudaHostAllocPortable));
    std::memset(memory, 0, static_cast<size_t>(bytes));
    return memory;
  }
  void FreeHostMapped(void* memory) override {
    cudaFreeHost(memory);
    cudaGetLastError();
  }
};

static_assert(PeerDeviceApi::kBarrierAborted == kPeerBarrierAborted &&
              PeerDeviceApi::kBarrierTimedOut == kPeerBarrierTimedOut);

}  // namespace

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

absl::Status SetCudaDevice(int device) {
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  return absl::OkStatus();
}

absl::StatusOr<CudaRankOps> MakeCudaRankOps(int device) {
  const int count = CudaDeviceCount();
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", device, " is not visible (", count, " visible)"));
  }
  RETURN_IF_ERROR(SetCudaDevice(device));
  ASSIGN_OR_RETURN(std::unique_ptr<CudaOps> ops, CudaOps::Create());
  CudaRankOps out;
  out.stream = ops->stream();
  out.ops = std::move(ops);
  return out;
}

std::shared_ptr<PeerDeviceApi> MakeCudaPeerApi() { return std::make_shared<CudaPeerApi>(); }

}  // namespace tandem
