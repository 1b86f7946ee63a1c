// The row-pipelined sampling kernel's entries (128 consecutive logits): a warp's per-entry sums
// reduced across its lanes, and the draw over a row's entry masses (the entry holding u * total,
// then the draw inside it). Temperature rows and top-p rows end with it.
#pragma once

#include <cstdint>

#include "kernels/sampling/sampling_draw.cuh"
#include "kernels/sampling/sampling_rng.h"
#include "kernels/sampling/sampling_rowpipe_ring.cuh"

namespace tandem::sampling_rowpipe {

// A warp's per-lane sums of its kPerWarp entries, reduced transposed: two exchange steps leave
// each group of 8 lanes one entry, then three steps within the group (6 shuffles instead of 20).
// Lanes 0, 8, 16, 24 return the totals of entries 0, 1, 2, 3 (lane / 8).
__device__ __forceinline__ float ReduceFourEntries(const float (&sum)[kPerWarp]) {
  const int lane = threadIdx.x % 32;
  const bool hi16 = (lane & 16) != 0, hi8 = (lane & 8) != 0;
  // Lanes 16-31 keep entries 2 and 3, lanes 0-15 entries 0 and 1.
  float k0 = hi16 ? sum[2] : sum[0], k1 = hi16 ? sum[3] : sum[1];
  k0 += __shfl_xor_sync(0xffffffffu, hi16 ? sum[0] : sum[2], 16);
  k1 += __shfl_xor_sync(0xffffffffu, hi16 ? sum[1] : sum[3], 16);
  // Lanes with bit 3 set keep the second of the two.
  float mine = hi8 ? k1 : k0;
  mine += __shfl_xor_sync(0xffffffffu, hi8 ? k0 : k1, 8);
#pragma unroll
  for (int off = 4; off > 0; off /= 2) mine += __shfl_xor_sync(0xffffffffu, mine, off);
  return mine;
}

// This thread's entries' masses (entry threadIdx.x * kEntriesPerThread + j; 0 past the row's
// `entries`) from their float weights `sums` times `factor`, in fixed point; returns their sum.
__device__ __forceinline__ uint64_t EntryMasses(const float* sums, float factor, int entries,
                                                uint64_t (&mass)[kEntriesPerThread]) {
  const int e0 = threadIdx.x * kEntriesPerThread;
  uint64_t mine = 0;
#pragma unroll
  for (int j = 0; j < kEntriesPerThread; ++j) {
    mass[j] = e0 + j < entries ? RowMath::Fixed(sums[e0 + j] * factor) : 0;
    mine += mass[j];
  }
  return mine;
}

// The thread whose entries hold `target` (its masses `mass`, their sum `mine`, the masses of the
// entries before them `before`): true, with the entry and the target less the masses before it.
__device__ __forceinline__ bool FindEntry(const uint64_t (&mass)[kEntriesPerThread], uint64_t mine,
                                          uint64_t before, uint64_t target, int* entry,
                                          uint64_t* rest) {
  if (target < before || target >= before + mine) return false;
  uint64_t left = target - before;
#pragma unroll
  for (int j = 0; j < kEntriesPerThread; ++j) {
    if (left < mass[j]) {
      *entry = threadIdx.x * kEntriesPerThread + j, *rest = left;
      return true;
    }
    left -= mass[j];
  }
  return false;  // cannot happen: left < mine
}

// After a row's entry masses (mass[j]: entry threadIdx.x * kEntriesPerThread + j): the entry
// holding u * total and the draw inside it (one warp; the entry re-read, 512 bytes) over the
// logits with key >= min_key. Warp 0 returns the token (`otherwise` if the entry has no weight;
// the caller keeps the argmax). All threads; begins with a barrier.
__device__ int32_t DrawFromEntries(PipeShared& s, const SamplingArgs& args, int64_t r,
                                   const RowMath& row, const uint64_t (&mass)[kEntriesPerThread],
                                   uint32_t min_key, double u, int32_t otherwise) {
  uint64_t mine = 0;
#pragma unroll
  for (int j = 0; j < kEntriesPerThread; ++j) mine += mass[j];
  if (threadIdx.x == 0) s.draw_entry = 0, s.draw_rest = 0;  // set again by the owner
  uint64_t total = 0;
  const uint64_t before = sampling_internal::BlockExclusiveScan<kWarps>(mine, s.scratch, &total);
  if (total == 0) return otherwise;  // cannot happen: the max has weight 1
  const uint64_t target = min(static_cast<uint64_t>(u * static_cast<double>(total)), total - 1);
  int entry;
  uint64_t rest;
  if (FindEntry(mass, mine, before, target, &entry, &rest))
    s.draw_entry = entry, s.draw_rest = rest;
  __syncthreads();
  int32_t token = otherwise;
  if (threadIdx.x < 32) {
    const int64_t first = int64_t{s.draw_entry} * kEntryLen;
    const int64_t local = first + 4 * threadIdx.x;
    float q[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    if (local < args.vocab_size) {  // vocab % 4 == 0
      const float4 v =
          __ldcs(reinterpret_cast<const float4*>(args.logits + r * args.vocab_size + local));
      q[0] = v.x, q[1] = v.y, q[2] = v.z, q[3] = v.w;
#pragma unroll
      for (int e = 0; e < 4; ++e) q[e] = isnan(q[e]) || KeyOf(q[e]) < min_key ? -INFINITY : q[e];
    }
    const int32_t t =
        sampling_internal::DrawIn128(q, static_cast<int32_t>(first), row, s.draw_rest);
    if (t >= 0) token = t;
  }
  return token;
}

}  // namespace tandem::sampling_rowpipe
