// Internals of the one-block-per-row sampling kernel (sampling_one_block.cu): shared-memory layout,
// the row and candidate views, and the exact radix selects; RowMath, KeyOf, the split 64-bit
// atomics and the bin and fixed-point constants are shared with the resident cluster kernel
// (sampling_cluster.cuh).
#pragma once

#include <cstdint>

#include "kernels/sampling/block_reduce.cuh"

namespace tandem::sampling_internal {

constexpr int kTile = 4 * kSampleThreads;  // elements per tile: 4 consecutive per thread
constexpr int kMaxTiles = 64;              // vocab_size <= 262144
constexpr int kCacheTiles = 8;             // 32768 logits (128 KiB) cached in shared memory
constexpr int kMaxCandidates = 8192;
constexpr int kTileGroup = 4;          // tiles loaded together (memory-level parallelism)
constexpr int kMaxPassGroup = 8;       // the same for the first pass (fewer live values)
constexpr int kBins = 1024;            // bracketing bins over (max - x) / T, kBinsPerUnit per unit
constexpr float kBinsPerUnit = 32.0f;  // a bin spans a weight ratio of e^(1/32) = 1.032
constexpr int kRadixBins = 256;        // 8-bit digits of the exact selects
constexpr float kFixedScale = 1099511627776.0f;  // 2^40

struct Shared {
  float cache[kCacheTiles * kTile];
  int32_t cand_id[kMaxCandidates];
  float cand_x[kMaxCandidates];
  uint64_t tile_mass[kMaxTiles][kSampleWarps];
  uint32_t radix_lo[kRadixBins];     // exact selects: fixed-point masses as 32-bit halves
  uint32_t radix_hi[kRadixBins];     //   (see AtomicAddSplit64)
  uint32_t cand_tile_lo[kMaxTiles];  // kept candidates' mass per tile, 32-bit halves
  uint32_t cand_tile_hi[kMaxTiles];
  uint32_t radix_count[kRadixBins];  // exact selects: counts (native 32-bit atomics)
  uint32_t hist_count[kBins];        // bracketing: exact counts per bin
  uint64_t scratch[kSampleWarps];
  ArgMaxPair argmax_scratch[kSampleWarps];
  uint32_t cand_count;
  uint32_t digit;
  int found;
  uint64_t remaining;
  int b_lo, b_hi;
  uint64_t cnt_sure, mass_sure, z;
  int draw_tile;
  uint64_t draw_rest;
};

// Exact 64-bit atomic add from two native 32-bit shared-memory atomics (a 64-bit add on shared
// memory compiles to a CAS loop, ATOMS.CAST.SPIN.64, which collapses under contention):
// value = hi * 2^32 + lo, the carry out of lo detected from the returned old value.
__device__ __forceinline__ void AtomicAddSplit64(uint32_t* lo, uint32_t* hi, uint64_t v) {
  const uint32_t v_lo = static_cast<uint32_t>(v);
  const uint32_t old = atomicAdd(lo, v_lo);
  const uint32_t carry = old + v_lo < old ? 1u : 0u;
  const uint32_t v_hi = static_cast<uint32_t>(v >> 32) + carry;
  if (v_hi != 0) atomicAdd(hi, v_hi);
}
__device__ __forceinline__ uint64_t Split64(uint32_t lo, uint32_t hi) {
  return (static_cast<uint64_t>(hi) << 32) + lo;
}

// Order-preserving key: a > b as floats  <=>  KeyOf(a) > KeyOf(b) as integers.
__device__ __forceinline__ uint32_t KeyOf(float x) {
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The weights and bins of one row (both sampling kernels; the same arithmetic in every CTA of a
// cluster).
struct RowMath {
  float max_logit;
  float scale;      // log2(e) / temperature: w = 2^((x - max) * scale), as SamplingRef
  float bin_scale;  // kBinsPerUnit / temperature

  // exp2f((x - max) * scale) in one MUFU.EX2: exp2f issues that same instruction for arguments
  // >= -126 and, below, halves the argument and squares the result to keep denormal results;
  // ex2.approx.ftz flushes them to 0 instead. Weights below 2^-40 are 0 in fixed point and vanish
  // from float sums that reach 2^-40, so every fixed-point weight and kept sum is unchanged and
  // three instructions per logit are saved (kernels/sampling/WORKLOG.md, session 6).
  __device__ float WeightF(float x) const {
    float w;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(w) : "f"((x - max_logit) * scale));
    return w;
  }
  __device__ uint64_t Weight(float x) const { return Fixed(WeightF(x)); }
  static __device__ uint64_t Fixed(float w) { return static_cast<uint64_t>(w * kFixedScale); }
  // floor of the distance in bins, capped at kBins - 1 (-inf and NaN distances land there):
  // 2^23 + d rounded toward zero holds floor(d) in its low mantissa bits (full-rate FADD, no
  // conversion).
  __device__ uint32_t Bin(float x) const {
    const float d = fminf((max_logit - x) * bin_scale, kBins - 1.0f);
    return __float_as_uint(__fadd_rz(d, 8388608.0f)) - 0x4b000000u;
  }
};

struct RowView : RowMath {
  const float* logits;  // this row
  int64_t vocab;
  bool vec_ok;  // vocab % 4 == 0 and 16-byte aligned rows
  int tiles;
  // min_p (sampling.h, step 3): logits below it read as -inf; -inf (the default) drops nothing.
  float cutoff = -INFINITY;

  // The 4 logits of thread t in tile `tile` from global memory; NaN and padding read as -inf.
  __device__ void LoadGlobal(int tile, float (&q)[4]) const {
    const int64_t base = static_cast<int64_t>(tile) * kTile + 4 * threadIdx.x;
    if (vec_ok && base + 3 < vocab) {
      const float4 v = __ldcs(reinterpret_cast<const float4*>(logits + base));
      q[0] = v.x, q[1] = v.y, q[2] = v.z, q[3] = v.w;
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) q[e] = base + e < vocab ? logits[base + e] : -INFINITY;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) q[e] = isnan(q[e]) || q[e] < cutoff ? -INFINITY : q[e];
  }
  __device__ void Load(const Shared& s, int tile, float (&q)[4]) const {
    if (tile < kCacheTiles) {
      const float4 v = *reinterpret_cast<const float4*>(&s.cache[tile * kTile + 4 * threadIdx.x]);
      q[0] = v.x, q[1] = v.y, q[2] = v.z, q[3] = v.w;
#pragma unroll
      for (int e = 0; e < 4; ++e) q[e] = q[e] < cutoff ? -INFINITY : q[e];
    } else {
      LoadGlobal(tile, q);
    }
  }
  // Calls f(tile, q) for every tile with this thread's 4 logits of it. Tiles go kTileGroup at a
  // time, all their loads issued before any use, so each thread keeps kTileGroup loads in flight.
  template <typename F>
  __device__ void ForEachTile(const Shared& s, F&& f) const {
    for (int t0 = 0; t0 < tiles; t0 += kTileGroup) {
      float q[kTileGroup][4];
#pragma unroll
      for (int g = 0; g < kTileGroup; ++g) {
        if (t0 + g < tiles) Load(s, t0 + g, q[g]);
      }
#pragma unroll
      for (int g = 0; g < kTileGroup; ++g) {
        if (t0 + g < tiles) f(t0 + g, q[g]);
      }
    }
  }
  // Calls f(id, x) for every element of the row this thread owns.
  template <typename F>
  __device__ void ForEach(const Shared& s, F&& f) const {
    ForEachTile(s, [&](int tile, const float(&q)[4]) {
      const int64_t base = static_cast<int64_t>(tile) * kTile + 4 * threadIdx.x;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (base + e < vocab) f(static_cast<int32_t>(base + e), q[e]);
      }
    });
  }
};

struct CandidateView {
  template <typename F>
  __device__ void ForEach(const Shared& s, F&& f) const {
    for (uint32_t i = threadIdx.x; i < s.cand_count; i += kSampleThreads) {
      f(s.cand_id[i], s.cand_x[i]);
    }
  }
};

// Largest key tau such that the elements with key >= tau (and key >= tau_min) hold at least
// `remaining` (count, or fixed-point mass when kMass). 8-bit digits, most significant first, each
// round a 256-bin histogram over the elements matching the digits found so far. Returns tau_min
// when even all elements fall short (rounding at the edge of the top-p search).
template <bool kMass, typename View>
__device__ uint32_t RadixSelect(Shared& s, const RowView& row, const View& view, uint32_t tau_min,
                                uint64_t remaining) {
  uint32_t prefix = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    if (threadIdx.x < kRadixBins) {
      s.radix_lo[threadIdx.x] = 0, s.radix_hi[threadIdx.x] = 0, s.radix_count[threadIdx.x] = 0;
    }
    __syncthreads();
    const uint32_t hi_mask = shift == 24 ? 0u : (0xffffffffu << (shift + 8));
    view.ForEach(s, [&](int32_t, float x) {
      const uint32_t key = KeyOf(x);
      if ((key & hi_mask) != (prefix & hi_mask) || key < tau_min) return;
      const int digit = (key >> shift) & 255;
      if constexpr (kMass) {
        const uint64_t w = row.Weight(x);
        if (w != 0) AtomicAddSplit64(&s.radix_lo[digit], &s.radix_hi[digit], w);
      } else {
        atomicAdd(&s.radix_count[digit], 1u);
      }
    });
    __syncthreads();
    if (threadIdx.x < 32) {  // the digit, from the largest down: bins in descending order
      uint64_t bins[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int d = 255 - 8 * static_cast<int>(threadIdx.x) - j;
        bins[j] = kMass ? Split64(s.radix_lo[d], s.radix_hi[d]) : s.radix_count[d];
      }
      const WarpPick pick = WarpFirstReaching(bins, remaining);
      if (threadIdx.x == 0) {
        s.found = pick.index >= 0;
        if (pick.index >= 0) s.digit = 255 - pick.index, s.remaining = pick.rest;
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
__device__ uint64_t MassAbove(Shared& s, const RowView& row, const View& view, uint32_t tau) {
  uint64_t sum = 0;
  view.ForEach(s, [&](int32_t, float x) {
    if (KeyOf(x) >= tau) sum += row.Weight(x);
  });
  return BlockSum(sum, s.scratch);
}

// Exact top-k then top-p key thresholds over `view`, which holds every element of bins that may
// hold a threshold, and with top-k every element above the top-k bin; the elements above the view
// number cnt_sure with mass mass_sure; z is the row's total mass. Returns tau: kept <=> key >= tau.
template <typename View>
__device__ uint32_t SelectThresholds(Shared& s, const RowView& row, const View& view,
                                     uint64_t cnt_sure, uint64_t mass_sure, uint64_t z, int64_t k,
                                     bool filter_k, float top_p, bool filter_p) {
  uint32_t tau_k = 0;
  if (filter_k) {
    const int64_t want = k - static_cast<int64_t>(cnt_sure);
    tau_k = RadixSelect<false>(s, row, view, 0, want > 0 ? want : 1);
  }
  if (!filter_p) return tau_k;
  // Mass after top-k: without top-k it is the row total z (the view may not hold every element).
  const uint64_t z_k = filter_k ? mass_sure + MassAbove(s, row, view, tau_k) : z;
  // HF keeps the smallest prefix with mass >= top_p * z_k: integer mass >= ceil(top_p * z_k).
  const double need =
      ceil(static_cast<double>(top_p) * static_cast<double>(z_k)) - static_cast<double>(mass_sure);
  const uint64_t remaining = need >= 1.0 ? static_cast<uint64_t>(need) : 1;
  const uint32_t tau_p = RadixSelect<true>(s, row, view, tau_k, remaining);
  return tau_p > tau_k ? tau_p : tau_k;
}

}  // namespace tandem::sampling_internal
