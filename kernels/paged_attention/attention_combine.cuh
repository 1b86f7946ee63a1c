// The split-KV merge of the decode kernel (paged_attention.cu), run inside the decode kernel by
// the CTA whose split of a merge item finishes last (attention_plan.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/paged_attention/attention_plan.h"
#include "kernels/paged_attention/attention_tile.cuh"
#include "kernels/paged_attention/paged_attention.h"

namespace tandem::attention {

// Combines the splits of one merge item (run by the CTA whose split finished last): for each
// row, out = sum_k w_k O_k / sum_k w_k with w_k = 2^(lse_k - max lse). One warp per row (the
// rows of a GQA group in parallel); lane j computes the weight of split k0 + j and broadcasts it
// with a shuffle, and each lane sums D / 32 dims over the splits, kUnroll loads in flight.
// Partials are read with ld.global.cg: other CTAs wrote them, and L1 is not coherent.
template <int D, int kCombineThreads>
__device__ void CombineSplits(const PagedAttentionArgs& a, const AttentionMergeItem& mi,
                              const float* partial_out, const float* partial_lse) {
  constexpr int kWarps = kCombineThreads / 32;
  constexpr int kPer = D / 32;  // dims per lane
  constexpr int kUnroll = 16;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int group = a.num_q_heads / a.num_kv_heads;
  for (int r = warp; r < mi.num_rows; r += kWarps) {
    const float* lse = partial_lse + int64_t{mi.first_partial} * kDecodeRows + r;
    float mx = -INFINITY;
    for (int k = lane; k < mi.num_splits; k += 32) mx = fmaxf(mx, __ldcg(lse + k * kDecodeRows));
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float acc[kPer] = {};
    float sum = 0.0f;
    for (int k0 = 0; k0 < mi.num_splits; k0 += 32) {
      const float l =
          k0 + lane < mi.num_splits ? __ldcg(lse + (k0 + lane) * kDecodeRows) : -INFINITY;
      const float wl = l == -INFINITY ? 0.0f : exp2f(l - mx);
      sum += wl;
      const int count = min(32, mi.num_splits - k0);  // uniform over the warp
      const float* src =
          partial_out + ((int64_t{mi.first_partial} + k0) * kDecodeRows + r) * D + lane * kPer;
#pragma unroll kUnroll
      for (int j = 0; j < count; ++j) {
        const float w = __shfl_sync(0xffffffffu, wl, j);
        float v[kPer];
        if constexpr (kPer == 4) {
          const float4 x =
              __ldcg(reinterpret_cast<const float4*>(src + int64_t{j} * kDecodeRows * D));
          v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
        } else {
          const float2 x =
              __ldcg(reinterpret_cast<const float2*>(src + int64_t{j} * kDecodeRows * D));
          v[0] = x.x, v[1] = x.y;
        }
#pragma unroll
        for (int d = 0; d < kPer; ++d) acc[d] += w * v[d];
      }
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    const int packed = mi.row_begin + r;
    const int64_t token = mi.token_begin + packed / group;
    const int head = mi.kv_head * group + packed % group;
    auto* dst = reinterpret_cast<uint32_t*>(static_cast<__nv_bfloat16*>(a.out) +
                                            (token * a.num_q_heads + head) * D + lane * kPer);
#pragma unroll
    for (int d = 0; d < kPer; d += 2) dst[d / 2] = PackBf16(acc[d] * inv, acc[d + 1] * inv);
  }
}

// After a split's partial rows are written: counts the arrival; the last split's CTA combines.
template <int D, int kCombineThreads>
__device__ void ArriveAndMaybeCombine(const PagedAttentionArgs& a, const AttentionWorkItem& it,
                                      const AttentionMergeItem* merges, int32_t* counters,
                                      const float* partial_out, const float* partial_lse) {
  __shared__ int last;
  __threadfence();  // this CTA's partial rows are visible device-wide before the arrival
  __syncthreads();
  if (threadIdx.x == 0) {
    const AttentionMergeItem& mi = merges[it.merge];
    last = atomicAdd(counters + it.merge, 1) == mi.num_splits - 1;
    if (last) counters[it.merge] = 0;  // every split has arrived: ready for the next launch
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  CombineSplits<D, kCombineThreads>(a, merges[it.merge], partial_out, partial_lse);
}

}  // namespace tandem::attention
