// The split-KV merge of the decode kernel (paged_attention.cu), run inside the decode kernel by
// the CTA whose split of a merge item finishes last (attention_plan.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/paged_attention/attention_plan.h"
#include "kernels/paged_attention/attention_tile.cuh"
#include "kernels/paged_attention/paged_attention.h"

namespace tandem::attention {

// The D / 32 partial values of one lane (dims lane * kPer ..), bf16, read from shared memory.
template <int kPer>
struct PartialVec;
template <>
struct PartialVec<4> {
  uint2 bits;
  __device__ __forceinline__ void Load(const uint16_t* p) {
    bits = *reinterpret_cast<const uint2*>(p);
  }
  __device__ __forceinline__ void Fma(float w, float (&acc)[4]) const {
    const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits.x));
    const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits.y));
    acc[0] += w * lo.x, acc[1] += w * lo.y, acc[2] += w * hi.x, acc[3] += w * hi.y;
  }
};
template <>
struct PartialVec<2> {
  uint32_t bits;
  __device__ __forceinline__ void Load(const uint16_t* p) {
    bits = *reinterpret_cast<const unsigned int*>(p);
  }
  __device__ __forceinline__ void Fma(float w, float (&acc)[2]) const {
    const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits));
    acc[0] += w * v.x, acc[1] += w * v.y;
  }
};

constexpr int kCombineBatch = 32;  // splits per round: one per lane

// Shared memory CombineSplits stages partial rows in: [warps][kBatch][D] bf16.
template <int D, int kCombineThreads, int kBatch = kCombineBatch>
constexpr int CombineStageBytes() {
  return kCombineThreads / 32 * kBatch * D * static_cast<int>(sizeof(uint16_t));
}

// Combines the splits of one merge item (run by the CTA whose split finished last): for each
// row, out = sum_k w_k O_k / sum_k w_k with w_k = 2^(lse_k - max lse). One warp per row (the
// rows of a GQA group in parallel). Splits are taken kBatch (<= 32) at a time: lane j reads the
// log-sum of split k0 + j while the warp copies the kBatch partial rows into its part of `stage`
// (cp.async, one round trip per 32 splits: all of them at batch 1 L = 8k; the stream kernel,
// stream_decode.cu, takes 8 at a time in its smaller merge buffer); then every lane sums its D
// / 32 dims over the rows in a rolled loop, and a running maximum rescales what was summed before
// (the online-softmax update), so the weights need no earlier pass over the log-sums. The loops are
// rolled because this code runs once per merge, on whichever SM arrives last, from a cold
// instruction cache: fully unrolled (~500 instructions) it waited on instruction fetch for most
// of its ~2 us (WORKLOG.md step 9). The partial rows are bf16 (as vLLM's split-KV partials): one
// SM pulls every split's rows, and bf16 halves them. The copies bypass L1 (cp.async.cg): other
// CTAs wrote the partials, and L1 is not coherent.
template <int D, int kCombineThreads, int kBatch = kCombineBatch>
__device__ void CombineSplits(const PagedAttentionArgs& a, const AttentionMergeItem& mi,
                              const uint16_t* partial_out, const float* partial_lse,
                              uint16_t* stage) {
  constexpr int kWarps = kCombineThreads / 32;
  constexpr int kPer = D / 32;            // dims per lane
  constexpr int kRowChunks = D * 2 / 16;  // 16-byte chunks per partial row
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int group = a.num_q_heads / a.num_kv_heads;
  static_assert(kBatch >= 1 && kBatch <= 32, "one split per lane");
  uint16_t* rows = stage + warp * kBatch * D;  // this warp's [kBatch][D]
  for (int r = warp; r < mi.num_rows; r += kWarps) {
    const float* lse = partial_lse + int64_t{mi.first_partial} * kDecodeRows + r;
    float acc[kPer] = {};
    float sum = 0.0f, mx = -INFINITY;
    for (int k0 = 0; k0 < mi.num_splits; k0 += kBatch) {
      const int count = min(kBatch, mi.num_splits - k0);  // uniform over the warp
      const uint16_t* src = partial_out + ((int64_t{mi.first_partial} + k0) * kDecodeRows + r) * D;
      __syncwarp();  // the previous round's reads of `rows` are done
      for (int c = lane; c < count * kRowChunks; c += 32) {
        const int j = c / kRowChunks, part = c % kRowChunks;
        CpAsync16(rows + j * D + part * 8, src + int64_t{j} * kDecodeRows * D + part * 8, true);
      }
      CpAsyncCommit();
      const float l = lane < count ? __ldcg(lse + (k0 + lane) * kDecodeRows) : -INFINITY;
      float m_new = l;
      for (int o = 16; o > 0; o >>= 1) m_new = fmaxf(m_new, __shfl_xor_sync(0xffffffffu, m_new, o));
      m_new = fmaxf(m_new, mx);
      CpAsyncWait<0>();
      __syncwarp();                      // every lane's copies are in `rows`
      if (m_new == -INFINITY) continue;  // no split so far has seen a key
      const float rescale = mx == -INFINITY ? 0.0f : exp2f(mx - m_new);
      mx = m_new;
      sum *= rescale;
#pragma unroll
      for (int d = 0; d < kPer; ++d) acc[d] *= rescale;
      const float wl = l == -INFINITY ? 0.0f : exp2f(l - mx);
      sum += wl;
#pragma unroll 4
      for (int j = 0; j < count; ++j) {
        PartialVec<kPer> v;
        v.Load(rows + j * D + lane * kPer);
        v.Fma(__shfl_sync(0xffffffffu, wl, j), acc);
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

// Counts a split's arrival after its partial rows are written; true (in every thread) in the
// CTA of the last split, which then combines. One thread bumps the counter with a gpu-scope
// acq_rel atomic: the barrier before it orders the other threads' partial stores before its
// release, and its acquire orders the last CTA's reads (after the second barrier) after every
// other split's release — one fence.acq_rel instead of two fence.sc (__threadfence) around a
// relaxed atomic. The last CTA resets the counter for the next launch (kernel boundaries order
// it before the next launch's atomics).
__device__ __forceinline__ bool ArriveLast(int32_t* counter, int num_splits) {
  __shared__ int last;
  __syncthreads();
  if (threadIdx.x == 0) {
    int prev;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;\n"
                 : "=r"(prev)
                 : "l"(counter)
                 : "memory");
    last = prev == num_splits - 1;
    if (last) *counter = 0;
  }
  __syncthreads();
  return last;
}

}  // namespace tandem::attention
