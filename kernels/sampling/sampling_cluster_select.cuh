// Exact top-k / top-p key thresholds for the cluster sampling kernel, run by rank 0 of a cluster
// over a view: the candidates, or the whole row. kGroup threads take part: 32 (warp 0 alone, no
// block barriers: few candidates) or kThreads. Counts and fixed-point masses are integers, so the
// thresholds do not depend on thread order.
#pragma once

#include <cstdint>

#include "kernels/sampling/sampling_cluster.cuh"

namespace tandem::sampling_cluster {

using sampling_internal::AtomicAddSplit64;
using sampling_internal::Split64;

template <int kGroup>
__device__ __forceinline__ void GroupSync() {
  if constexpr (kGroup == 32) {
    __syncwarp();
  } else {
    __syncthreads();
  }
}

// The bits shared by every key >= tau_min in the view: the radix select starts below them.
// Returns the shift of the first 8-bit digit that differs (24 when none is shared).
template <int kGroup, typename View>
__device__ int FirstDigitShift(ClusterShared& s, const View& view, uint32_t tau_min,
                               uint32_t* common) {
  uint32_t k_and = 0xffffffffu, k_or = 0;
  view.template ForEach<kGroup>(s, [&](float x) {
    const uint32_t key = KeyOf(x);
    if (key >= tau_min) k_and &= key, k_or |= key;
  });
  k_and = __reduce_and_sync(0xffffffffu, k_and);
  k_or = __reduce_or_sync(0xffffffffu, k_or);
  if constexpr (kGroup != 32) {
    if (threadIdx.x == 0) s.key_and = 0xffffffffu, s.key_or = 0;
    __syncthreads();
    if (threadIdx.x % 32 == 0) atomicAnd(&s.key_and, k_and), atomicOr(&s.key_or, k_or);
    __syncthreads();
    k_and = s.key_and, k_or = s.key_or;
    __syncthreads();
  }
  *common = k_and;
  if (k_and > k_or) return 24;  // nothing >= tau_min
  const uint32_t diff = k_and ^ k_or;
  const int top = diff == 0 ? 0 : 31 - __clz(diff);
  return (top / 8) * 8;
}

// Largest key tau such that the elements with key >= tau (and key >= tau_min) hold at least
// `remaining` (count, or fixed-point mass when kMass). 8-bit digits, most significant first
// (those every element shares are skipped), each round a 256-bin histogram over the elements
// matching the digits found so far. Returns tau_min when even all elements fall short (rounding
// at the edge of the top-p search).
template <bool kMass, int kGroup, typename View>
__device__ uint32_t RadixSelect(ClusterShared& s, const RowMath& row, const View& view,
                                uint32_t tau_min, uint64_t remaining) {
  uint32_t common = 0;
  const int first_shift = FirstDigitShift<kGroup>(s, view, tau_min, &common);
  uint32_t prefix = first_shift == 24 ? 0u : common & (0xffffffffu << (first_shift + 8));
  for (int shift = first_shift; shift >= 0; shift -= 8) {
    for (int d = threadIdx.x; d < kRadixBins; d += kGroup) {
      s.a.radix.lo[d] = 0, s.a.radix.hi[d] = 0, s.a.radix.count[d] = 0;
    }
    GroupSync<kGroup>();
    const uint32_t hi_mask = shift == 24 ? 0u : (0xffffffffu << (shift + 8));
    view.template ForEach<kGroup>(s, [&](float x) {
      const uint32_t key = KeyOf(x);
      if ((key & hi_mask) != (prefix & hi_mask) || key < tau_min) return;
      const int digit = (key >> shift) & 255;
      if constexpr (kMass) {
        const uint64_t w = row.Weight(x);
        if (w != 0) AtomicAddSplit64(&s.a.radix.lo[digit], &s.a.radix.hi[digit], w);
      } else {
        atomicAdd(&s.a.radix.count[digit], 1u);
      }
    });
    GroupSync<kGroup>();
    if (threadIdx.x < 32) {  // the digit, from the largest down: bins in descending order
      uint64_t bins[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int d = 255 - 8 * static_cast<int>(threadIdx.x) - j;
        bins[j] = kMass ? Split64(s.a.radix.lo[d], s.a.radix.hi[d]) : s.a.radix.count[d];
      }
      const sampling_internal::WarpPick pick =
          sampling_internal::WarpFirstReaching(bins, remaining);
      if (threadIdx.x == 0) {
        s.found = pick.index >= 0;
        if (pick.index >= 0) s.digit = 255 - pick.index, s.remaining = pick.rest;
      }
    }
    GroupSync<kGroup>();
    if (!s.found) return tau_min;  // uniform: every thread reads the same flag
    prefix |= s.digit << shift;
    remaining = s.remaining;
    GroupSync<kGroup>();
  }
  return prefix;
}

// Fixed-point mass of the elements with key >= tau.
template <int kGroup, typename View>
__device__ uint64_t MassAbove(ClusterShared& s, const RowMath& row, const View& view,
                              uint32_t tau) {
  uint64_t sum = 0;
  view.template ForEach<kGroup>(s, [&](float x) {
    if (KeyOf(x) >= tau) sum += row.Weight(x);
  });
  if constexpr (kGroup == 32) {
    return sampling_internal::WarpSum(sum);
  } else {
    return sampling_internal::BlockSum<kWarps>(sum, s.scratch);
  }
}

// Exact top-k then top-p key thresholds over `view`, which holds every element of the bins that
// may hold a threshold (with top-k, every element from the first such bin to the top-k bin); the
// elements above the view number cnt_sure with mass mass_sure; z is the row's total mass (used
// without top-k). Returns tau: kept <=> key >= tau. (The semantics of sampling.h, as the
// one-block-per-row kernel computes them.)
template <int kGroup, typename View>
__device__ uint32_t SelectThresholds(ClusterShared& s, const RowMath& row, const View& view,
                                     uint64_t cnt_sure, uint64_t mass_sure, uint64_t z, int64_t k,
                                     bool filter_k, float top_p, bool filter_p) {
  uint32_t tau_k = 0;
  if (filter_k) {
    const int64_t want = k - static_cast<int64_t>(cnt_sure);
    tau_k = RadixSelect<false, kGroup>(s, row, view, 0, want > 0 ? want : 1);
  }
  if (!filter_p) return tau_k;
  const uint64_t z_k = filter_k ? mass_sure + MassAbove<kGroup>(s, row, view, tau_k) : z;
  // HF keeps the smallest prefix with mass >= top_p * z_k: integer mass >= ceil(top_p * z_k).
  const double need =
      ceil(static_cast<double>(top_p) * static_cast<double>(z_k)) - static_cast<double>(mass_sure);
  const uint64_t remaining = need >= 1.0 ? static_cast<uint64_t>(need) : 1;
  const uint32_t tau_p = RadixSelect<true, kGroup>(s, row, view, tau_k, remaining);
  return tau_p > tau_k ? tau_p : tau_k;
}

// Rank 0 (all threads), after the histogram barrier of a row with top-k: pulls every CTA's counts
// (16-byte DSMEM loads; thread t < kBins / 4 owns bins 4t..4t+3), then brackets the thresholds to
// the candidate bins [b_lo, b_hi] with a block-wide prefix sum: every bin up to the top-k bin
// (then every kept logit is a candidate; always with top-p, whose masses are then summed over the
// candidates), or with top-k alone and many logits there, the top-k bin. Pushes [b_lo, b_hi] to
// every CTA. (Top-p-only rows: MergeRange and BracketTopP, sampling_cluster_topp.cuh.)
__device__ void MergeAndBracket(ClusterShared& s, int64_t k, bool filter_p) {
  const int t = threadIdx.x;
  uint32_t c[4] = {0, 0, 0, 0};
  if (t < kBins / 4) {
#pragma unroll 4
    for (int r = 0; r < kCluster; ++r) {
      const uint4 cv = *reinterpret_cast<const uint4*>(Peer(s.a.hist.count, r) + 4 * t);
      c[0] += cv.x, c[1] += cv.y, c[2] += cv.z, c[3] += cv.w;
    }
  }
  if (t == 0) s.bk = kBins - 1, s.cnt_bk = 0;
  uint64_t total_c = 0;
  const uint64_t cb = sampling_internal::BlockExclusiveScan<kWarps>(
      uint64_t{c[0]} + c[1] + c[2] + c[3], s.scratch, &total_c);
  // The first of this thread's bins whose inclusive prefix reaches k.
  uint64_t before = cb;
  for (int e = 0; e < 4; ++e) {
    if (before < static_cast<uint64_t>(k) && before + c[e] >= static_cast<uint64_t>(k)) {
      s.bk = 4 * t + e, s.cnt_bk = before + c[e];
      break;
    }
    before += c[e];
  }
  __syncthreads();
  const int bk = s.bk;
  const bool all_up_to_bk = filter_p || s.cnt_bk <= kDirectDrawMax;
  const int b_lo = all_up_to_bk ? 0 : bk;
  if (t == b_lo / 4) {
    const int e = b_lo % 4;
    s.cnt_sure = cb + (e > 0 ? c[0] : 0) + (e > 1 ? c[1] : 0) + (e > 2 ? c[2] : 0);
    s.mass_sure = 0;  // b_lo = 0 whenever top-p uses it
  }
  // Few logits up to the top-k bin (all the kept ones): rank 0 alone finishes the row from the
  // candidates, so the other CTAs leave it after pushing theirs.
  const int direct = s.cnt_bk <= kDirectDrawMax;
  if (t < kCluster) {
    *Peer(&s.b_lo, t) = b_lo, *Peer(&s.b_hi, t) = bk, *Peer(&s.direct, t) = direct;
  }
  __syncthreads();
}

}  // namespace tandem::sampling_cluster
