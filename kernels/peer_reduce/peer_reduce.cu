// CUDA PeerReduceSum (peer_reduce.h): a grid-stride loop over the rank's share; each element
// read from every buffer in rank order, summed in fp32, written back to every buffer. Memory
// bound (num_buffers reads and writes per element); the buffers of other ranks are read and
// written in place through the device's (peer) mappings.
#include <cuda_bf16.h>

#include <algorithm>

#include "base/cuda_check.h"
#include "kernels/common/vec_util.cuh"
#include "kernels/peer_reduce/peer_reduce.h"

namespace tandem {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 132 * 8;

__global__ void __launch_bounds__(kThreads)
    PeerReduceKernel(const __grid_constant__ PeerReduceArgs a) {
  const bool b16 = a.dtype == DType::kBF16;
  for (int64_t i = a.begin + static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < a.end;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    float sum = 0.0f;
    for (int r = 0; r < a.num_buffers; ++r) sum += LoadAny(a.buffers[r], b16, i);
    for (int r = 0; r < a.num_buffers; ++r) StoreAny(a.buffers[r], b16, i, sum);
  }
}

}  // namespace

absl::Status PeerReduceSum(const PeerReduceArgs& args, cudaStream_t stream) {
  if (absl::Status s = CheckPeerReduce(args); !s.ok()) return s;
  const int64_t n = args.end - args.begin;
  if (n == 0) return absl::OkStatus();
  const int64_t blocks = std::min(kMaxBlocks, (n + kThreads - 1) / kThreads);
  PeerReduceKernel<<<blocks, kThreads, 0, stream>>>(args);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tandem
