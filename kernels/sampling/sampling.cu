// CUDA sampling: one 1024-thread block per row; semantics exactly those of sampling.h, without
// sorting the vocabulary. Per row:
//   A. one pass over the logits (from HBM): max and argmax (greedy rows stop here); the first
//      kCacheTiles tiles are kept in shared memory for the later passes.
//   B. (top-k or top-p only) a 256-bin histogram of count and mass over the distance from the
//      max, bin = (max - x) / temperature * 8, which brackets both thresholds to a bin range
//      [b_lo, b_hi]; everything in a lower bin is surely kept, in a higher bin surely dropped.
//   C. the elements in [b_lo, b_hi] are compacted into shared memory (usually a few hundred), and
//      exact radix selects on them find the top-k key and then the top-p key (counts and masses
//      are integers, so results do not depend on thread order). If they do not fit, the same
//      selects run over the whole row (slow but exact).
//   D. per-tile kept mass, then the tile holding u * (kept mass) is scanned in id order.
// Weights are fixed-point: w = floor(exp((x - max) / T) * 2^40), so a weight below 2^-40 of the
// max counts as 0 and sums are exact integers.
#include <cstdint>

#include "base/cuda_check.h"
#include "kernels/sampling/sampling.h"
#include "kernels/sampling/sampling_internal.cuh"
#include "kernels/sampling/sampling_rng.h"

namespace tandem {
namespace {

using namespace sampling_internal;  // NOLINT: this file's own helpers

// Pass A: max/argmax from global memory, caching the first tiles. Returns the block-wide best.
__device__ ArgMaxPair MaxPass(Shared& s, const RowView& row) {
  ArgMaxPair best{-INFINITY, INT32_MAX};
  for (int t0 = 0; t0 < row.tiles; t0 += kTileGroup) {
    float q[kTileGroup][4];
#pragma unroll
    for (int g = 0; g < kTileGroup; ++g) {
      if (t0 + g < row.tiles) row.LoadGlobal(t0 + g, q[g]);
    }
#pragma unroll
    for (int g = 0; g < kTileGroup; ++g) {
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

// One thread turns the histograms into the bracket [b_lo, b_hi] and the surely-kept totals.
__device__ void BracketThresholds(Shared& s, int64_t vocab, uint64_t z, int64_t k, bool filter_k,
                                  float top_p, bool filter_p) {
  uint64_t cum_count = 0, cum_mass = 0;
  for (int b = 0; b < kBins - 1; ++b) cum_count += s.hist_count[b], cum_mass += s.hist_mass[b];
  s.hist_count[kBins - 1] = static_cast<uint32_t>(vocab - cum_count);
  s.hist_mass[kBins - 1] = z - cum_mass;
  int bk = kBins - 1;
  uint64_t z_lo = z;
  cum_count = cum_mass = 0;
  for (int b = 0; filter_k && b < kBins; ++b) {
    if (cum_count + s.hist_count[b] >= static_cast<uint64_t>(k)) {
      bk = b, z_lo = cum_mass;
      break;
    }
    cum_count += s.hist_count[b], cum_mass += s.hist_mass[b];
  }
  int bp_lo = kBins - 1, bp_hi = kBins - 1;
  cum_mass = 0;
  for (int b = 0, lo_done = 0; filter_p && b < kBins; ++b) {
    cum_mass += s.hist_mass[b];
    if (!lo_done && static_cast<double>(cum_mass) >= top_p * static_cast<double>(z_lo)) {
      bp_lo = b, lo_done = 1;
    }
    if (static_cast<double>(cum_mass) >= top_p * static_cast<double>(z)) {
      bp_hi = b;
      break;
    }
  }
  // With top-k the candidates run to bk, so that the top-k mass can be summed exactly.
  s.b_lo = min(bp_lo, bk), s.b_hi = filter_k ? bk : bp_hi;
  s.z = z;
  s.cnt_sure = s.mass_sure = 0;
  for (int b = 0; b < s.b_lo; ++b) s.cnt_sure += s.hist_count[b], s.mass_sure += s.hist_mass[b];
  s.cand_count = 0;
}

// Passes B and C: returns the key threshold tau (kept <=> key >= tau) for top-k / top-p.
__device__ uint32_t FilterThreshold(Shared& s, const RowView& row, int64_t k, bool filter_k,
                                    float top_p, bool filter_p) {
  for (int b = threadIdx.x; b < kBins; b += kSampleThreads) s.hist_count[b] = 0, s.hist_mass[b] = 0;
  __syncthreads();
  uint64_t z = 0;
  row.ForEach(s, [&](int32_t, float x) {
    const uint64_t w = row.Weight(x);
    z += w;
    const int bin = row.Bin(x);
    if (bin < kBins - 1) {  // the far tail is the remainder; no atomics on the busiest bin
      atomicAdd(&s.hist_count[bin], 1u);
      atomicAdd(reinterpret_cast<unsigned long long*>(&s.hist_mass[bin]), w);
    }
  });
  z = BlockSum(z, s.scratch);
  if (threadIdx.x == 0) BracketThresholds(s, row.vocab, z, k, filter_k, top_p, filter_p);
  __syncthreads();
  const int b_lo = s.b_lo, b_hi = s.b_hi;
  row.ForEach(s, [&](int32_t id, float x) {
    const int bin = row.Bin(x);
    if (bin < b_lo || bin > b_hi) return;
    const uint32_t slot = atomicAdd(&s.cand_count, 1u);
    if (slot < kMaxCandidates) s.cand_id[slot] = id, s.cand_x[slot] = x;
  });
  __syncthreads();
  if (s.cand_count <= kMaxCandidates) {
    return SelectThresholds(s, row, CandidateView{}, s.cnt_sure, s.mass_sure, s.z, k, filter_k,
                            top_p, filter_p);
  }
  return SelectThresholds(s, row, row, 0, 0, s.z, k, filter_k, top_p, filter_p);
}

// Pass D: inverse CDF in id order over the kept elements (key >= tau, weight > 0).
__device__ int32_t DrawPass(Shared& s, const RowView& row, uint32_t tau, double u) {
  int32_t last_kept = -1;
  for (int t0 = 0; t0 < row.tiles; t0 += kTileGroup) {
    float q[kTileGroup][4];
#pragma unroll
    for (int g = 0; g < kTileGroup; ++g) {
      if (t0 + g < row.tiles) row.Load(s, t0 + g, q[g]);
    }
#pragma unroll
    for (int g = 0; g < kTileGroup; ++g) {
      const int tile = t0 + g;
      if (tile >= row.tiles) break;
      uint64_t m = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint64_t w = KeyOf(q[g][e]) >= tau ? row.Weight(q[g][e]) : 0;
        m += w;
        if (w != 0) last_kept = tile * kTile + 4 * threadIdx.x + e;
      }
      m = WarpSum(m);
      if (threadIdx.x % 32 == 0) s.tile_mass[tile][threadIdx.x / 32] = m;
    }
  }
  last_kept = BlockMaxInt(last_kept, s.scratch);  // its barriers publish tile_mass
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
  if (tile < 0) return last_kept;  // rounding: u * total reached the end
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
  return s.draw_tile >= 0 ? s.draw_tile : last_kept;
}

__global__ void __launch_bounds__(kSampleThreads, 1)
    SamplingKernel(const __grid_constant__ SamplingArgs args, bool vec_ok) {
  extern __shared__ __align__(16) unsigned char smem[];
  Shared& s = *reinterpret_cast<Shared*>(smem);
  const int64_t r = blockIdx.x;
  RowView row{args.logits + r * args.vocab_size,
              args.vocab_size,
              vec_ok,
              static_cast<int>((args.vocab_size + kTile - 1) / kTile),
              0.0f,
              1.0f};
  const ArgMaxPair best = MaxPass(s, row);
  const float temperature = args.temperature[r];
  if (!(temperature > 0.0f) || best.value == -INFINITY) {
    if (threadIdx.x == 0) args.out_tokens[r] = best.id;
    return;
  }
  row.max_logit = best.value;
  row.temperature = temperature;
  const int64_t k = args.top_k[r];
  const float top_p = args.top_p[r];
  const bool filter_k = k > 0 && k < args.vocab_size, filter_p = top_p < 1.0f;
  uint32_t tau = 0;
  if (filter_k || filter_p) tau = FilterThreshold(s, row, k, filter_k, top_p, filter_p);
  const double u = SamplingUniformImpl(args.seeds[r], args.steps[r]);
  const int32_t token = DrawPass(s, row, tau, u);
  if (threadIdx.x == 0) args.out_tokens[r] = token;
}

}  // namespace

absl::Status Sampling(const SamplingArgs& args, cudaStream_t stream) {
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
  CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(SamplingKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  SamplingKernel<<<args.batch, kSampleThreads, smem, stream>>>(args, vec_ok);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tandem
