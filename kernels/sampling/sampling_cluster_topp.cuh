// Top-p-only rows (temperature > 0, no top-k, top_p < 1) in the resident cluster kernel
// (sampling_cluster.cu): the histogram merge and the threshold select without rank 0's serial
// steps, which dominated such a row (kernels/sampling/WORKLOG.md, session 6: ncu put 11% of the
// kernel's warp samples at the barrier after rank 0's histogram merge and 14% at the one after its
// one-warp radix select).
//   merge: CTA c merges the bins [c * kRangeBins, (c + 1) * kRangeBins) of the cluster's exact
//     mass histograms (8 x 2 x 128 DSMEM loads instead of rank 0's 8 x 3 x 1024) into inclusive
//     prefix sums and pushes its range's total to every CTA | then every CTA finds the top-p bin
//     itself (the range from the 8 totals, the bin from that range's prefixes), identically, so
//     nothing has to be pushed back (MergeAndBracket did it with one more barrier's worth of
//     latency: its pull, scans and push all on rank 0);
//   select: rank 0, all threads: a candidate (a logit of the top-p bin) stays iff the mass of the
//     larger candidates is below what the larger bins leave to reach ceil(top_p * z) (exact
//     integer masses: the same set as the mass radix select): their masses per sub-bin of the
//     bin, a block scan to the sub-bin holding the threshold, pairs only within that sub-bin.
// Semantics unchanged: the same exact fixed-point masses, bin and threshold as MergeAndBracket and
// SelectThresholds computed for these rows.
#pragma once

#include <cstdint>

#include "kernels/sampling/sampling_cluster.cuh"

namespace tandem::sampling_cluster {

using sampling_internal::Split64;

// Every CTA, all threads, after the barrier that ends the histogram pass (masses only): merges
// this CTA's range of bins from every CTA into range_prefix and pushes the range's total into
// every CTA's range_total[rank]. The caller's cluster barrier publishes both.
__device__ void MergeRange(ClusterShared& s, int rank) {
  const int t = threadIdx.x;
  uint64_t m = 0;
  if (t < kRangeBins) {
    const int b = rank * kRangeBins + t;
#pragma unroll 4
    for (int c = 0; c < kCluster; ++c)
      m += Split64(Peer(s.a.hist.lo, c)[b], Peer(s.a.hist.hi, c)[b]);
  }
  const uint64_t incl = sampling_internal::WarpInclusiveScan(m);
  if (t < kRangeBins && t % 32 == 31) s.scratch[t / 32] = incl;
  __syncthreads();
  if (t < kRangeBins) {
    uint64_t before = 0;
    for (int w = 0; w < t / 32; ++w) before += s.scratch[w];
    s.range_prefix[t] = before + incl;
    if (t == kRangeBins - 1) {
#pragma unroll
      for (int c = 0; c < kCluster; ++c) *Peer(&s.range_total[rank], c) = before + incl;
    }
  }
}

// Every CTA, all threads, after the cluster barrier that published the ranges: the top-p bin
// (the first whose inclusive mass prefix reaches ceil(top_p * z)) into b_lo = b_hi, the mass
// before it into mass_sure, the row's mass into z. Ends with a block barrier.
__device__ void BracketTopP(ClusterShared& s, float top_p) {
  constexpr int kPerLane = kRangeBins / 32;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    uint64_t z = 0;
#pragma unroll
    for (int c = 0; c < kCluster; ++c) z += s.range_total[c];
    const double p_z = ceil(static_cast<double>(top_p) * static_cast<double>(z));
    const uint64_t need = p_z >= 1.0 ? static_cast<uint64_t>(p_z) : 1;
    // The range holding it (the last one if rounding leaves none: its last bin, as
    // MergeAndBracket), and the mass of the ranges before it.
    int range = kCluster - 1;
    uint64_t before = 0;
    for (int c = 0; c < kCluster; ++c) {
      if (before + s.range_total[c] >= need || c == kCluster - 1) {
        range = c;
        break;
      }
      before += s.range_total[c];
    }
    const uint64_t* prefix = Peer(s.range_prefix, range);
    uint64_t v[kPerLane];
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) v[j] = prefix[kPerLane * lane + j];
    const uint64_t rest = need - before;
    const uint32_t hits = __ballot_sync(0xffffffffu, v[kPerLane - 1] >= rest);
    const int owner = hits != 0 ? __ffs(hits) - 1 : 31;
    int j = kPerLane - 1;
    for (int i = kPerLane - 1; i >= 0; --i) j = v[i] >= rest ? i : j;
    // The prefix before the bin: the lane's previous value, or the last of the lane before.
    const uint64_t last_before = __shfl_up_sync(0xffffffffu, v[kPerLane - 1], 1);
    uint64_t below = lane > 0 ? last_before : 0;
#pragma unroll
    for (int i = 1; i < kPerLane; ++i) below = j == i ? v[i - 1] : below;
    const int in_range = __shfl_sync(0xffffffffu, kPerLane * lane + j, owner);
    below = __shfl_sync(0xffffffffu, below, owner);
    if (lane == 0) {
      s.b_lo = s.b_hi = range * kRangeBins + in_range;
      s.mass_sure = before + below, s.z = z, s.cnt_sure = 0, s.direct = 0;
    }
  }
  __syncthreads();
}

// The sub-bin of a candidate of bin `bin` (row.Bin(x) == bin): its distance from the max split
// into kSubBins steps within the bin, clamped (the last bin, rounding). Non-increasing in x, so
// sub-bins in ascending order hold the candidates in descending order (ties in one sub-bin).
__device__ __forceinline__ int SubBin(const RowMath& row, float x, int bin) {
  const float f = ((row.max_logit - x) * row.bin_scale - static_cast<float>(bin)) * kSubBins;
  return static_cast<int>(fminf(fmaxf(floorf(f), 0.0f), kSubBins - 1.0f));
}

// Rank 0, all threads, after the barrier that published the n <= kCandCap candidates (every logit
// of the top-p bin b_lo): tau (kept <=> key >= tau), pushed to every CTA; false (nothing pushed)
// when the sub-bin of the threshold holds more than kSubListCap candidates (ties): the caller then
// runs the radix selects. A candidate stays iff the mass of the larger ones is below `remaining`
// = ceil(top_p * z) - mass_sure (at least 1), the set whose smallest key SelectThresholds' mass
// radix select returns, found without its per-digit rounds of contended atomics:
//   the candidates' exact masses summed per sub-bin (sub-bins are ordered by logit), a block scan
//   finds the sub-bin s* where the prefix reaches `remaining` (those before it stay, those after it
//   go), and within s* a candidate stays iff the mass of the larger ones there is below what is
//   left (pairs over the few candidates of s*).
__device__ bool SelectTopPBySubBins(ClusterShared& s, const RowMath& row, uint32_t n, float top_p) {
  auto& sub = s.a.sub;
  const int t = threadIdx.x, bin = s.b_lo;
  const double need = ceil(static_cast<double>(top_p) * static_cast<double>(s.z)) -
                      static_cast<double>(s.mass_sure);
  const uint64_t remaining = need >= 1.0 ? static_cast<uint64_t>(need) : 1;
  sub.lo[t] = 0, sub.hi[t] = 0, sub.lo[t + kThreads] = 0, sub.hi[t + kThreads] = 0;
  if (t == 0) s.kept_min = 0xffffffffu, s.sub_len = 0, s.found = 0;
  __syncthreads();
  for (uint32_t i = t; i < n; i += kThreads) {
    const float x = s.cand[i];
    const uint64_t w = row.Weight(x);
    const int b = SubBin(row, x, bin);
    if (w != 0) sampling_internal::AtomicAddSplit64(&sub.lo[b], &sub.hi[b], w);
  }
  __syncthreads();
  // Thread t owns sub-bins 2t and 2t + 1.
  const uint64_t m0 = Split64(sub.lo[2 * t], sub.hi[2 * t]);
  const uint64_t m1 = Split64(sub.lo[2 * t + 1], sub.hi[2 * t + 1]);
  uint64_t total = 0;
  const uint64_t before = sampling_internal::BlockExclusiveScan<kWarps>(m0 + m1, s.scratch, &total);
  if (before < remaining && before + m0 + m1 >= remaining) {  // exactly one thread
    const bool first = before + m0 >= remaining;
    s.digit = first ? 2 * t : 2 * t + 1;
    s.remaining = remaining - (first ? before : before + m0);
    s.found = 1;
  }
  __syncthreads();
  // Without a sub-bin reaching it (cannot happen: the bin's mass reaches it) every logit stays,
  // as the radix select's tau_min.
  const int star = s.found ? static_cast<int>(s.digit) : -1;
  const uint64_t rest = s.remaining;
  uint32_t key_min = star < 0 ? 0u : 0xffffffffu;
  for (uint32_t i = t; i < n && star >= 0; i += kThreads) {
    const float x = s.cand[i];
    const int b = SubBin(row, x, bin);
    if (b < star) key_min = min(key_min, KeyOf(x));
    if (b == star) {
      const uint32_t slot = atomicAdd(&s.sub_len, 1u);
      if (slot < kSubListCap) sub.x[slot] = x, sub.w[slot] = row.Weight(x);
    }
  }
  __syncthreads();
  const uint32_t len = s.sub_len;
  if (len > static_cast<uint32_t>(kSubListCap)) return false;  // uniform
  if (static_cast<uint32_t>(t) < len) {
    const float x = sub.x[t];
    uint64_t above = 0;
#pragma unroll 1
    for (uint32_t j = 0; j < len; ++j) above += sub.x[j] > x ? sub.w[j] : 0;
    if (above < rest) key_min = min(key_min, KeyOf(x));
  }
  key_min = __reduce_min_sync(0xffffffffu, key_min);
  if (t % 32 == 0) atomicMin(&s.kept_min, key_min);
  __syncthreads();
  const uint32_t tau = s.kept_min;
  if (t < kCluster) *Peer(&s.tau, t) = tau;
  return true;
}

}  // namespace tandem::sampling_cluster
