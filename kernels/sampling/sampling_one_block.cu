// One-block-per-row sampling kernel: one 1024-thread block per row, semantics exactly those of
// sampling.h, without sorting the vocabulary. Sampling() runs it for vocabularies above the
// resident cluster kernel's 155648, up to 262144. Per row:
//   A. one pass over the logits (from HBM): max and argmax (greedy rows stop here); the first
//      kCacheTiles tiles are kept in shared memory for the later passes.
//   B. (top-k or top-p only) a kBins-bin count histogram over the distance from the max,
//      bin = (max - x) / temperature * kBinsPerUnit; exact counts and bounds on each bin's mass
//      bracket both thresholds to a bin range [b_lo, b_hi]; everything in a lower bin is surely
//      kept, in a higher bin surely dropped.
//   C. the elements in [b_lo, b_hi] are compacted into shared memory (usually a few hundred), and
//      exact radix selects on them find the top-k key and then the top-p key (counts and masses
//      are integers, so results do not depend on thread order). If they do not fit, the same
//      selects run over the whole row (slow but exact).
//      Pass C also sums the surely-kept mass per tile, so no further pass over the row is needed.
//   D. per-tile kept mass (a full pass only without top-k/top-p), then the tile holding
//      u * (kept mass) is scanned in id order. Top-p rows without top-k draw by rejection
//      (sampling.h, step 5): a full pass for the whole row's tile masses, then up to
//      kTopPAttempts draws, and a last pass over the kept mass only if all of them are dropped.
// Weights: w = 2^((x - max) * log2(e) / T) in f32 (as SamplingRef), summed as fixed point
// floor(w * 2^40), so a weight below 2^-40 of the max counts as 0 and sums are exact integers
// (the result does not depend on thread order).
#include <atomic>
#include <cstdint>

#include "base/cuda_check.h"
#include "kernels/common/launch_config.cuh"
#include "kernels/sampling/sampling.h"
#include "kernels/sampling/sampling_internal.cuh"
#include "kernels/sampling/sampling_rng.h"
#include "kernels/sampling/sampling_variants.h"

namespace tandem {
namespace {

using namespace sampling_internal;  // NOLINT: this file's own helpers

// Pass A: max/argmax from global memory, caching the first tiles. Returns the block-wide best.
__device__ ArgMaxPair MaxPass(Shared& s, const RowView& row) {
  ArgMaxPair best{-INFINITY, INT32_MAX};
  for (int t0 = 0; t0 < row.tiles; t0 += kMaxPassGroup) {
    float q[kMaxPassGroup][4];
#pragma unroll
    for (int g = 0; g < kMaxPassGroup; ++g) {
      if (t0 + g < row.tiles) row.LoadGlobal(t0 + g, q[g]);
    }
#pragma unroll
    for (int g = 0; g < kMaxPassGroup; ++g) {
      const int tile = t0 + g;
      if (tile >= row.tiles) break;
      if (tile < kCacheTiles) {
        *reinterpret_cast<float4*>(&s.cache[tile * kTile + 4 * threadIdx.x]) =
            make_float4(q[g][0], q[g][1], q[g][2], q[g][3]);
      }
      const int32_t base = tile * kTile + 4 * threadIdx.x;
#pragma unroll
      for (int e = 0; e < 4; ++e) best = Better(best, ArgMaxPair{q[g][e], base + e});
    }
  }
  return BlockArgMax(best, s.argmax_scratch);  // its barriers also publish the cache
}

// Bounds on the mass of bin b (count c): its elements have (max - x) / T in [b, b + 1) / n, so
// weights in (e^-(b+1)/n, e^-b/n] (n = kBinsPerUnit); the slack covers f32 rounding of the
// distance and exp2.
__device__ __forceinline__ double BinMassLo(int b, uint32_t c) {
  if (b == kBins - 1) return 0.0;
  return c * static_cast<double>(exp2f(-(b + 1) * (kSamplingLog2e / kBinsPerUnit))) * 0.999;
}
__device__ __forceinline__ double BinMassHi(int b, uint32_t c) {
  return c * static_cast<double>(exp2f(-b * (kSamplingLog2e / kBinsPerUnit))) * 1.001;
}

// Warp 0: the first bin whose inclusive prefix of value(b) reaches target (kBins - 1 if none).
// Lane l owns bins [kPerLane l, kPerLane (l + 1)).
constexpr int kPerLane = kBins / 32;

template <typename F>
__device__ int FirstBinReaching(F&& value, double target) {
  const int lane = threadIdx.x;
  double mine = 0.0;
  for (int j = 0; j < kPerLane; ++j) mine += value(kPerLane * lane + j);
  double incl = mine;
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const double y = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += y;
  }
  const uint32_t hits = __ballot_sync(0xffffffffu, incl >= target);
  int bin = kBins - 1;
  if (hits != 0 && lane == __ffs(hits) - 1) {
    double cum = incl - mine;
    for (int j = 0; j < kPerLane; ++j) {
      cum += value(kPerLane * lane + j);
      if (cum >= target) {
        bin = kPerLane * lane + j;
        break;
      }
    }
  }
  return __shfl_sync(0xffffffffu, bin, hits != 0 ? __ffs(hits) - 1 : 0);
}

__device__ double WarpSumD(double x) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

// Warp 0 turns the exact bin counts into the candidate bin range [b_lo, b_hi] that surely holds
// the top-k and top-p thresholds, using lower/upper bounds of the bin masses (no mass atomics).
__device__ __noinline__ void BracketThresholds(Shared& s, int64_t k, bool filter_k, float top_p,
                                               bool filter_p) {
  const int lane = threadIdx.x;
  const uint32_t* count = s.hist_count;
  int bk = kBins - 1;
  if (filter_k) bk = FirstBinReaching([&](int b) { return double(count[b]); }, double(k));
  // Bounds of the mass after top-k: every bin above bk, and of bk between (k - above) and all.
  double above = 0.0, lo = 0.0, hi = 0.0;
  for (int j = 0; j < kPerLane; ++j) {
    const int b = kPerLane * lane + j;
    if (b < bk) above += count[b], lo += BinMassLo(b, count[b]), hi += BinMassHi(b, count[b]);
  }
  above = WarpSumD(above), lo = WarpSumD(lo), hi = WarpSumD(hi);
  const double in_bk = filter_k ? double(k) - above : 0.0;
  const double z_lo = lo + in_bk * BinMassLo(bk, 1);
  const double z_hi = hi + (filter_k ? BinMassHi(bk, count[bk]) : BinMassHi(bk, count[bk]));
  int bp_lo = kBins - 1, bp_hi = kBins - 1;
  if (filter_p) {
    bp_lo = FirstBinReaching([&](int b) { return BinMassHi(b, count[b]); }, top_p * z_lo);
    bp_hi = FirstBinReaching([&](int b) { return BinMassLo(b, count[b]); }, top_p * z_hi);
  }
  const int b_lo = filter_p ? min(bp_lo, bk) : bk;
  double sure = 0.0;
  for (int j = 0; j < kPerLane; ++j) {
    sure += kPerLane * lane + j < b_lo ? count[kPerLane * lane + j] : 0;
  }
  sure = WarpSumD(sure);
  if (lane == 0) {
    s.b_lo = b_lo;
    // With top-k the candidates run to bk, so that the top-k mass can be summed exactly.
    s.b_hi = filter_k ? bk : max(bp_hi, b_lo);
    s.cnt_sure = static_cast<uint64_t>(sure);
    s.cand_count = 0;
  }
}

// Pass B: exact count histogram over the distance from the max (native 32-bit atomics).
__device__ void HistogramPass(Shared& s, const RowView& row, int64_t k, bool filter_k, float top_p,
                              bool filter_p) {
  for (int b = threadIdx.x; b < kBins; b += kSampleThreads) s.hist_count[b] = 0;
  __syncthreads();
  row.ForEach(s, [&](int32_t, float x) { atomicAdd(&s.hist_count[row.Bin(x)], 1u); });
  __syncthreads();
  if (threadIdx.x < 32) BracketThresholds(s, k, filter_k, top_p, filter_p);
  __syncthreads();
}

// Pass C: compacts the candidates (bins [b_lo, b_hi]) and sums, exactly, the surely-kept mass
// (bins < b_lo) per tile and warp into tile_mass, and the row total when top-p needs it.
__device__ void CompactPass(Shared& s, const RowView& row, bool need_z) {
  const int b_lo = s.b_lo, b_hi = s.b_hi;
  uint64_t sure = 0, rest = 0;
  row.ForEachTile(s, [&](int tile, const float(&q)[4]) {
    uint64_t tile_sure = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float w = row.WeightF(q[e]);
      const int bin = static_cast<int>(row.Bin(q[e]));
      if (bin < b_lo) {
        tile_sure += RowView::Fixed(w);
      } else {
        if (need_z) rest += RowView::Fixed(w);
        if (bin <= b_hi) {
          const uint32_t slot = atomicAdd(&s.cand_count, 1u);
          if (slot < kMaxCandidates) {
            s.cand_id[slot] = tile * kTile + 4 * threadIdx.x + e;
            s.cand_x[slot] = q[e];
          }
        }
      }
    }
    sure += tile_sure;
    tile_sure = WarpSum(tile_sure);
    if (threadIdx.x % 32 == 0) s.tile_mass[tile][threadIdx.x / 32] = tile_sure;
  });
  sure = BlockSum(sure, s.scratch);
  rest = BlockSum(rest, s.scratch);
  if (threadIdx.x == 0) s.mass_sure = sure, s.z = sure + rest;
  __syncthreads();
}

// Every kept element's (key >= tau) mass per tile and warp into tile_mass: a full pass.
__device__ void TileMassPass(Shared& s, const RowView& row, uint32_t tau) {
  row.ForEachTile(s, [&](int tile, const float(&q)[4]) {
    uint64_t m = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) m += KeyOf(q[e]) >= tau ? row.Weight(q[e]) : 0;
    m = WarpSum(m);
    if (threadIdx.x % 32 == 0) s.tile_mass[tile][threadIdx.x / 32] = m;
  });
  __syncthreads();
}

// Inverse CDF in id order over the kept elements (key >= tau), from the per-tile masses: finds
// the tile holding u * (kept mass), then scans only that tile.
__device__ int32_t DrawFromTiles(Shared& s, const RowView& row, uint32_t tau, double u,
                                 int32_t fallback) {
  if (threadIdx.x == 0) {
    uint64_t total = 0;
    for (int t = 0; t < row.tiles; ++t) {
      for (int w = 0; w < kSampleWarps; ++w) total += s.tile_mass[t][w];
    }
    const uint64_t target = static_cast<uint64_t>(u * static_cast<double>(total));
    s.draw_tile = -1;
    uint64_t cum = 0;
    for (int t = 0; t < row.tiles && s.draw_tile < 0; ++t) {
      uint64_t tm = 0;
      for (int w = 0; w < kSampleWarps; ++w) tm += s.tile_mass[t][w];
      if (cum + tm > target) s.draw_tile = t, s.draw_rest = target - cum;
      cum += tm;
    }
  }
  __syncthreads();
  const int tile = s.draw_tile;
  if (tile < 0) return fallback;  // no kept mass (cannot happen: the max has weight 1)
  float q[4];
  row.Load(s, tile, q);
  uint64_t w[4], mine = 0, total = 0;
#pragma unroll
  for (int e = 0; e < 4; ++e) mine += w[e] = KeyOf(q[e]) >= tau ? row.Weight(q[e]) : 0;
  uint64_t cum = BlockExclusiveScan(mine, s.scratch, &total);
  const uint64_t rest = s.draw_rest;
  if (threadIdx.x == 0) s.draw_tile = -1;
  __syncthreads();
  if (cum <= rest && rest < cum + mine) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      cum += w[e];
      if (cum > rest) {
        s.draw_tile = tile * kTile + 4 * threadIdx.x + e;  // reused as the token
        break;
      }
    }
  }
  __syncthreads();
  return s.draw_tile >= 0 ? s.draw_tile : fallback;
}

// Top-p rows without top-k (sampling.h, step 5): up to kTopPAttempts draws from the whole
// distribution (a full pass for its tile masses), the first kept one (key >= tau) the token; else
// the inverse CDF over the kept elements (another full pass) with the next draw.
__device__ int32_t DrawTopPByRejection(Shared& s, const RowView& row, uint32_t tau, uint64_t seed,
                                       uint64_t step, int32_t fallback) {
  TileMassPass(s, row, 0);
  for (uint32_t a = 0; a < kTopPAttempts; ++a) {
    const int32_t t = DrawFromTiles(s, row, 0, SamplingUniformImpl(seed, step, a), -1);
    if (t >= 0 && KeyOf(row.logits[t]) >= tau) return t;  // uniform
    __syncthreads();  // DrawFromTiles' next call rewrites s.draw_tile
  }
  TileMassPass(s, row, tau);
  return DrawFromTiles(s, row, tau, SamplingUniformImpl(seed, step, kTopPAttempts), fallback);
}

// Top-k / top-p: passes B and C, exact thresholds, then the draw. Returns the token.
__device__ int32_t SampleFiltered(Shared& s, const RowView& row, int64_t k, bool filter_k,
                                  float top_p, bool filter_p, uint64_t seed, uint64_t step,
                                  int32_t fallback) {
  HistogramPass(s, row, k, filter_k, top_p, filter_p);
  CompactPass(s, row, filter_p && !filter_k);
  const double u = SamplingUniformImpl(seed, step);
  uint32_t tau;
  if (s.cand_count <= kMaxCandidates) {
    tau = SelectThresholds(s, row, CandidateView{}, s.cnt_sure, s.mass_sure, s.z, k, filter_k,
                           top_p, filter_p);
    if (!filter_k) return DrawTopPByRejection(s, row, tau, seed, step, fallback);
    // The surely-kept mass is in tile_mass already; add the kept candidates'.
    for (int t = threadIdx.x; t < kMaxTiles; t += kSampleThreads) {
      s.cand_tile_lo[t] = 0, s.cand_tile_hi[t] = 0;
    }
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < s.cand_count; i += kSampleThreads) {
      if (KeyOf(s.cand_x[i]) >= tau) {
        const int t = s.cand_id[i] / kTile;
        AtomicAddSplit64(&s.cand_tile_lo[t], &s.cand_tile_hi[t], row.Weight(s.cand_x[i]));
      }
    }
    __syncthreads();
    if (threadIdx.x < row.tiles) {
      s.tile_mass[threadIdx.x][0] +=
          Split64(s.cand_tile_lo[threadIdx.x], s.cand_tile_hi[threadIdx.x]);
    }
    __syncthreads();
  } else {  // too many candidates: exact selects over the whole row (slow), then a full pass
    tau = SelectThresholds(s, row, row, 0, 0, s.z, k, filter_k, top_p, filter_p);
    if (!filter_k) return DrawTopPByRejection(s, row, tau, seed, step, fallback);
    TileMassPass(s, row, tau);
  }
  return DrawFromTiles(s, row, tau, u, fallback);
}

__global__ void __launch_bounds__(kSampleThreads, 1)
    SamplingKernel(const __grid_constant__ SamplingArgs args, bool vec_ok) {
  extern __shared__ __align__(16) unsigned char smem[];
  Shared& s = *reinterpret_cast<Shared*>(smem);
  const int64_t r = blockIdx.x;
  RowView row{{0.0f, 1.0f, 0.0f},
              args.logits + r * args.vocab_size,
              args.vocab_size,
              vec_ok,
              static_cast<int>((args.vocab_size + kTile - 1) / kTile)};
  const ArgMaxPair best = MaxPass(s, row);
  const float temperature = args.temperature[r];
  if (!(temperature > 0.0f) || best.value == -INFINITY) {
    if (threadIdx.x == 0) args.out_tokens[r] = best.id;
    return;
  }
  row.max_logit = best.value;
  row.scale = kSamplingLog2e / temperature;
  row.bin_scale = kBinsPerUnit / temperature;
  const float min_p = args.min_p != nullptr ? args.min_p[r] : 0.0f;
  if (min_p > 0.0f) row.cutoff = best.value + log2f(min_p) / row.scale;
  const int64_t k = args.top_k[r];
  const float top_p = args.top_p[r];
  const bool filter_k = k > 0 && k < args.vocab_size, filter_p = top_p < 1.0f;
  int32_t token;
  if (filter_k || filter_p) {
    token =
        SampleFiltered(s, row, k, filter_k, top_p, filter_p, args.seeds[r], args.steps[r], best.id);
  } else {
    TileMassPass(s, row, 0);
    token = DrawFromTiles(s, row, 0, SamplingUniformImpl(args.seeds[r], args.steps[r]), best.id);
  }
  if (threadIdx.x == 0) args.out_tokens[r] = token;
}

}  // namespace

absl::Status SamplingOneBlockPerRow(const SamplingArgs& args, cudaStream_t stream) {
  if (args.batch < 0 || args.vocab_size <= 0) {
    return absl::InvalidArgumentError("Sampling: needs batch >= 0 and vocab_size > 0");
  }
  if (args.vocab_size > static_cast<int64_t>(kMaxTiles) * kTile) {
    return absl::InvalidArgumentError("Sampling: vocab_size above 262144 is not supported");
  }
  if (args.batch == 0) return absl::OkStatus();
  const bool vec_ok =
      args.vocab_size % 4 == 0 && (reinterpret_cast<uintptr_t>(args.logits) & 15u) == 0;
  const int smem = static_cast<int>(sizeof(Shared));
  // Raise the kernel's shared-memory limit once per device (not per call: keeps steady-state
  // calls to one launch, e.g. inside CUDA graph capture); the occupancy it also returns is unused.
  static std::atomic<int> configured[kMaxDevices];
  if (absl::Status st = BlocksPerSm(SamplingKernel, kSampleThreads, smem, configured).status();
      !st.ok()) {
    return st;
  }
  SamplingKernel<<<args.batch, kSampleThreads, smem, stream>>>(args, vec_ok);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tandem
