// Internals of the cluster sampling kernel (sampling_cluster.cu): constants, the shared-memory
// layout, the per-CTA view of a row slice, and the exact selects that rank 0 of a cluster runs over
// the candidates (or, when they do not fit, over the whole row in distributed shared memory).
#pragma once

#include <cooperative_groups.h>

#include <cstdint>

#include "kernels/sampling/block_reduce.cuh"
#include "kernels/sampling/sampling_internal.cuh"

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
constexpr int kEntries = kSliceTiles * kWarps;   // draw entries: (tile, warp), in id order
constexpr int kBins = 1024;                      // bracketing bins over (max - x) / T
constexpr float kBinsPerUnit = 32.0f;            //   a bin spans a weight ratio of e^(1/32)
constexpr int kRadixBins = 256;                  // 8-bit digits of the exact selects
constexpr int kCandCap = 3072;                   // candidates gathered in rank 0
constexpr int kMassLoBits = 28;                  // cluster bin mass = lo + (hi << 28), both u32
constexpr float kFixedScale = 1099511627776.0f;  // 2^40: masses are integers, order-free sums
constexpr int64_t kMaxVocab = int64_t{kCluster} * kSliceCap;

// Shared memory of one CTA (~102 KiB, so two CTAs fit an SM). Unions hold buffers whose lifetimes
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
  } a;
  union {
    struct {  // rank 0, bracketing: the cluster's counts and masses, summed by the peers
      uint32_t count[kBins], mass_lo[kBins], mass_hi[kBins];
    } merged;
    float cand[kCandCap];  // rank 0, selects: the candidates' logits
  } b;
  uint64_t entry_mass[kEntries];   // kept mass of each (tile, warp) entry
  uint64_t peer_total[kCluster];   // pushed by each CTA: its kept mass
  ArgMaxPair peer_best[kCluster];  // pushed by each CTA: its (max, id)
  uint64_t scratch[kWarps];
  ArgMaxPair argmax_scratch[kWarps];
  uint32_t cand_count;  // rank 0: candidates pushed (may exceed kCandCap)
  int b_lo, b_hi;       // pushed by rank 0: candidate bins
  uint32_t tau;         // pushed by rank 0: kept <=> KeyOf(x) >= tau
  // Rank 0 only.
  uint64_t cnt_sure, mass_sure, z;  // elements / mass in bins < b_lo; the row's mass (top-p)
  uint32_t key_and, key_or, digit;
  int found;
  uint64_t remaining;
};

// Logits in the slice of CTA `rank` (slices of slice_len, the last one shorter or empty).
__host__ __device__ inline int SliceLength(int slice_len, int64_t vocab, int rank) {
  const int64_t rest = vocab - int64_t{rank} * slice_len;
  return rest <= 0 ? 0 : (rest < slice_len ? static_cast<int>(rest) : slice_len);
}

static_assert(sizeof(ClusterShared) <= 110 * 1024, "two CTAs per SM: <= 113 KiB each");
static_assert(kSliceCap % 4 == 0 && kBins % 32 == 0);

// The weights and bins of one row (the same arithmetic in every CTA of its cluster).
struct RowMath {
  float max_logit;
  float scale;      // log2(e) / temperature: w = 2^((x - max) * scale), as SamplingRef
  float bin_scale;  // kBinsPerUnit / temperature

  __device__ float WeightF(float x) const { return exp2f((x - max_logit) * scale); }
  __device__ uint64_t Weight(float x) const { return Fixed(WeightF(x)); }
  static __device__ uint64_t Fixed(float w) { return static_cast<uint64_t>(w * kFixedScale); }
  // floor of the distance in bins, capped at kBins - 1 (-inf lands there): 2^23 + d rounded
  // toward zero holds floor(d) in its low mantissa bits (full-rate FADD, no conversion).
  __device__ uint32_t Bin(float x) const {
    const float d = fminf((max_logit - x) * bin_scale, kBins - 1.0f);
    return __float_as_uint(__fadd_rz(d, 8388608.0f)) - 0x4b000000u;
  }
};

// Calls f(x) for every candidate gathered in this (rank 0) CTA.
struct CandidateView {
  uint32_t n;
  template <typename F>
  __device__ void ForEach(ClusterShared& s, F&& f) const {
    for (uint32_t i = threadIdx.x; i < n; i += kThreads) f(s.b.cand[i]);
  }
};

// Calls f(x) for every logit of the row, reading each CTA's slice through distributed shared
// memory (the exact fallback when the candidates do not fit: slow, rare).
struct DistributedView {
  int slice_len;
  int64_t vocab;
  template <typename F>
  __device__ void ForEach(ClusterShared& s, F&& f) const {
    for (int r = 0; r < kCluster; ++r) {
      const float* x = cg::this_cluster().map_shared_rank(s.x, r);
      const int n = SliceLength(slice_len, vocab, r);
      for (int i = threadIdx.x; i < n; i += kThreads) f(x[i]);
    }
  }
};

}  // namespace tandem::sampling_cluster
