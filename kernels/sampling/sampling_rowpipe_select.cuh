// The row-pipelined sampling kernel's exact radix select over candidates held in shared memory
// (by count: the top-k key; by fixed-point mass: the top-p key), and its top-k rows: a running
// threshold, the appends of the logits at or above it, the cuts that raise it, and the tail that
// samples the top-k set (sampling_rowpipe.cu's header says how).
#pragma once

#include <cstdint>

#include "kernels/sampling/sampling_draw.cuh"
#include "kernels/sampling/sampling_rng.h"
#include "kernels/sampling/sampling_rowpipe_ring.cuh"

namespace tandem::sampling_rowpipe {

// The candidates' smallest and largest keys, from each warp's (lo, hi) in s.warp_lo / warp_hi
// (after a barrier).
__device__ __forceinline__ void WarpKeyRange(PipeShared& s, const float* xs, uint32_t n) {
  uint32_t lo = ~0u, hi = 0;
  for (uint32_t i = threadIdx.x; i < n; i += kThreads) {
    const uint32_t key = KeyOf(xs[i]);
    lo = min(lo, key), hi = max(hi, key);
  }
  lo = __reduce_min_sync(0xffffffffu, lo), hi = __reduce_max_sync(0xffffffffu, hi);
  if (threadIdx.x % 32 == 0) s.warp_lo[threadIdx.x / 32] = lo, s.warp_hi[threadIdx.x / 32] = hi;
}

// The largest key kappa among the n logits xs whose (count, or with kMass fixed-point mass) of
// keys >= kappa reaches rest (the exact k-th largest key, ties counted, for a count of k; the
// smallest key top-p keeps for a mass), in every thread. Radix rounds over d = key - (the smallest
// key), at most 8 bits each from the top bit of the largest d down. Digits of d rather than of
// the key: candidates are the top of a row, so their keys share their high bits, and a histogram
// of the key's top byte would put them all in one bin (one shared-memory address for every
// atomic; WORKLOG.md, session 7, step 15b). rest must be >= 1 and at most the total.
// These are its radix rounds, after WarpKeyRange and a barrier; SelectKey does both.
template <bool kMass>
__device__ uint32_t SelectKeyInRange(PipeShared& s, const float* xs, uint32_t n, uint64_t rest,
                                     const RowMath& row) {
  const int lane = threadIdx.x % 32;
  uint32_t lo = ~0u, hi = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) lo = min(lo, s.warp_lo[w]), hi = max(hi, s.warp_hi[w]);
  uint32_t prefix = 0;  // the chosen high bits of d (from bit `top` up)
  for (int top = 32 - __clz(hi - lo); top > 0;) {
    const int shift = top > 8 ? top - 8 : 0;
    const uint32_t bins = 1u << (top - shift);
    s.hist[threadIdx.x] = 0;
    if (kMass) s.hist_hi[threadIdx.x] = 0;
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < n; i += kThreads) {
      const float x = xs[i];
      const uint32_t d = KeyOf(x) - lo;
      const uint32_t high = top == 32 ? 0u : d >> top;
      if (high == (top == 32 ? 0u : prefix >> top)) {
        const uint32_t digit = (d >> shift) & (bins - 1);
        if constexpr (kMass) {
          const uint64_t w = row.Weight(x);
          if (w != 0) sampling_internal::AtomicAddSplit64(&s.hist[digit], &s.hist_hi[digit], w);
        } else {
          atomicAdd(&s.hist[digit], 1u);
        }
      }
    }
    __syncthreads();
    if (threadIdx.x < 32) {  // digits from the top: lane l holds 255 - 8l - j
      uint64_t v[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int digit = 255 - 8 * lane - j;
        v[j] = kMass ? sampling_internal::Split64(s.hist[digit], s.hist_hi[digit]) : s.hist[digit];
      }
      const sampling_internal::WarpPick p = sampling_internal::WarpFirstReaching<8>(v, rest);
      if (lane == 0) {
        const uint32_t digit = p.index < 0 ? 0u : 255u - static_cast<uint32_t>(p.index);
        s.sel_prefix = prefix | digit << shift;
        s.sel_rest = p.index < 0 ? 1u : p.rest;
      }
    }
    __syncthreads();
    prefix = s.sel_prefix, rest = s.sel_rest, top = shift;
  }
  return lo + prefix;
}

// SelectKeyInRange with its key range (top-k cuts; the top-p tail fuses the range into its
// mass reduction).
template <bool kMass>
__device__ uint32_t SelectKey(PipeShared& s, const float* xs, uint32_t n, uint64_t rest,
                              const RowMath& row) {
  WarpKeyRange(s, xs, n);
  __syncthreads();
  return SelectKeyInRange<kMass>(s, xs, n, rest, row);
}

// All threads: keeps the candidates >= the k-th largest (ties kept) and raises theta to it;
// flags an overflow when they stay above the trigger (ties) or, streaming (not the row's last
// select), when the row has had kMaxCuts. Ends with a block barrier.
__device__ void CutCandidates(PipeShared& s, uint32_t k, bool streaming) {
  const uint32_t n = s.count;
  const uint32_t kth = SelectKey<false>(s, s.u.cand.x, n, k, RowMath{});
  float x[kCandPerThread];
  int32_t id[kCandPerThread];
#pragma unroll
  for (int j = 0; j < kCandPerThread; ++j) {
    const uint32_t i = j * kThreads + threadIdx.x;
    x[j] = i < n ? s.u.cand.x[i] : -INFINITY;
    id[j] = i < n ? s.u.cand.id[i] : -1;
  }
  __syncthreads();
  if (threadIdx.x == 0) s.count = 0;
  __syncthreads();
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < kCandPerThread; ++j) {
    const bool keep = id[j] >= 0 && KeyOf(x[j]) >= kth;
    const uint32_t mask = __ballot_sync(0xffffffffu, keep);
    if (mask == 0) continue;
    uint32_t base = 0;
    if (lane == __ffs(mask) - 1) base = atomicAdd(&s.count, __popc(mask));
    base = __shfl_sync(0xffffffffu, base, __ffs(mask) - 1);
    if (keep) {
      const uint32_t slot = base + __popc(mask & ((1u << lane) - 1));
      s.u.cand.x[slot] = x[j], s.u.cand.id[slot] = id[j];
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    s.theta = KeyToFloat(kth);
    // No more appends once the candidates stay above the trigger or the row has had its selects.
    if (s.count > kCandTrigger || (streaming && ++s.cuts > kMaxCuts)) s.overflow = 1, s.theta = NAN;
  }
  __syncthreads();
}

// Reserves `mine` slots for this lane from *count on, the warp's slots in lane order (one shared
// atomic per warp: an inclusive scan over the lanes places them): the lane's first in *first,
// where the warp's end in *end (unless end is null). False, with no atomic, when no lane of the
// warp has any. Every lane of the warp calls it; both candidate appends use it (here and
// sampling_rowpipe_topp.cuh).
__device__ __forceinline__ bool ReserveWarpSlots(uint32_t* count, uint32_t mine, uint32_t* first,
                                                 uint32_t* end) {
  if (!__any_sync(0xffffffffu, mine != 0)) return false;
  const uint32_t incl = sampling_internal::WarpInclusiveScan(mine);
  uint32_t base = 0;
  if (threadIdx.x % 32 == 31) base = atomicAdd(count, incl);
  base = __shfl_sync(0xffffffffu, base, 31);
  *first = base + incl - mine;
  if (end != nullptr) *end = base + __shfl_sync(0xffffffffu, incl, 31);
  return true;
}

// Top-k candidates: appends the lane's logits flagged in want (bit 4j + e: logit e of q[j], whose
// id is first + local[j] + e) at the slots from *count on (one shared atomic per warp: a prefix
// over the lanes places them); the caller guarantees room (at most kChunk after at most
// kCandTrigger). Returns where the warp's appends end (0 if the warp has none). All 16 bits are
// tested, unrolled: a row's first chunks append most of their logits, and the one-bit-at-a-time
// loop of AppendTopPCandidates made the top-k rows slower (WORKLOG.md, session 11, run W3).
__device__ __forceinline__ uint32_t AppendFlagged(uint32_t* count, float* xs, int32_t* ids,
                                                  const float (&q)[kPerWarp][4],
                                                  const int (&local)[kPerWarp], int32_t first,
                                                  uint32_t want) {
  uint32_t slot, end;
  if (!ReserveWarpSlots(count, __popc(want), &slot, &end)) return 0;  // uniform
#pragma unroll
  for (int j = 0; j < kPerWarp; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (want >> (4 * j + e) & 1u) {
        xs[slot] = q[j][e], ids[slot] = first + local[j] + e;
        ++slot;
      }
    }
  }
  return end;
}

// Appends this warp's logits >= theta of the chunk to the candidates. Returns where the warp's
// appends end (0 if none): the largest over the warps is the new count, so a barrier that ORs
// "end > trigger" decides the select uniformly (reading the count after the barrier would race
// with the next chunk's appends).
__device__ __forceinline__ uint32_t TopKChunk(PipeShared& s, const ChunkView& c) {
  const float theta = s.theta;
  float q[kPerWarp][4];
  int local[kPerWarp];
  uint32_t want = 0;  // bit 4j + e: logit e of the lane's j-th float4 (-inf beyond the row)
#pragma unroll
  for (int j = 0; j < kPerWarp; ++j) {
    local[j] = c.Load(j, q[j]);
#pragma unroll
    for (int e = 0; e < 4; ++e)
      want |= (local[j] < c.n && q[j][e] >= theta ? 1u : 0u) << (4 * j + e);
  }
  return AppendFlagged(&s.count, s.u.cand.x, s.u.cand.id, q, local, c.first, want);
}

// Top-k row, after its chunks: the exact top-k set, weights, top-p, the draw in id order.
__device__ int32_t TopKTail(PipeShared& s, const SamplingArgs& args, int64_t r) {
  const uint32_t k = static_cast<uint32_t>(args.top_k[r]);
  if (s.overflow == 0 && s.count > k) CutCandidates(s, k, /*streaming=*/false);
  const uint32_t m = s.count;
  if (s.overflow != 0 || m > kKeptCap) return kFallbackToken;  // uniform
  float mx = -INFINITY;
  for (uint32_t i = threadIdx.x; i < m; i += kThreads) mx = fmaxf(mx, s.u.cand.x[i]);
  mx = sampling_internal::BlockArgMax<kWarps>(ArgMaxPair{mx, 0}, s.argmax_scratch).value;
  if (mx == -INFINITY) return kFallbackToken;  // every logit -inf or NaN: the resident kernel
  const float scale = kSamplingLog2e / args.temperature[r];
  uint64_t mine = 0;
  for (uint32_t i = threadIdx.x; i < m; i += kThreads) {
    const uint64_t w = RowMath::Fixed(exp2f((s.u.cand.x[i] - mx) * scale));
    s.u.cand.w[i] = w;
    mine += w;
  }
  const uint64_t z = sampling_internal::BlockSum<kWarps>(mine, s.scratch);  // publishes w
  const float top_p = args.top_p[r];
  if (top_p < 1.0f) {
    sampling_internal::ApplyTopPToKept<kThreads, kKeptCap>(s.u.cand.x, s.u.cand.w, m, z, top_p);
  }
  if (threadIdx.x == 0) s.token = kFallbackToken;
  __syncthreads();
  sampling_internal::DrawKeptById<kThreads>(s.u.cand.id, s.u.cand.w, m,
                                            SamplingUniformImpl(args.seeds[r], args.steps[r]),
                                            s.scratch, &s.token);
  return s.token;
}

}  // namespace tandem::sampling_rowpipe
