// The last steps of a row that the streaming kernels share (sampling_stream.cu, its top-k rows in
// sampling_stream_topk.cuh, and the row-pipelined kernel, sampling_rowpipe.cu): top-p over a small
// kept set, the inverse CDF in id order over that set, and the draw inside one entry of 128
// logits. Semantics: sampling.h; fixed-point weights: RowMath.
#pragma once

#include <cstdint>

#include "kernels/sampling/block_reduce.cuh"
#include "kernels/sampling/sampling_internal.cuh"

namespace tandem::sampling_internal {

// All kThreads threads, m <= kCap kept logits kx with their weights kw: zeroes the weights of those
// top-p drops (HF: the smallest set, by descending logit, whose mass reaches ceil(top_p * z), ties
// with its last logit kept): a logit stays iff the mass of the larger ones is below that. The
// same thresholds as the resident kernel's mass radix select. Ends with a block barrier.
template <int kThreads, int kCap>
__device__ void ApplyTopPToKept(const float* kx, uint64_t* kw, uint32_t m, uint64_t z,
                                float top_p) {
  static_assert(kCap % kThreads == 0);
  const double need_d = ceil(static_cast<double>(top_p) * static_cast<double>(z));
  const uint64_t need = need_d >= 1.0 ? static_cast<uint64_t>(need_d) : 1;
  bool drop[kCap / kThreads];
#pragma unroll
  for (int c = 0; c < kCap / kThreads; ++c) {
    const uint32_t i = c * kThreads + threadIdx.x;
    drop[c] = false;
    if (i < m) {
      const float x = kx[i];
      uint64_t above = 0;
      for (uint32_t j = 0; j < m; ++j) above += kx[j] > x ? kw[j] : 0;
      drop[c] = above >= need;
    }
  }
  __syncthreads();
#pragma unroll
  for (int c = 0; c < kCap / kThreads; ++c) {
    if (drop[c]) kw[c * kThreads + threadIdx.x] = 0;
  }
  __syncthreads();
}

// All kThreads threads: the inverse CDF in ascending id order over the m kept logits (ids kid,
// weights kw): the one whose interval [before, before + w) holds u * total writes *token (left as
// it is when the total is 0). Ends with a block barrier.
template <int kThreads>
__device__ void DrawKeptById(const int32_t* kid, const uint64_t* kw, uint32_t m, double u,
                             uint64_t* scratch, int32_t* token) {
  uint64_t mine = 0;
  for (uint32_t i = threadIdx.x; i < m; i += kThreads) mine += kw[i];
  const uint64_t total = BlockSum<kThreads / 32>(mine, scratch);
  if (total == 0) return;  // uniform
  const uint64_t target = min(static_cast<uint64_t>(u * static_cast<double>(total)), total - 1);
  for (uint32_t i = threadIdx.x; i < m; i += kThreads) {
    const uint64_t w = kw[i];
    if (w == 0) continue;
    const int32_t id = kid[i];
    uint64_t before = 0;
    for (uint32_t j = 0; j < m; ++j) before += kid[j] < id ? kw[j] : 0;
    if (before <= target && target < before + w) *token = id;  // exactly one writer
  }
  __syncthreads();
}

// One warp, the draw inside an entry of 128 logits: lane l holds logits 4l .. 4l + 3 (q; -inf
// beyond the row, NaN mapped to -inf), whose ids are id0 + 4l + e. Exact fixed-point weights of
// `row`; returns the logit whose interval holds in_entry (the target less the masses of the
// entries before), -1 if the entry has no weight. Rounding can leave in_entry at or past the
// entry's exact total (the entry masses that chose it were computed from its max and sum): then
// the entry's last weighted logit.
__device__ __forceinline__ int32_t DrawIn128(const float (&q)[4], int32_t id0, const RowMath& row,
                                             uint64_t in_entry) {
  const int lane = threadIdx.x % 32;
  float w[4], sum = 0.0f;
#pragma unroll
  for (int e = 0; e < 4; ++e) sum += w[e] = row.WeightF(q[e]);
  const uint64_t m = RowMath::Fixed(sum);
  const uint64_t excl = WarpInclusiveScan(m) - m;
  const uint64_t entry_total = __shfl_sync(0xffffffffu, excl + m, 31);
  if (in_entry >= entry_total) in_entry = entry_total == 0 ? 0 : entry_total - 1;
  int32_t token = -1;
  if (excl <= in_entry && in_entry < excl + m) {
    float cum = 0.0f;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      cum += w[e];
      if (token < 0 && RowMath::Fixed(cum) > in_entry - excl) token = id0 + 4 * lane + e;
    }
  }
  const uint32_t found = __ballot_sync(0xffffffffu, token >= 0);
  return found ? __shfl_sync(0xffffffffu, token, __ffs(found) - 1) : -1;
}

}  // namespace tandem::sampling_internal
