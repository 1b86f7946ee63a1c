// Exact top-k / top-p key thresholds for the cluster sampling kernel, run by rank 0 of a cluster
// (one CTA of kThreads) over a view: the candidates, or the whole row. Counts and fixed-point
// masses are integers, so the thresholds do not depend on thread order.
#pragma once

#include <cstdint>

#include "kernels/sampling/sampling_cluster.cuh"

namespace tandem::sampling_cluster {

using sampling_internal::AtomicAddSplit64;
using sampling_internal::Split64;

// The bits shared by every key >= tau_min in the view: the radix select starts below them.
// Returns the shift of the first 8-bit digit that differs (24 when none is shared).
template <typename View>
__device__ int FirstDigitShift(ClusterShared& s, const View& view, uint32_t tau_min,
                               uint32_t* common) {
  if (threadIdx.x == 0) s.key_and = 0xffffffffu, s.key_or = 0;
  __syncthreads();
  uint32_t k_and = 0xffffffffu, k_or = 0;
  view.ForEach(s, [&](float x) {
    const uint32_t key = KeyOf(x);
    if (key >= tau_min) k_and &= key, k_or |= key;
  });
  k_and = __reduce_and_sync(0xffffffffu, k_and);
  k_or = __reduce_or_sync(0xffffffffu, k_or);
  if (threadIdx.x % 32 == 0) atomicAnd(&s.key_and, k_and), atomicOr(&s.key_or, k_or);
  __syncthreads();
  const uint32_t diff = s.key_and ^ s.key_or;
  *common = s.key_and;
  __syncthreads();
  if (s.key_and > s.key_or) return 24;  // nothing >= tau_min
  const int top = diff == 0 ? 0 : 31 - __clz(diff);
  return (top / 8) * 8;
}

// Largest key tau such that the elements with key >= tau (and key >= tau_min) hold at least
// `remaining` (count, or fixed-point mass when kMass). 8-bit digits, most significant first
// (those every element shares are skipped), each round a 256-bin histogram over the elements
// matching the digits found so far. Returns tau_min when even all elements fall short (rounding
// at the edge of the top-p search).
template <bool kMass, typename View>
__device__ uint32_t RadixSelect(ClusterShared& s, const RowMath& row, const View& view,
                                uint32_t tau_min, uint64_t remaining) {
  uint32_t common = 0;
  const int first_shift = FirstDigitShift(s, view, tau_min, &common);
  uint32_t prefix = first_shift == 24 ? 0u : common & (0xffffffffu << (first_shift + 8));
  for (int shift = first_shift; shift >= 0; shift -= 8) {
    if (threadIdx.x < kRadixBins) {
      s.a.radix.lo[threadIdx.x] = 0, s.a.radix.hi[threadIdx.x] = 0;
      s.a.radix.count[threadIdx.x] = 0;
    }
    __syncthreads();
    const uint32_t hi_mask = shift == 24 ? 0u : (0xffffffffu << (shift + 8));
    view.ForEach(s, [&](float x) {
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
    __syncthreads();
    if (threadIdx.x < 32) {
      const int lane = threadIdx.x;
      uint64_t bins[8], lane_sum = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int d = 255 - 8 * lane - j;
        lane_sum += bins[j] =
            kMass ? Split64(s.a.radix.lo[d], s.a.radix.hi[d]) : s.a.radix.count[d];
      }
      uint64_t incl = lane_sum;
#pragma unroll
      for (int off = 1; off < 32; off *= 2) {
        const uint64_t y = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += y;
      }
      const uint32_t hits = __ballot_sync(0xffffffffu, incl >= remaining);
      if (lane == 0) s.found = hits != 0;
      if (hits != 0 && lane == __ffs(hits) - 1) {
        uint64_t rest = remaining - (incl - lane_sum);
        for (int j = 0; j < 8; ++j) {
          if (bins[j] >= rest) {
            s.digit = 255 - 8 * lane - j;
            s.remaining = rest;
            break;
          }
          rest -= bins[j];
        }
      }
    }
    __syncthreads();
    if (!s.found) return tau_min;  // uniform: every thread reads the same flag
    prefix |= s.digit << shift;
    remaining = s.remaining;
    __syncthreads();
  }
  return prefix;
}

// Fixed-point mass of the elements with key >= tau.
template <typename View>
__device__ uint64_t MassAbove(ClusterShared& s, const RowMath& row, const View& view,
                              uint32_t tau) {
  uint64_t sum = 0;
  view.ForEach(s, [&](float x) {
    if (KeyOf(x) >= tau) sum += row.Weight(x);
  });
  return sampling_internal::BlockSum<kWarps>(sum, s.scratch);
}

// Exact top-k then top-p key thresholds over `view`, which holds every element of the bins that
// may hold a threshold (with top-k, every element from the first such bin to the top-k bin); the
// elements above the view number cnt_sure with mass mass_sure; z is the row's total mass (used
// without top-k). Returns tau: kept <=> key >= tau. (The semantics of sampling.h, as the
// one-block-per-row kernel computes them.)
template <typename View>
__device__ uint32_t SelectThresholds(ClusterShared& s, const RowMath& row, const View& view,
                                     uint64_t cnt_sure, uint64_t mass_sure, uint64_t z, int64_t k,
                                     bool filter_k, float top_p, bool filter_p) {
  uint32_t tau_k = 0;
  if (filter_k) {
    const int64_t want = k - static_cast<int64_t>(cnt_sure);
    tau_k = RadixSelect<false>(s, row, view, 0, want > 0 ? want : 1);
  }
  if (!filter_p) return tau_k;
  const uint64_t z_k = filter_k ? mass_sure + MassAbove(s, row, view, tau_k) : z;
  // HF keeps the smallest prefix with mass >= top_p * z_k: integer mass >= ceil(top_p * z_k).
  const double need =
      ceil(static_cast<double>(top_p) * static_cast<double>(z_k)) - static_cast<double>(mass_sure);
  const uint64_t remaining = need >= 1.0 ? static_cast<uint64_t>(need) : 1;
  const uint32_t tau_p = RadixSelect<true>(s, row, view, tau_k, remaining);
  return tau_p > tau_k ? tau_p : tau_k;
}

}  // namespace tandem::sampling_cluster
