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
// rows of a GQA group in parallel). Splits are taken kBatch at a time: lane j reads the log-sum
// of split k0 + j while every lane reads its D / 32 dims of all kBatch partial rows (independent
// loads, one round trip per batch; kBatch * D / 32 registers), and the running maximum rescales
// what was summed before (the online-softmax update), so the weights need no earlier pass over
// the log-sums.
// Partials are read with ld.global.cg: other CTAs wrote them, and L1 is not coherent.
template <int D, int kCombineThreads>
__device__ void CombineSplits(const PagedAttentionArgs& a, const AttentionMergeItem& mi,
                              const float* partial_out, const float* partial_lse) {
  constexpr int kWarps = kCombineThreads / 32;
  constexpr int kPer = D / 32;  // dims per lane
  constexpr int kBatch = 64 / kPer < 32 ? 64 / kPer : 32;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int group = a.num_q_heads / a.num_kv_heads;
  for (int r = warp; r < mi.num_rows; r += kWarps) {
    const float* lse = partial_lse + int64_t{mi.first_partial} * kDecodeRows + r;
    float acc[kPer] = {};
    float sum = 0.0f, mx = -INFINITY;
    for (int k0 = 0; k0 < mi.num_splits; k0 += kBatch) {
      const int count = min(kBatch, mi.num_splits - k0);  // uniform over the warp
      const float l = lane < count ? __ldcg(lse + (k0 + lane) * kDecodeRows) : -INFINITY;
      const float* src =
          partial_out + ((int64_t{mi.first_partial} + k0) * kDecodeRows + r) * D + lane * kPer;
      float v[kBatch][kPer];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        if (j < count) {
          if constexpr (kPer == 4) {
            const float4 x =
                __ldcg(reinterpret_cast<const float4*>(src + int64_t{j} * kDecodeRows * D));
            v[j][0] = x.x, v[j][1] = x.y, v[j][2] = x.z, v[j][3] = x.w;
          } else {
            const float2 x =
                __ldcg(reinterpret_cast<const float2*>(src + int64_t{j} * kDecodeRows * D));
            v[j][0] = x.x, v[j][1] = x.y;
          }
        }
      }
      float m_new = l;
      for (int o = 16; o > 0; o >>= 1) m_new = fmaxf(m_new, __shfl_xor_sync(0xffffffffu, m_new, o));
      m_new = fmaxf(m_new, mx);
      if (m_new == -INFINITY) continue;  // no split so far has seen a key
      const float rescale = mx == -INFINITY ? 0.0f : exp2f(mx - m_new);
      mx = m_new;
      sum *= rescale;
#pragma unroll
      for (int d = 0; d < kPer; ++d) acc[d] *= rescale;
      const float wl = l == -INFINITY ? 0.0f : exp2f(l - mx);
      sum += wl;
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const float w = __shfl_sync(0xffffffffu, wl, j);
        if (j < count) {
#pragma unroll
          for (int d = 0; d < kPer; ++d) acc[d] += w * v[j][d];
        }
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
// `mi` is the split's merge item, read by the caller ahead of time. Thread 0's fence after the
// barrier publishes the whole CTA's partial rows (the barrier orders the other threads' stores
// before it, and the fence is cumulative); the last CTA's fence orders its reads after every
// other split's arrival.
template <int D, int kCombineThreads>
__device__ void ArriveAndMaybeCombine(const PagedAttentionArgs& a, const AttentionWorkItem& it,
                                      const AttentionMergeItem& mi, int32_t* counters,
                                      const float* partial_out, const float* partial_lse) {
  __shared__ int last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(counters + it.merge, 1) == mi.num_splits - 1;
    if (last) counters[it.merge] = 0;  // every split has arrived: ready for the next launch
    __threadfence();
  }
  __syncthreads();
  if (!last) return;
  CombineSplits<D, kCombineThreads>(a, mi, partial_out, partial_lse);
}

}  // namespace tandem::attention
