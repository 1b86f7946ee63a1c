// KvPageCopy on the device: block (page i, slice j) copies 16-byte vectors of page i with a
// grid-stride loop; a 64 KiB page is 4096 vectors, i.e. 16 per thread of one 256-thread block.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "base/cuda_check.h"
#include "kernels/kv_page_copy/kv_page_copy.h"

namespace tandem {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    KvPageCopyKernel(const __grid_constant__ KvPageCopyArgs a) {
  const int page = blockIdx.x;
  const int64_t vecs = a.page_bytes / 16;
  const uint4* src = reinterpret_cast<const uint4*>(static_cast<const char*>(a.src_layer) +
                                                    int64_t{a.src_pages[page]} * a.page_bytes);
  uint4* dst = reinterpret_cast<uint4*>(static_cast<char*>(a.dst_layer) +
                                        int64_t{a.dst_pages[page]} * a.page_bytes);
  for (int64_t v = int64_t{blockIdx.y} * kThreads + threadIdx.x; v < vecs;
       v += int64_t{gridDim.y} * kThreads) {
    dst[v] = src[v];
  }
}

}  // namespace

absl::Status KvPageCopy(const KvPageCopyArgs& a, cudaStream_t stream) {
  if (a.num_pages < 0 || a.num_pages > kKvPageCopyMaxPages || a.page_bytes < 0 ||
      a.page_bytes % 16 != 0 || reinterpret_cast<uintptr_t>(a.dst_layer) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(a.src_layer) % 16 != 0) {
    return absl::InvalidArgumentError("KvPageCopy: page count, size or alignment out of range");
  }
  if (a.num_pages == 0 || a.page_bytes == 0) return absl::OkStatus();
  const int64_t vecs = a.page_bytes / 16;
  // Enough slices per page that a small batch still fills the GPU (4 vectors per thread min).
  const int slices = static_cast<int>(
      std::min<int64_t>(std::max<int64_t>(1, (vecs + 4 * kThreads - 1) / (4 * kThreads)), 65535));
  KvPageCopyKernel<<<dim3(a.num_pages, slices), kThreads, 0, stream>>>(a);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace tandem
