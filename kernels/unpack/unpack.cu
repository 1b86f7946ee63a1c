// CUDA Unpack (unpack.h): grid.y indexes the work — copies first, then row sets; grid.x strides
// over a copy's 16-byte vectors (or a row set's rows, one warp per row). The header is read from
// device memory by every block (it was uploaded with the payload), so the launch needs only its
// host copy's sizes.
#include <algorithm>

#include "base/cuda_check.h"
#include "kernels/unpack/unpack.h"

namespace tandem {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocksPerItem = 64;

__global__ void __launch_bounds__(kThreads) UnpackKernel(const uint8_t* __restrict__ packed) {
  const auto& h = *reinterpret_cast<const UnpackHeader*>(packed);
  const uint32_t item = blockIdx.y;
  if (item < h.num_copies) {
    const UnpackCopy c = h.copies[item];
    const uint4* src = reinterpret_cast<const uint4*>(packed + c.src_offset);
    uint4* dst = reinterpret_cast<uint4*>(c.dst);
    const uint32_t vecs = c.bytes / 16;
    for (uint32_t i = blockIdx.x * kThreads + threadIdx.x; i < vecs; i += gridDim.x * kThreads) {
      dst[i] = src[i];
    }
    return;
  }
  const uint32_t set = item - h.num_copies;
  if (set >= h.num_row_sets) return;
  const UnpackRows rs = h.rows[set];
  const auto* values = reinterpret_cast<const int32_t*>(packed + rs.src_offset);
  const auto* starts = reinterpret_cast<const int32_t*>(packed + rs.row_start_offset);
  auto* dst = reinterpret_cast<int32_t*>(rs.dst);
  const int lane = threadIdx.x % 32;
  const int warps = kThreads / 32;
  for (int r = blockIdx.x * warps + threadIdx.x / 32; r < rs.num_rows; r += gridDim.x * warps) {
    const int begin = starts[r], end = starts[r + 1];
    int32_t* row = dst + int64_t{r} * rs.dst_stride;
    for (int i = begin + lane; i < end; i += 32) row[i - begin] = values[i];
  }
}

}  // namespace

absl::Status Unpack(const void* packed_device, const UnpackHeader& header, cudaStream_t stream) {
  if (header.num_copies > kUnpackMaxCopies || header.num_row_sets > kUnpackMaxRowSets) {
    return absl::InvalidArgumentError("Unpack: header lists too many items");
  }
  const uint32_t items = header.num_copies + header.num_row_sets;
  if (items == 0) return absl::OkStatus();
  int max_rows = 0;
  for (uint32_t i = 0; i < header.num_row_sets; ++i) {
    max_rows = std::max(max_rows, header.rows[i].num_rows);
  }
  const int64_t by_copy = (int64_t{header.max_copy_bytes} / 16 + kThreads - 1) / kThreads;
  const int64_t by_rows = (int64_t{max_rows} + kThreads / 32 - 1) / (kThreads / 32);
  const int blocks_x =
      static_cast<int>(std::clamp<int64_t>(std::max(by_copy, by_rows), 1, kMaxBlocksPerItem));
  UnpackKernel<<<dim3(blocks_x, items), kThreads, 0, stream>>>(
      static_cast<const uint8_t*>(packed_device));
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tandem
