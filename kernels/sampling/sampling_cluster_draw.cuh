// The end of a row in the resident cluster kernel (sampling_cluster.cu): kept masses per (tile,
// warp) entry and the draw inside the CTA that holds the target, or, for top-k rows with few
// candidates, rank 0's thresholds and draw straight from its candidates.
#pragma once

#include <cstdint>

#include "kernels/sampling/sampling_cluster.cuh"

namespace tandem::sampling_cluster {

// This CTA's part of a row.
struct Slice {
  const float* logits;  // the slice in global memory, n logits
  int n;                // 0 .. kSliceCap
  int32_t base;         // id of the first logit
  int rank;
};

__device__ __forceinline__ void ClusterSync() { cg::this_cluster().sync(); }

// Kept mass (key >= tau) of this thread's 4 logits of an entry: the float sum in element order,
// then fixed point (the draw recomputes it the same way).
__device__ __forceinline__ float KeptSum4(const RowMath& row, const float4 v, uint32_t tau) {
  const float q[4] = {v.x, v.y, v.z, v.w};
  float sum = 0.0f;
#pragma unroll
  for (int e = 0; e < 4; ++e) sum += KeyOf(q[e]) >= tau ? row.WeightF(q[e]) : 0.0f;
  return sum;
}

__device__ __forceinline__ float4 LoadLocal(const ClusterShared& s, const Slice& sl, int local) {
  return local < sl.n ? *reinterpret_cast<const float4*>(&s.x[local])
                      : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
}

// Exact warp sum of values < 2^43, through two 32-bit warp reductions.
__device__ __forceinline__ uint64_t WarpSum43(uint64_t m) {
  const uint32_t lo = __reduce_add_sync(0xffffffffu, static_cast<uint32_t>(m & 0x1fffffu));
  const uint32_t hi = __reduce_add_sync(0xffffffffu, static_cast<uint32_t>(m >> 21));
  return lo + (static_cast<uint64_t>(hi) << 21);
}

// Kept mass per (tile, warp) entry; pushes the CTA's total to every CTA. Ends with the barrier
// that publishes the totals.
__device__ void EntryMassPass(ClusterShared& s, const Slice& sl, const RowMath& row, uint32_t tau) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint64_t total = 0;
#pragma unroll 2
  for (int j = 0; j < kSliceTiles; ++j) {
    const int local = j * kTileElems + 4 * threadIdx.x;
    const uint64_t m = WarpSum43(RowMath::Fixed(KeptSum4(row, LoadLocal(s, sl, local), tau)));
    if (lane == 0) s.entry_mass[j * kWarps + warp] = m;
    total += m;
  }
  if (lane == 0) s.scratch[warp] = total;
  __syncthreads();
  if (threadIdx.x < kCluster) {
    uint64_t cta = 0;
    for (int w = 0; w < kWarps; ++w) cta += s.scratch[w];
    *Peer(&s.peer_total[sl.rank], threadIdx.x) = cta;
  }
  ClusterSync();
}

// Warp 0 of the CTA that holds `rest` (< its kept mass): inverse CDF in id order over the entries,
// then over the 128 logits of the entry found. Returns the token (-1 if rounding left none).
__device__ int32_t DrawInSlice(const ClusterShared& s, const Slice& sl, const RowMath& row,
                               uint32_t tau, uint64_t rest) {
  constexpr int kPerLane = kEntries / 32;
  static_assert(kEntries % 32 == 0);
  const int lane = threadIdx.x;
  const sampling_internal::WarpPick pick =
      sampling_internal::WarpFindInterval<kPerLane>(s.entry_mass, rest);
  if (pick.index < 0) return -1;
  const int entry = pick.index;
  const uint64_t in_entry = pick.rest;
  // The entry's 128 logits: 4 per lane, as EntryMassPass summed them.
  const int local = (entry / kWarps) * kTileElems + (entry % kWarps) * 128 + 4 * lane;
  const float4 v = LoadLocal(s, sl, local);
  const uint64_t m = RowMath::Fixed(KeptSum4(row, v, tau));
  const uint64_t excl = sampling_internal::WarpInclusiveScan(m) - m;
  int32_t token = -1;
  if (excl <= in_entry && in_entry < excl + m) {
    const float q[4] = {v.x, v.y, v.z, v.w};
    float cum = 0.0f;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      cum += KeyOf(q[e]) >= tau ? row.WeightF(q[e]) : 0.0f;
      if (token < 0 && RowMath::Fixed(cum) > in_entry - excl) token = sl.base + local + e;
    }
  }
  const uint32_t found = __ballot_sync(0xffffffffu, token >= 0);
  return found ? __shfl_sync(0xffffffffu, token, __ffs(found) - 1) : -1;
}

// Rank 0, warp 0, top-k rows whose candidates are every logit in bins up to the top-k bin (so
// every kept one) and few: the inverse CDF in id order over the kept candidates (key >= tau),
// each one's prefix summed over the kept ones with lower ids. Returns the token, -1 if none.
__device__ int32_t DrawFromCandidates(ClusterShared& s, const RowMath& row, uint32_t tau,
                                      uint32_t n, double u) {
  const int lane = threadIdx.x;
  uint64_t mine = 0;
  for (uint32_t i = lane; i < n; i += 32) {
    const uint64_t w = KeyOf(s.cand[i]) >= tau ? row.Weight(s.cand[i]) : 0;
    s.cand_w[i] = w;
    mine += w;
  }
  const uint64_t total = sampling_internal::WarpSum(mine);
  __syncwarp();
  if (total == 0) return -1;
  const uint64_t target = min(static_cast<uint64_t>(u * static_cast<double>(total)), total - 1);
  int32_t token = -1;
  for (uint32_t i = lane; i < n; i += 32) {
    const uint64_t w = s.cand_w[i];
    if (w == 0) continue;
    const int32_t id = s.cand_id[i];
    uint64_t before = 0;
    for (uint32_t j = 0; j < n; ++j) before += s.cand_id[j] < id ? s.cand_w[j] : 0;
    if (before <= target && target < before + w) token = id;
  }
  const uint32_t found = __ballot_sync(0xffffffffu, token >= 0);
  return found ? __shfl_sync(0xffffffffu, token, __ffs(found) - 1) : -1;
}

}  // namespace tandem::sampling_cluster
