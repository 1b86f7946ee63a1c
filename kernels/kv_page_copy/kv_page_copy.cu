// KvPageCopy on the device: block (page i, slice j, layer k) copies 16-byte vectors of page i of
// layer k with a grid-stride loop; a 64 KiB page is 4096 vectors, i.e. 16 per thread of one
// 256-thread block. Blocks start in index order, so the layers stream one after another.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "base/cuda_check.h"
#include "kernels/kv_page_copy/kv_page_copy.h"

namespace tandem {
namespace {

constexpr int kThreads = 256;
// 16-byte vectors each thread loads before it stores any: a block moves kThreads * kVecs * 16 =
// 32 KiB of a page per pass with every load in flight at once (a 64 KiB page is 2 blocks).
constexpr int kVecs = 8;

__global__ void __launch_bounds__(kThreads)
    KvPageCopyKernel(const __grid_constant__ KvPageCopyArgs a) {
  const int page = blockIdx.x;
  const int64_t layer = blockIdx.z;
  const int64_t vecs = a.page_bytes / 16;
  const uint4* src = reinterpret_cast<const uint4*>(static_cast<const char*>(a.src_layer) +
                                                    layer * a.src_layer_bytes +
                                                    int64_t{a.src_pages[page]} * a.page_bytes);
  uint4* dst =
      reinterpret_cast<uint4*>(static_cast<char*>(a.dst_layer) + layer * a.dst_layer_bytes +
                               int64_t{a.dst_pages[page]} * a.page_bytes);
  constexpr int64_t kChunk = int64_t{kThreads} * kVecs;
  for (int64_t base = int64_t{blockIdx.y} * kChunk + threadIdx.x; base < vecs;
       base += int64_t{gridDim.y} * kChunk) {
    uint4 v[kVecs];
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      const int64_t i = base + int64_t{j} * kThreads;
      if (i < vecs) v[j] = __ldcs(src + i);  // streamed once: evict-first in L2
    }
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      const int64_t i = base + int64_t{j} * kThreads;
      if (i < vecs) __stcs(dst + i, v[j]);
    }
  }
}

}  // namespace

absl::Status KvPageCopy(const KvPageCopyArgs& a, cudaStream_t stream) {
  if (a.num_pages < 0 || a.num_pages > kKvPageCopyMaxPages || a.page_bytes < 0 ||
      a.page_bytes % 16 != 0 || reinterpret_cast<uintptr_t>(a.dst_layer) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(a.src_layer) % 16 != 0 || a.num_layers < 0 ||
      a.num_layers > kKvPageCopyMaxLayers || a.dst_layer_bytes % 16 != 0 ||
      a.src_layer_bytes % 16 != 0) {
    return absl::InvalidArgumentError(
        "KvPageCopy: page or layer count, size or alignment out of range");
  }
  if (a.num_pages == 0 || a.page_bytes == 0 || a.num_layers == 0) return absl::OkStatus();
  const int64_t vecs = a.page_bytes / 16;
  // One block per kThreads * kVecs vectors of a page (a 64 KiB page: 2 blocks), so a layer of
  // 512 such pages is ~1 wave of 1024 blocks with every block's loads in flight at once.
  const int64_t chunk = int64_t{kThreads} * kVecs;
  const int slices =
      static_cast<int>(std::min<int64_t>(std::max<int64_t>(1, (vecs + chunk - 1) / chunk), 65535));
  KvPageCopyKernel<<<dim3(a.num_pages, slices, a.num_layers), kThreads, 0, stream>>>(a);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace tandem
