// Resident cluster sampling kernel: each row is read from HBM once, by a cluster of kCluster CTAs
// that keep it in their shared memory (a slice of <= kSliceCap logits each); every later pass runs
// over shared memory, and the CTAs exchange small results through distributed shared memory.
// Semantics exactly those of sampling.h (and of the one-block-per-row kernel,
// sampling_one_block.cu). Persistent: a grid of at most as many clusters as fit the GPU at once
// loops over the rows. Per row, cluster barriers (|) between the phases; "push" = stores into
// peers' shared memory:
//   load slice + argmax, push (max, id) to all | greedy: done.
//   top-k / top-p only:
//     histogram of the distance from the max (bins of 1/32 of a temperature unit): counts with
//     top-k, exact fixed-point masses for top-p-only rows, in each CTA | with top-k rank 0 pulls
//     them all, brackets the thresholds to a bin range [b_lo, b_hi] (exact: bins below are surely
//     kept), pushes it; top-p only: each CTA merges a range of bins, and then every CTA finds the
//     top-p bin itself (sampling_cluster_topp.cuh) |
//     top-p only: the draws by rejection (sampling.h, step 5) over every logit's mass; a draw
//     above the top-p bin is the token, one below it is dropped, and only a draw in that bin
//     needs what follows (TopPAttempt) |
//     every CTA pushes its logits in that range to rank 0 (candidates) | rank 0 runs the exact
//     selects (top-p only: sub-bin masses and a block scan; else, or for many ties there, radix
//     selects, one warp when few; over the whole row in DSMEM if they overflow), pushes tau |
//   kept mass (key >= tau) per (tile, warp) entry, push the CTA's total to all | the CTA holding
//   u * (total) finds the entry and draws inside it (one warp).
// Shared memory read by peers is never rewritten before a barrier that the readers pass after
// reading (peer_best alternates by row parity: greedy rows end at its barrier).
#include <algorithm>
#include <atomic>
#include <cstdint>

#include "absl/status/statusor.h"
#include "base/cuda_check.h"
#include "kernels/common/launch_config.cuh"
#include "kernels/sampling/sampling.h"
#include "kernels/sampling/sampling_cluster.cuh"
#include "kernels/sampling/sampling_cluster_draw.cuh"
#include "kernels/sampling/sampling_cluster_select.cuh"
#include "kernels/sampling/sampling_cluster_topp.cuh"
#include "kernels/sampling/sampling_rng.h"
#include "kernels/sampling/sampling_variants.h"

namespace tandem {
namespace {

using namespace sampling_cluster;  // NOLINT: this kernel's own helpers
using sampling_internal::Better;

// Loads the slice into shared memory and returns the CTA's (max, lowest id). The loads are
// asynchronous copies (cp.async, 16 bytes, no registers held), all in flight at once; NaN and
// padding become -inf.
__device__ ArgMaxPair LoadSlice(ClusterShared& s, const Slice& sl, bool vec_ok) {
#pragma unroll
  for (int j = 0; j < kSliceTiles; ++j) {
    const int local = j * kTileElems + 4 * threadIdx.x;
    if (local >= kSliceCap) break;
    if (vec_ok && local + 3 < sl.n) {
      const auto dst = static_cast<uint32_t>(__cvta_generic_to_shared(&s.x[local]));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(sl.logits + local)
                   : "memory");
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e)
        s.x[local + e] = local + e < sl.n ? sl.logits[local + e] : -INFINITY;
    }
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  __syncthreads();
  // Ids grow within a thread, so the first strict maximum is its lowest id (-inf rows included).
  ArgMaxPair best{-INFINITY, 4 * static_cast<int>(threadIdx.x) < sl.n
                                 ? sl.base + 4 * static_cast<int32_t>(threadIdx.x)
                                 : INT32_MAX};
  for (int j = 0; j < kSliceTiles; ++j) {
    const int local = j * kTileElems + 4 * threadIdx.x;
    if (local >= sl.n) break;
    float4* p = reinterpret_cast<float4*>(&s.x[local]);
    const float4 v = *p;
    float q[4] = {v.x, v.y, v.z, v.w};
    bool nan = false;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      nan |= isnan(q[e]);
      q[e] = isnan(q[e]) ? -INFINITY : q[e];
      if (local + e < sl.n && q[e] > best.value) best = ArgMaxPair{q[e], sl.base + local + e};
    }
    if (nan) *p = make_float4(q[0], q[1], q[2], q[3]);
  }
  return sampling_internal::BlockArgMax<kWarps>(best, s.argmax_scratch);
}

// min_p (sampling.h, step 3): the logits of this CTA's slice below `cutoff` become -inf, as if
// the row had never had them (every later pass reads the slice from shared memory). Peers read
// a slice only after the cluster barrier that ends the histogram pass.
__device__ void DropBelow(ClusterShared& s, const Slice& sl, float cutoff) {
  for (int i = threadIdx.x; i < sl.n; i += kThreads) {
    if (s.x[i] < cutoff) s.x[i] = -INFINITY;
  }
  __syncthreads();
}

// Histogram of this CTA's slice in its own shared memory, which the merge pulls after the barrier
// that ends this pass: counts (rows with top-k), or exact fixed-point masses (top-p-only rows).
__device__ void HistogramPass(ClusterShared& s, const Slice& sl, const RowMath& row,
                              bool with_mass) {
  for (int j = 0; j < kSliceTiles; ++j) {
    const int local = j * kTileElems + 4 * threadIdx.x;
    if (local >= sl.n) break;
    const float4 v = *reinterpret_cast<const float4*>(&s.x[local]);
    const float q[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (local + e >= sl.n) break;
      const uint32_t bin = row.Bin(q[e]);
      if (!with_mass) {
        atomicAdd(&s.a.hist.count[bin], 1u);
      } else {
        const uint64_t w = row.Weight(q[e]);
        if (w != 0) sampling_internal::AtomicAddSplit64(&s.a.hist.lo[bin], &s.a.hist.hi[bin], w);
      }
    }
  }
  ClusterSync();
}

// Every CTA pushes its logits in bins [b_lo, b_hi] to rank 0 (one reservation per warp and
// element slot). Ends with the barrier that publishes them.
__device__ void GatherCandidates(ClusterShared& s, const Slice& sl, const RowMath& row) {
  const uint32_t b_lo = s.b_lo, b_hi = s.b_hi;
  uint32_t* count = Peer(&s.cand_count, 0);
  float* cand = Peer(s.cand, 0);
  int32_t* cand_id = Peer(s.cand_id, 0);
  const int lane = threadIdx.x % 32;
  for (int j = 0; j < kSliceTiles; ++j) {
    const int local = j * kTileElems + 4 * threadIdx.x;
    if (j * kTileElems >= sl.n) break;  // uniform
    const float4 v = local < sl.n ? *reinterpret_cast<const float4*>(&s.x[local])
                                  : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
    const float q[4] = {v.x, v.y, v.z, v.w};
    bool want[4], any = false;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const uint32_t bin = row.Bin(q[e]);
      want[e] = local + e < sl.n && bin >= b_lo && bin <= b_hi;
      any |= want[e];
    }
    if (!__any_sync(0xffffffffu, any)) continue;  // candidates are rare
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const uint32_t mask = __ballot_sync(0xffffffffu, want[e]);
      if (mask == 0) continue;
      const int leader = __ffs(mask) - 1;
      uint32_t slot = 0;
      if (lane == leader) slot = atomicAdd(count, __popc(mask));
      slot = __shfl_sync(0xffffffffu, slot, leader) + __popc(mask & ((1u << lane) - 1));
      if (want[e] && slot < kCandCap) cand[slot] = q[e], cand_id[slot] = sl.base + local + e;
    }
  }
  ClusterSync();
}

// Rank 0: the exact threshold from the candidates (or the whole row), pushed to every CTA.
constexpr uint32_t kWarpSelectMax = 1024;  // candidates one warp selects from
__device__ void SelectAndPushTau(ClusterShared& s, const RowMath& row, int64_t k, bool filter_k,
                                 float top_p, bool filter_p, int slice_len, int64_t vocab) {
  const uint32_t n = s.cand_count;
  if (n <= kWarpSelectMax) {  // one warp, no block barriers
    if (threadIdx.x >= 32) return;
    const uint32_t tau = SelectThresholds<32>(s, row, CandidateView{n}, s.cnt_sure, s.mass_sure,
                                              s.z, k, filter_k, top_p, filter_p);
    if (threadIdx.x < kCluster) *Peer(&s.tau, threadIdx.x) = tau;
    return;
  }
  uint32_t tau;
  if (n <= kCandCap) {
    tau = SelectThresholds<kThreads>(s, row, CandidateView{n}, s.cnt_sure, s.mass_sure, s.z, k,
                                     filter_k, top_p, filter_p);
  } else {
    tau = SelectThresholds<kThreads>(s, row, DistributedView{slice_len, vocab}, 0, 0, s.z, k,
                                     filter_k, top_p, filter_p);
  }
  if (threadIdx.x < kCluster) *Peer(&s.tau, threadIdx.x) = tau;
}

// Top-p rows without top-k (sampling.h, step 5), every CTA, all threads, after EntryMassPass over
// every logit: draw `attempt` from the whole distribution. The CTA holding it pushes to every CTA
// the token if top-p keeps it, else -1, or, before the exact threshold is known (exact false),
// -2 when the bracket cannot tell: the draw's bin is the top-p bin b_lo (the bins above it are
// kept, those below it are not, by the exact masses that chose it). kNoDraw when the row has no
// mass (cannot happen: the max weighs 1). The same value in every CTA.
constexpr int32_t kUndecided = -2, kNoDraw = -3;
__device__ int32_t TopPAttempt(ClusterShared& s, const Slice& sl, const RowMath& row,
                               const SamplingArgs& args, int64_t r, uint32_t attempt, bool exact,
                               uint32_t tau) {
  uint64_t rest = 0;
  const double u = SamplingUniformImpl(args.seeds[r], args.steps[r], attempt);
  const DrawOwner owner = FindDrawTarget(s.peer_total, sl.rank, u, &rest);
  if (owner == DrawOwner::kNoMass) return kNoDraw;  // uniform
  if (owner == DrawOwner::kThis && threadIdx.x < 32) {
    const int32_t t = DrawInSlice(s, sl, row, 0, rest);
    int32_t verdict = -1;
    if (t >= 0) {
      const float x = s.x[t - sl.base];
      const int bin = static_cast<int>(row.Bin(x));
      verdict = exact ? (KeyOf(x) >= tau ? t : -1)
                      : (bin < s.b_lo   ? t
                         : bin > s.b_lo ? -1
                                        : kUndecided);
    }
    if (threadIdx.x < kCluster) *Peer(&s.a.attempt_token[attempt & 1], threadIdx.x) = verdict;
  }
  ClusterSync();
  return s.a.attempt_token[attempt & 1];
}

// One row; every CTA of the cluster calls it with the same row. Returns after the row's last
// cluster barrier (the caller's block barrier then protects shared memory from the next row).
__device__ void SampleRow(ClusterShared& s, const SamplingArgs& args, int64_t r, int parity,
                          bool vec_ok, int slice_len) {
  const int rank = static_cast<int>(cg::this_cluster().block_rank());
  const int64_t begin = int64_t{rank} * slice_len;
  const Slice sl{args.logits + r * args.vocab_size + begin,
                 SliceLength(slice_len, args.vocab_size, rank), static_cast<int32_t>(begin), rank};
  for (int b = threadIdx.x; b < kBins; b += kThreads) {
    s.a.hist.count[b] = 0, s.a.hist.lo[b] = 0, s.a.hist.hi[b] = 0;
  }
  if (threadIdx.x == 0) s.cand_count = 0;
  ArgMaxPair best = LoadSlice(s, sl, vec_ok);
  if (threadIdx.x < kCluster) *Peer(&s.peer_best[parity][rank], threadIdx.x) = best;
  ClusterSync();
  for (int i = 0; i < kCluster; ++i) best = Better(best, s.peer_best[parity][i]);
  const float temperature = args.temperature[r];
  if (!(temperature > 0.0f) || best.value == -INFINITY) {
    if (rank == 0 && threadIdx.x == 0) args.out_tokens[r] = best.id;
    return;
  }
  const RowMath row{best.value, kSamplingLog2e / temperature, kBinsPerUnit / temperature};
  const float min_p = args.min_p != nullptr ? args.min_p[r] : 0.0f;
  if (min_p > 0.0f) DropBelow(s, sl, best.value + log2f(min_p) / row.scale);
  const int64_t k = args.top_k[r];
  const float top_p = args.top_p[r];
  const bool filter_k = k > 0 && k < args.vocab_size, filter_p = top_p < 1.0f;
  uint32_t tau = 0;  // keeps every logit
  const bool top_p_only = filter_p && !filter_k;
  uint32_t attempt = 0;  // top-p only: the draws from the whole distribution made
  if (filter_k || filter_p) {
    HistogramPass(s, sl, row, /*with_mass=*/!filter_k);
    if (!filter_k) {  // top-p only: every CTA merges a range of bins (sampling_cluster_topp.cuh)
      MergeRange(s, rank);
    } else if (rank == 0) {
      MergeAndBracket(s, k, filter_p);
    }
    ClusterSync();
    if (top_p_only) {
      BracketTopP(s, top_p);
      // Most draws land outside the top-p bin: the row ends without its candidates and select.
      EntryMassPass(s, sl, row, 0);
      for (; attempt < kTopPAttempts; ++attempt) {
        const int32_t got = TopPAttempt(s, sl, row, args, r, attempt, /*exact=*/false, 0);
        if (got >= 0) {
          if (rank == 0 && threadIdx.x == 0) args.out_tokens[r] = got;
          return;
        }
        if (got != -1) break;  // undecided (or no mass): the exact threshold decides
      }
    }
    GatherCandidates(s, sl, row);
    if (s.direct) {  // rank 0 finishes the row alone; the others go on to their next row
      if (rank != 0 || threadIdx.x >= 32) return;
      const uint32_t n = s.cand_count;
      const uint32_t tau_few =
          SelectThresholds<32>(s, row, CandidateView{n}, 0, 0, 0, k, filter_k, top_p, filter_p);
      const double u = SamplingUniformImpl(args.seeds[r], args.steps[r]);
      const int32_t token = DrawFromCandidates(s, row, tau_few, n, u);
      if (threadIdx.x == 0) args.out_tokens[r] = token >= 0 ? token : best.id;
      return;
    }
    if (rank == 0) {
      const uint32_t n = s.cand_count;
      if (filter_k || n > kCandCap || !SelectTopPBySubBins(s, row, n, top_p)) {
        SelectAndPushTau(s, row, k, filter_k, top_p, filter_p, slice_len, args.vocab_size);
      }
    }
    ClusterSync();
    tau = s.tau;
  }
  if (top_p_only) {  // the draws left, from the undecided one on, against the exact threshold
    for (; attempt < kTopPAttempts; ++attempt) {
      const int32_t got = TopPAttempt(s, sl, row, args, r, attempt, /*exact=*/true, tau);
      if (got >= 0) {
        if (rank == 0 && threadIdx.x == 0) args.out_tokens[r] = got;
        return;
      }
      if (got == kNoDraw) break;
    }
  }
  EntryMassPass(s, sl, row, tau);
  uint64_t rest = 0;
  const DrawOwner owner = FindDrawTarget(
      s.peer_total, rank, SamplingUniformImpl(args.seeds[r], args.steps[r], attempt), &rest);
  if (owner == DrawOwner::kNoMass) {  // keep the argmax
    if (rank == 0 && threadIdx.x == 0) args.out_tokens[r] = best.id;
    return;
  }
  if (threadIdx.x >= 32 || owner != DrawOwner::kThis) return;
  const int32_t token = DrawInSlice(s, sl, row, tau, rest);
  if (threadIdx.x == 0) args.out_tokens[r] = token >= 0 ? token : best.id;
}

// Persistent: cluster c takes rows c, c + clusters, ...
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kThreads, 2)
    SamplingClusterKernel(const __grid_constant__ SamplingArgs args, bool vec_ok, int slice_len) {
  extern __shared__ __align__(16) unsigned char smem[];
  ClusterShared& s = *reinterpret_cast<ClusterShared*>(smem);
  // Peers may push only once every CTA of the cluster runs: arrive now, wait before a first push.
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
  int parity = 0;
  for (int64_t r = blockIdx.x / kCluster; r < args.batch; r += gridDim.x / kCluster) {
    SampleRow(s, args, r, parity, vec_ok, slice_len);
    parity ^= 1;
    __syncthreads();
  }
}

}  // namespace

bool SamplingClusterSupports(int64_t vocab_size) { return vocab_size <= kMaxVocab; }

namespace {

// Per device, once: the shared-memory limit raised, and how many clusters fit at once (the
// persistent grid). Not per call: keeps steady-state calls to one launch (CUDA graph capture).
absl::StatusOr<int> ConfigureClusterKernel() {
  static std::atomic<int> max_clusters[kMaxDevices];
  return CachedPerDevice(max_clusters, []() -> absl::StatusOr<int> {
    const int smem = static_cast<int>(sizeof(ClusterShared));
    CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(SamplingClusterKernel,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(kCluster * 256);
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = smem;
    int n = 0;
    CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveClusters(&n, SamplingClusterKernel, &config));
    if (n <= 0) return absl::InternalError("SamplingCluster: no cluster fits the device");
    return n;
  });
}

}  // namespace

absl::Status SamplingCluster(const SamplingArgs& args, cudaStream_t stream) {
  if (args.batch < 0 || args.vocab_size <= 0 || !SamplingClusterSupports(args.vocab_size)) {
    return absl::InvalidArgumentError("SamplingCluster: needs batch >= 0, 0 < vocab <= 155648");
  }
  if (args.batch == 0) return absl::OkStatus();
  const absl::StatusOr<int> max_clusters = ConfigureClusterKernel();
  if (!max_clusters.ok()) return max_clusters.status();
  const bool vec_ok =
      args.vocab_size % 4 == 0 && (reinterpret_cast<uintptr_t>(args.logits) & 15u) == 0;
  const int slice_len = static_cast<int>((args.vocab_size + 4 * kCluster - 1) / (4 * kCluster) * 4);
  const int64_t clusters = std::min<int64_t>(args.batch, *max_clusters);
  SamplingClusterKernel<<<static_cast<unsigned>(clusters * kCluster), kThreads,
                          sizeof(ClusterShared), stream>>>(args, vec_ok, slice_len);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tandem
