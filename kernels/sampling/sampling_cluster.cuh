// Internals of the resident cluster sampling kernel (sampling_cluster.cu): constants, the
// shared-memory layout, the slices of a row, the draw's owner, and the views the exact selects
// (sampling_cluster_select.cuh) run over: rank 0's candidates, or, when they do not fit, the whole
// row in distributed shared memory.
#pragma once

#include <cooperative_groups.h>

#include <cstdint>

#include "kernels/sampling/block_reduce.cuh"
#include "kernels/sampling/sampling.h"
#include "kernels/sampling/sampling_internal.cuh"
#include "kernels/sampling/sampling_rng.h"

namespace tandem::sampling_cluster {

namespace cg = cooperative_groups;
using sampling_internal::ArgMaxPair;
using sampling_internal::KeyOf;

constexpr int kCluster = 8;    // CTAs per row (portable cluster size)
constexpr int kThreads = 512;  // per CTA; 2 CTAs per SM
constexpr int kWarps = kThreads / 32;
constexpr int kTileElems = 4 * kThreads;  // a tile: 4 consecutive logits per thread
constexpr int kSliceCap = 19456;          // logits per CTA (76 KiB): vocab <= 155648
constexpr int kSliceTiles = (kSliceCap + kTileElems - 1) / kTileElems;  // 10
constexpr int kEntries = kSliceTiles * kWarps;  // draw entries: (tile, warp), in id order
using sampling_internal::kBins;                 // bracketing bins over (max - x) / T,
using sampling_internal::kBinsPerUnit;          //   each spanning a weight ratio of e^(1/32)
using sampling_internal::kFixedScale;           // 2^40: masses are integers, order-free sums
using sampling_internal::kRadixBins;            // 8-bit digits of the exact selects
using sampling_internal::RowMath;               // the weights and bins of one row
constexpr int kCandCap = 1920;                  // candidates gathered in rank 0
constexpr int kDirectDrawMax = 128;  // rank 0 draws itself from <= this many candidates (top-k)
constexpr int kRangeBins = kBins / kCluster;  // top-p rows: the histogram bins CTA c merges
constexpr int kSubBins = 1024;                // top-p rows: sub-bins of the top-p bin in the select
constexpr int kSubListCap = 256;              //   and candidates in the sub-bin of the threshold
constexpr int64_t kMaxVocab = int64_t{kCluster} * kSliceCap;

// Shared memory of one CTA (~109 KiB, so two CTAs fit an SM). Unions hold buffers whose lifetimes
// do not overlap; the phase each one lives in is named.
struct ClusterShared {
  float x[kSliceCap];  // this CTA's slice of the row, NaN and padding as -inf
  union {
    struct {  // histogram pass: this CTA's counts and fixed-point masses (32-bit halves)
      uint32_t count[kBins], lo[kBins], hi[kBins];
    } hist;
    struct {  // rank 0, selects: one radix round's counts and masses
      uint32_t count[kRadixBins], lo[kRadixBins], hi[kRadixBins];
    } radix;
    struct {  // rank 0, top-p select: masses of sub-bins of the top-p bin, and the logits and
              // masses of the candidates in the sub-bin that holds the threshold
      uint32_t lo[kSubBins], hi[kSubBins];
      float x[kSubListCap];
      uint64_t w[kSubListCap];
    } sub;
    // Top-p rows without top-k, after tau (no CTA of the cluster uses the others then): pushed by
    // a draw's owner, the token if it is kept, else -1; by attempt parity.
    int32_t attempt_token[2];
  } a;
  float cand[kCandCap];             // rank 0, selects: the candidates' logits (pushed by every CTA)
  int32_t cand_id[kCandCap];        //   and their token ids
  uint64_t cand_w[kDirectDrawMax];  // rank 0, direct draw: the kept candidates' masses
  uint64_t entry_mass[kEntries];    // kept mass of each (tile, warp) entry
  // Top-p rows: the cluster's histogram masses of this CTA's range of bins (rank * kRangeBins
  // on), as inclusive prefix sums within the range (read by every CTA), and the range totals
  // (pushed by each CTA: its range's).
  uint64_t range_prefix[kRangeBins];
  uint64_t range_total[kCluster];
  uint64_t peer_total[kCluster];      // pushed by each CTA: its kept mass
  ArgMaxPair peer_best[2][kCluster];  // pushed by each CTA: its (max, id); by row parity
  uint64_t scratch[kWarps];
  ArgMaxPair argmax_scratch[kWarps];
  uint32_t cand_count;  // rank 0: candidates pushed (may exceed kCandCap)
  int b_lo, b_hi;       // pushed by rank 0: candidate bins
  uint32_t tau;         // pushed by rank 0: kept <=> KeyOf(x) >= tau
  int direct;           // pushed by rank 0: it draws the row from the candidates itself
  // Rank 0 only.
  uint64_t cnt_sure, mass_sure, z;  // elements / mass in bins < b_lo; the row's mass (top-p)
  int bk;                           // the top-k bin
  uint64_t cnt_bk;                  // logits in bins <= bk
  uint32_t key_and, key_or, digit;
  uint32_t kept_min;  // rank 0, top-p select: the smallest key kept
  uint32_t sub_len;   //   and the candidates in the threshold's sub-bin
  int found;
  uint64_t remaining;
};

template <typename T>
__device__ __forceinline__ T* Peer(T* p, int rank) {
  return cg::this_cluster().map_shared_rank(p, rank);
}

// Logits in the slice of CTA `rank` (slices of slice_len, the last one shorter or empty).
__host__ __device__ inline int SliceLength(int slice_len, int64_t vocab, int rank) {
  const int64_t rest = vocab - int64_t{rank} * slice_len;
  return rest <= 0 ? 0 : (rest < slice_len ? static_cast<int>(rest) : slice_len);
}

// After the cluster barrier that published every CTA's mass (peer_total[i] of CTA i, in id
// order): the draw's target u * total over the row. kThis when CTA `rank` holds it (*rest: the
// target less the masses of the CTAs below it), kOther when another one does, kNoMass when the
// total is 0 (cannot happen: the max has weight 1; the caller keeps the argmax).
enum class DrawOwner { kNoMass, kOther, kThis };
__device__ __forceinline__ DrawOwner FindDrawTarget(const uint64_t* peer_total, int rank, double u,
                                                    uint64_t* rest) {
  uint64_t total = 0, before = 0;
  for (int i = 0; i < kCluster; ++i) {
    total += peer_total[i];
    before += i < rank ? peer_total[i] : 0;
  }
  if (total == 0) return DrawOwner::kNoMass;
  const uint64_t target = min(static_cast<uint64_t>(u * static_cast<double>(total)), total - 1);
  if (target < before || target >= before + peer_total[rank]) return DrawOwner::kOther;
  *rest = target - before;
  return DrawOwner::kThis;
}

static_assert(sizeof(ClusterShared) <= 110 * 1024, "two CTAs per SM: <= 113 KiB each");
static_assert(kSliceCap % 4 == 0 && kBins % 32 == 0 && kRangeBins % 32 == 0);
static_assert(kSubBins == 2 * kThreads && kSubListCap <= kThreads);

// Calls f(x) for every candidate gathered in this (rank 0) CTA, spread over kGroup threads.
struct CandidateView {
  uint32_t n;
  template <int kGroup, typename F>
  __device__ void ForEach(ClusterShared& s, F&& f) const {
    for (uint32_t i = threadIdx.x; i < n; i += kGroup) f(s.cand[i]);
  }
};

// Calls f(x) for every logit of the row, reading each CTA's slice through distributed shared
// memory (the exact fallback when the candidates do not fit: slow, rare).
struct DistributedView {
  int slice_len;
  int64_t vocab;
  template <int kGroup, typename F>
  __device__ void ForEach(ClusterShared& s, F&& f) const {
    static_assert(kGroup == kThreads);
    for (int r = 0; r < kCluster; ++r) {
      const float* x = cg::this_cluster().map_shared_rank(s.x, r);
      const int n = SliceLength(slice_len, vocab, r);
      for (int i = threadIdx.x; i < n; i += kThreads) f(x[i]);
    }
  }
};

}  // namespace tandem::sampling_cluster
