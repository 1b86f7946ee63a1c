// Cluster sampling kernel: each row is read from HBM once, by a cluster of kCluster CTAs that keep
// it in their shared memory (a slice of <= kSliceCap logits each); every later pass runs over
// shared memory, and the CTAs exchange small results through distributed shared memory (DSMEM).
// Semantics exactly those of sampling.h (and of the one-block-per-row kernel in sampling.cu).
// Per row, with cluster barriers (|) between phases; "push" = stores into peers' shared memory:
//   load slice + argmax, push (max, id) to all | greedy: done.
//   top-k / top-p only:
//     histogram of the distance from the max (bins of 1/32 of a temperature unit): counts, and
//     with top-p exact fixed-point masses; pushed (atomically added) into rank 0 |
//     rank 0 brackets the thresholds to a bin range [b_lo, b_hi] (exact: bins below are surely
//     kept) and pushes it | every CTA pushes its logits in that range to rank 0 (candidates) |
//     rank 0 runs the exact radix selects (over the whole row in DSMEM if the candidates overflow)
//     and pushes tau |
//   kept mass (key >= tau) per (tile, warp) entry, push the CTA's total to all | the CTA holding
//   u * (total) finds the entry and draws inside it (one warp).
// No CTA touches a peer's shared memory after the last barrier it takes part in, so CTAs exit
// as soon as their part is done.
#include <atomic>
#include <cstdint>

#include "base/cuda_check.h"
#include "kernels/sampling/sampling.h"
#include "kernels/sampling/sampling_cluster.cuh"
#include "kernels/sampling/sampling_cluster_select.cuh"
#include "kernels/sampling/sampling_rng.h"
#include "kernels/sampling/sampling_variants.h"

namespace tandem {
namespace {

using namespace sampling_cluster;  // NOLINT: this kernel's own helpers
using sampling_internal::Better;

// This CTA's part of a row.
struct Slice {
  const float* logits;  // the slice in global memory, n logits
  int n;                // 0 .. kSliceCap
  int32_t base;         // id of the first logit
  int rank;
};

__device__ __forceinline__ void ClusterSync() { cg::this_cluster().sync(); }

template <typename T>
__device__ __forceinline__ T* Peer(T* p, int rank) {
  return cg::this_cluster().map_shared_rank(p, rank);
}

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
  ArgMaxPair best{-INFINITY, INT32_MAX};
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
      if (local + e < sl.n) best = Better(best, ArgMaxPair{q[e], sl.base + local + e});
    }
    if (nan) *p = make_float4(q[0], q[1], q[2], q[3]);
  }
  return sampling_internal::BlockArgMax<kWarps>(best, s.argmax_scratch);
}

// Histogram of this CTA's slice (counts; masses when with_mass), added into rank 0's cluster
// histogram. Ends with the cluster barrier that publishes it.
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
      atomicAdd(&s.a.hist.count[bin], 1u);
      if (with_mass) {
        const uint64_t w = row.Weight(q[e]);
        if (w != 0) sampling_internal::AtomicAddSplit64(&s.a.hist.lo[bin], &s.a.hist.hi[bin], w);
      }
    }
  }
  __syncthreads();
  uint32_t* count = Peer(s.b.merged.count, 0);
  uint32_t* mass_lo = Peer(s.b.merged.mass_lo, 0);
  uint32_t* mass_hi = Peer(s.b.merged.mass_hi, 0);
  for (int b = threadIdx.x; b < kBins; b += kThreads) {
    if (s.a.hist.count[b] != 0) atomicAdd(&count[b], s.a.hist.count[b]);
    const uint64_t m = sampling_internal::Split64(s.a.hist.lo[b], s.a.hist.hi[b]);
    if (m & ((1u << kMassLoBits) - 1)) {
      atomicAdd(&mass_lo[b], static_cast<uint32_t>(m & ((1u << kMassLoBits) - 1)));
    }
    if (m >> kMassLoBits) atomicAdd(&mass_hi[b], static_cast<uint32_t>(m >> kMassLoBits));
  }
  ClusterSync();
}

// Warp 0 of rank 0 over the cluster histogram: lane l owns bins [32 l, 32 l + 32).
constexpr int kBinsPerLane = kBins / 32;

__device__ __forceinline__ uint64_t MergedMass(const ClusterShared& s, int b) {
  return s.b.merged.mass_lo[b] + (static_cast<uint64_t>(s.b.merged.mass_hi[b]) << kMassLoBits);
}

// The first bin whose inclusive prefix of value(b) reaches target (kBins - 1 if none).
template <typename F>
__device__ int FirstBinReaching(F&& value, uint64_t target) {
  const int lane = threadIdx.x;
  uint64_t mine = 0;
#pragma unroll 1
  for (int j = 0; j < kBinsPerLane; ++j) mine += value(kBinsPerLane * lane + j);
  uint64_t incl = mine;
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const uint64_t y = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += y;
  }
  const uint32_t hits = __ballot_sync(0xffffffffu, incl >= target);
  int bin = kBins - 1;
  if (hits != 0 && lane == __ffs(hits) - 1) {
    uint64_t cum = incl - mine;
#pragma unroll 1
    for (int j = 0; j < kBinsPerLane; ++j) {
      cum += value(kBinsPerLane * lane + j);
      if (cum >= target) {
        bin = kBinsPerLane * lane + j;
        break;
      }
    }
  }
  return __shfl_sync(0xffffffffu, bin, hits != 0 ? __ffs(hits) - 1 : 0);
}

// Sum of value(b) over the bins b < end.
template <typename F>
__device__ uint64_t SumBelow(F&& value, int end) {
  uint64_t sum = 0;
#pragma unroll 1
  for (int j = 0; j < kBinsPerLane; ++j) {
    const int b = kBinsPerLane * threadIdx.x + j;
    if (b < end) sum += value(b);
  }
  return sampling_internal::WarpSum(sum);
}

// Rank 0, warp 0: the candidate bins [b_lo, b_hi] that surely hold the top-k and top-p thresholds
// (masses are exact, so only the bins that hold a threshold are candidates; with top-k and top-p
// the candidates run from the top-p bin for the smallest possible top-k mass to the top-k bin).
// Pushes the range to every CTA.
__device__ __noinline__ void BracketThresholds(ClusterShared& s, int64_t k, bool filter_k,
                                               float top_p, bool filter_p) {
  auto count = [&](int b) { return uint64_t{s.b.merged.count[b]}; };
  auto mass = [&](int b) { return MergedMass(s, b); };
  const int bk = filter_k ? FirstBinReaching(count, static_cast<uint64_t>(k)) : kBins - 1;
  int b_lo = bk, b_hi = bk;
  uint64_t z = 0;
  if (filter_p && filter_k) {
    const uint64_t z_lo = SumBelow(mass, bk);  // the top-k mass is at least this
    const auto need = static_cast<uint64_t>(ceil(static_cast<double>(top_p) * z_lo));
    b_lo = need == 0 ? 0 : min(FirstBinReaching(mass, need), bk);
  } else if (filter_p) {
    z = SumBelow(mass, kBins);
    const double need = ceil(static_cast<double>(top_p) * static_cast<double>(z));
    b_lo = b_hi = FirstBinReaching(mass, need >= 1.0 ? static_cast<uint64_t>(need) : 1);
  }
  const uint64_t cnt_sure = SumBelow(count, b_lo), mass_sure = SumBelow(mass, b_lo);
  if (threadIdx.x == 0) s.cnt_sure = cnt_sure, s.mass_sure = mass_sure, s.z = z;
  if (threadIdx.x < kCluster) {
    *Peer(&s.b_lo, threadIdx.x) = b_lo;
    *Peer(&s.b_hi, threadIdx.x) = b_hi;
  }
}

// Every CTA pushes its logits in bins [b_lo, b_hi] to rank 0 (one reservation per warp and
// element slot). Ends with the barrier that publishes them.
__device__ void GatherCandidates(ClusterShared& s, const Slice& sl, const RowMath& row) {
  const uint32_t b_lo = s.b_lo, b_hi = s.b_hi;
  uint32_t* count = Peer(&s.cand_count, 0);
  float* cand = Peer(s.b.cand, 0);
  const int lane = threadIdx.x % 32;
  for (int j = 0; j < kSliceTiles; ++j) {
    const int local = j * kTileElems + 4 * threadIdx.x;
    if (j * kTileElems >= sl.n) break;  // uniform
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float x = local + e < sl.n ? s.x[local + e] : -INFINITY;
      const uint32_t bin = row.Bin(x);
      const bool want = local + e < sl.n && bin >= b_lo && bin <= b_hi;
      const uint32_t mask = __ballot_sync(0xffffffffu, want);
      if (mask == 0) continue;
      const int leader = __ffs(mask) - 1;
      uint32_t slot = 0;
      if (lane == leader) slot = atomicAdd(count, __popc(mask));
      slot = __shfl_sync(0xffffffffu, slot, leader) + __popc(mask & ((1u << lane) - 1));
      if (want && slot < kCandCap) cand[slot] = x;
    }
  }
  ClusterSync();
}

// Rank 0: the exact threshold from the candidates (or the whole row), pushed to every CTA.
__device__ void SelectAndPushTau(ClusterShared& s, const RowMath& row, int64_t k, bool filter_k,
                                 float top_p, bool filter_p, int slice_len, int64_t vocab) {
  uint32_t tau;
  if (s.cand_count <= kCandCap) {
    tau = SelectThresholds(s, row, CandidateView{s.cand_count}, s.cnt_sure, s.mass_sure, s.z, k,
                           filter_k, top_p, filter_p);
  } else {
    tau = SelectThresholds(s, row, DistributedView{slice_len, vocab}, 0, 0, s.z, k, filter_k, top_p,
                           filter_p);
  }
  if (threadIdx.x < kCluster) *Peer(&s.tau, threadIdx.x) = tau;
}

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
  uint64_t mine = 0;
  for (int i = 0; i < kPerLane; ++i) mine += s.entry_mass[kPerLane * lane + i];
  uint64_t incl = mine;
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const uint64_t y = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += y;
  }
  const uint32_t hits = __ballot_sync(0xffffffffu, incl > rest);
  if (hits == 0) return -1;
  const int owner = __ffs(hits) - 1;
  int entry = 0;
  uint64_t in_entry = 0;
  if (lane == owner) {
    uint64_t cum = incl - mine;
    for (int i = 0; i < kPerLane; ++i) {
      const uint64_t m = s.entry_mass[kPerLane * lane + i];
      if (cum + m > rest) {
        entry = kPerLane * lane + i, in_entry = rest - cum;
        break;
      }
      cum += m;
    }
  }
  entry = __shfl_sync(0xffffffffu, entry, owner);
  in_entry = __shfl_sync(0xffffffffu, in_entry, owner);
  // The entry's 128 logits: 4 per lane, as EntryMassPass summed them.
  const int local = (entry / kWarps) * kTileElems + (entry % kWarps) * 128 + 4 * lane;
  const float4 v = LoadLocal(s, sl, local);
  const uint64_t m = RowMath::Fixed(KeptSum4(row, v, tau));
  uint64_t excl = m;
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const uint64_t y = __shfl_up_sync(0xffffffffu, excl, off);
    if (lane >= off) excl += y;
  }
  excl -= m;
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

__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kThreads, 2)
    SamplingClusterKernel(const __grid_constant__ SamplingArgs args, bool vec_ok, int slice_len) {
  extern __shared__ __align__(16) unsigned char smem[];
  ClusterShared& s = *reinterpret_cast<ClusterShared*>(smem);
  // Peers may push only once every CTA of the cluster runs: arrive now, wait before the first push.
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
  const int rank = static_cast<int>(cg::this_cluster().block_rank());
  const int64_t r = blockIdx.x / kCluster;
  const int64_t begin = int64_t{rank} * slice_len;
  const Slice sl{args.logits + r * args.vocab_size + begin,
                 SliceLength(slice_len, args.vocab_size, rank), static_cast<int32_t>(begin), rank};
  for (int b = threadIdx.x; b < kBins; b += kThreads) {
    s.a.hist.count[b] = 0, s.a.hist.lo[b] = 0, s.a.hist.hi[b] = 0;
    s.b.merged.count[b] = 0, s.b.merged.mass_lo[b] = 0, s.b.merged.mass_hi[b] = 0;
  }
  if (threadIdx.x == 0) s.cand_count = 0;
  ArgMaxPair best = LoadSlice(s, sl, vec_ok);
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
  if (threadIdx.x < kCluster) *Peer(&s.peer_best[rank], threadIdx.x) = best;
  ClusterSync();
  for (int i = 0; i < kCluster; ++i) best = Better(best, s.peer_best[i]);
  const float temperature = args.temperature[r];
  if (!(temperature > 0.0f) || best.value == -INFINITY) {
    if (rank == 0 && threadIdx.x == 0) args.out_tokens[r] = best.id;
    return;
  }
  const RowMath row{best.value, kSamplingLog2e / temperature, kBinsPerUnit / temperature};
  const int64_t k = args.top_k[r];
  const float top_p = args.top_p[r];
  const bool filter_k = k > 0 && k < args.vocab_size, filter_p = top_p < 1.0f;
  uint32_t tau = 0;  // keeps every logit
  if (filter_k || filter_p) {
    HistogramPass(s, sl, row, filter_p);
    if (rank == 0 && threadIdx.x < 32) BracketThresholds(s, k, filter_k, top_p, filter_p);
    ClusterSync();
    GatherCandidates(s, sl, row);
    if (rank == 0) {
      SelectAndPushTau(s, row, k, filter_k, top_p, filter_p, slice_len, args.vocab_size);
    }
    ClusterSync();
    tau = s.tau;
  }
  EntryMassPass(s, sl, row, tau);
  uint64_t total = 0, before = 0;
  for (int i = 0; i < kCluster; ++i) {
    total += s.peer_total[i];
    before += i < rank ? s.peer_total[i] : 0;
  }
  if (total == 0) {  // cannot happen (the max has weight 1): keep the argmax
    if (rank == 0 && threadIdx.x == 0) args.out_tokens[r] = best.id;
    return;
  }
  const double u = SamplingUniformImpl(args.seeds[r], args.steps[r]);
  const uint64_t target = min(static_cast<uint64_t>(u * static_cast<double>(total)), total - 1);
  const uint64_t mine = s.peer_total[rank];
  if (threadIdx.x >= 32 || target < before || target >= before + mine) return;
  const int32_t token = DrawInSlice(s, sl, row, tau, target - before);
  if (threadIdx.x == 0) args.out_tokens[r] = token >= 0 ? token : best.id;
}

}  // namespace

bool SamplingClusterSupports(int64_t vocab_size) { return vocab_size <= kMaxVocab; }

absl::Status SamplingCluster(const SamplingArgs& args, cudaStream_t stream) {
  if (args.batch < 0 || args.vocab_size <= 0 || !SamplingClusterSupports(args.vocab_size)) {
    return absl::InvalidArgumentError("SamplingCluster: needs batch >= 0, 0 < vocab <= 155648");
  }
  if (args.batch == 0) return absl::OkStatus();
  const bool vec_ok =
      args.vocab_size % 4 == 0 && (reinterpret_cast<uintptr_t>(args.logits) & 15u) == 0;
  const int slice_len = static_cast<int>((args.vocab_size + 4 * kCluster - 1) / (4 * kCluster) * 4);
  const int smem = static_cast<int>(sizeof(ClusterShared));
  // Raise the shared-memory limit once per device (keeps steady-state calls to one launch).
  static std::atomic<uint64_t> configured_devices{0};
  int device = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  const uint64_t bit = uint64_t{1} << (device & 63);
  if ((configured_devices.load(std::memory_order_acquire) & bit) == 0) {
    CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(SamplingClusterKernel,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    configured_devices.fetch_or(bit, std::memory_order_acq_rel);
  }
  SamplingClusterKernel<<<args.batch * kCluster, kThreads, smem, stream>>>(args, vec_ok, slice_len);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tandem
