// The tuner's device half (cublaslt_autotune.h): the delay kernel that keeps the GPU busy while
// a timing sample's launches are queued behind it.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/cublaslt_autotune.h"

namespace tandem {
namespace {

__device__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One thread spins for `ns` nanoseconds of the GPU's global timer.
__global__ void DelayKernel(int64_t ns) {
  const uint64_t start = GlobalTimerNs();
  while (GlobalTimerNs() - start < static_cast<uint64_t>(ns)) {
  }
}

}  // namespace

cudaError_t LaunchLtTuneDelay(int64_t ns, cudaStream_t stream) {
  DelayKernel<<<1, 1, 0, stream>>>(ns);
  return cudaGetLastError();
}

}  // namespace tandem
