// Streaming cluster kernel for the rows without top-k or top-p (greedy and temperature only): a
// cluster of kCluster small CTAs per row streams the row from HBM once with many loads in flight
// (no shared-memory copy of the row, so many rows are in flight), keeping per (tile, warp) entry of
// 128 logits its max m_e and S_e = sum 2^((x - m_e) * scale) (online softmax). After the cluster's
// max M is exchanged, entry masses are S_e * 2^((m_e - M) * scale) in fixed point; the CTA holding
// u * (total) finds the entry and re-reads its 128 logits (512 bytes, usually from L2) to draw
// with the exact weights 2^((x - M) * scale) of sampling.h. With top-k (Sampling()'s dispatch),
// top-k rows with k <= kStreamTopKMax are streamed too (sampling_stream_topk.cuh); other rows with
// top-k or top-p are left to the resident cluster kernel (sampling_cluster.cu). Persistent: as many
// clusters as fit loop over the rows, so rows left to the other kernel cost little. Two builds
// (StreamBuild, sampling_variants.h): with the top-k row code, and without it for callers whose
// rows never use top-k (its registers, spills and shared memory cost greedy and temperature rows
// ~3 us at batch 256: WORKLOG.md session 5).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
#include "kernels/common/launch_config.cuh"
#include "kernels/common/pdl.cuh"
#include "kernels/sampling/sampling.h"
#include "kernels/sampling/sampling_cluster.cuh"
#include "kernels/sampling/sampling_draw.cuh"
#include "kernels/sampling/sampling_rng.h"
#include "kernels/sampling/sampling_stream.cuh"
#include "kernels/sampling/sampling_stream_topk.cuh"
#include "kernels/sampling/sampling_variants.h"

namespace tandem {
namespace {

using namespace sampling_stream;  // NOLINT: this kernel's own helpers
using sampling_cluster::DrawOwner;
using sampling_cluster::ForEachRow;
using sampling_cluster::Peer;
using sampling_cluster::RowMath;
using sampling_cluster::SliceLength;
using sampling_internal::Better;
using sampling_internal::FastExp2;
namespace cg = cooperative_groups;

// One pass over the slice: greedy, this CTA's (max, lowest id); with_sums, its max (the id is
// then only the first of an entry holding it: a fallback) and each entry's m_e, S_e.
template <typename S>
__device__ ArgMaxPair StreamPass(S& s, const Slice& sl, bool vec_ok, float scale, bool with_sums) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // Ids grow within a thread, so the first strict maximum is its lowest id (-inf rows included).
  ArgMaxPair best{-INFINITY, 4 * static_cast<int>(threadIdx.x) < sl.n
                                 ? sl.base + 4 * static_cast<int32_t>(threadIdx.x)
                                 : INT32_MAX};
  for (int t0 = 0; t0 < kSliceTiles; t0 += kGroup) {
    if (t0 * kTileElems >= sl.n) break;  // uniform
    float q[kGroup][4];
    LoadGroup(sl, vec_ok, t0, q);
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      const int tile = t0 + g;
      if (tile >= kSliceTiles) break;
      const int local = tile * kTileElems + 4 * threadIdx.x;
      if (!with_sums) {  // greedy: the exact argmax
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (local + e < sl.n && q[g][e] > best.value) {
            best = ArgMaxPair{q[g][e], sl.base + local + e};
          }
        }
        continue;
      }
      // Temperature: only the max is needed (the draw picks the token); warp max through the
      // order-preserving keys (one REDUX instead of five shuffles).
      const float m = KeyToFloat(__reduce_max_sync(
          0xffffffffu, KeyOf(fmaxf(fmaxf(q[g][0], q[g][1]), fmaxf(q[g][2], q[g][3])))));
      if (m > best.value) best = ArgMaxPair{m, sl.base + tile * kTileElems + warp * 128};
      float sum = 0.0f;
      if (m != -INFINITY) {
#pragma unroll
        for (int e = 0; e < 4; ++e) sum += FastExp2((q[g][e] - m) * scale);
      }
#pragma unroll
      for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      if (lane == 0) {
        s.entry_max[tile * kWarps + warp] = m;
        s.entry_sum[tile * kWarps + warp] = sum;
      }
    }
  }
  return sampling_internal::BlockArgMax<kWarps>(best, s.argmax_scratch);
}

// Warp 0 of the CTA holding `rest` (< its mass): the entry holding it, then the draw over its 128
// logits re-read from global memory with the exact weights. -1 if none has weight.
template <typename E>
__device__ int32_t DrawInEntry(const E& s, const Slice& sl, bool vec_ok, const RowMath& row,
                               uint64_t rest) {
  constexpr int kPerLane = kEntrySlots / 32;
  const int lane = threadIdx.x;
  const sampling_internal::WarpPick pick =
      sampling_internal::WarpFindInterval<kPerLane>(s.entry_mass, rest);
  if (pick.index < 0) return -1;
  const int entry = pick.index;
  // Lane l holds logits 4l..4l+3 of the entry (tile entry / kWarps, warp entry % kWarps).
  const int tile = entry / kWarps, first = tile * kTileElems + (entry % kWarps) * 128;
  float q[4];
  Load4(sl, vec_ok, first + 4 * lane, q);
  return sampling_internal::DrawIn128(q, sl.base + first, row, pick.rest);
}

// One row (greedy or temperature only); every CTA of the cluster calls it with the same row.
template <typename S>
__device__ void StreamRow(S& s, const SamplingArgs& args, int64_t r, int parity, bool vec_ok,
                          int slice_len) {
  const float temperature = args.temperature[r];
  const bool greedy = !(temperature > 0.0f);
  const int rank = static_cast<int>(cg::this_cluster().block_rank());
  const int64_t begin = int64_t{rank} * slice_len;
  const Slice sl{args.logits + r * args.vocab_size + begin,
                 SliceLength(slice_len, args.vocab_size, rank), static_cast<int32_t>(begin)};
  const float scale = greedy ? 0.0f : kSamplingLog2e / temperature;
  ArgMaxPair best = StreamPass(s, sl, vec_ok, scale, !greedy);
  if (threadIdx.x < kCluster) *Peer(&s.peer_best[parity][rank], threadIdx.x) = best;
  cg::this_cluster().sync();
  for (int i = 0; i < kCluster; ++i) best = Better(best, s.peer_best[parity][i]);
  if (greedy || best.value == -INFINITY) {
    if (rank == 0 && threadIdx.x == 0) args.out_tokens[r] = best.id;
    return;
  }
  const RowMath row{best.value, scale, 0.0f};
  uint64_t mass = 0;
  if (threadIdx.x < kEntrySlots) {
    const int e = threadIdx.x;
    const bool live = e < kEntries && e * 128 < sl.n && s.entry_max[e] != -INFINITY;
    mass = live ? RowMath::Fixed(s.entry_sum[e] * row.WeightF(s.entry_max[e])) : 0;
    s.entry_mass[e] = mass;
  }
  mass = sampling_internal::BlockSum<kWarps>(mass, s.scratch);
  if (threadIdx.x < kCluster) *Peer(&s.peer_total[rank], threadIdx.x) = mass;
  cg::this_cluster().sync();
  uint64_t rest = 0;
  const DrawOwner owner = sampling_cluster::FindDrawTarget(
      s.peer_total, rank, SamplingUniformImpl(args.seeds[r], args.steps[r]), &rest);
  if (owner == DrawOwner::kNoMass) {  // keep the argmax
    if (rank == 0 && threadIdx.x == 0) args.out_tokens[r] = best.id;
    return;
  }
  if (threadIdx.x >= 32 || owner != DrawOwner::kThis) return;
  const int32_t token = DrawInEntry(s, sl, vec_ok, row, rest);
  if (threadIdx.x == 0) args.out_tokens[r] = token >= 0 ? token : best.id;
}

// Persistent: cluster c takes the rows c, c + clusters, ... without top-k or top-p, and with
// kTopK && with_top_k the top-k rows of StreamsTopK (their leader CTA rotating over the cluster).
template <bool kTopK>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kThreads, 4)
    SamplingStreamKernel(const __grid_constant__ SamplingArgs args, bool vec_ok, int slice_len,
                         bool with_top_k) {
  using S = std::conditional_t<kTopK, StreamShared, StreamSharedLean>;
  S& s = SharedOf<S>();
  if constexpr (kTopK) {
    InitTopK(s.topk);
    __syncthreads();
    // Peers may push only once every CTA of the cluster runs and has initialised its buffers.
    cg::this_cluster().sync();
  } else {  // nothing to initialise: peers may push once every CTA of the cluster runs
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
    asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
  }
  int parity = 0, top_k_rows = 0;
  const int64_t first = blockIdx.x / kCluster, stride = gridDim.x / kCluster;
  ForEachRow<kThreads>(
      s.row_flags, first, stride, args.batch,
      [&](int64_t r) {
        const sampling_cluster::RowParams p = sampling_cluster::RowParams::Load(args, r);
        return !p.Filtered(args.vocab_size) ||
               (kTopK && with_top_k && p.StreamsTopK(args.vocab_size));
      },
      [&](int64_t r) {
        if constexpr (kTopK) {
          if (with_top_k && sampling_cluster::StreamsTopK(args, r)) {
            TopKRow(args, r, top_k_rows, vec_ok, slice_len);
            ++top_k_rows;
          } else {
            StreamRow(s, args, r, parity, vec_ok, slice_len);
            parity ^= 1;
          }
        } else {
          StreamRow(s, args, r, parity, vec_ok, slice_len);
          parity ^= 1;
        }
        __syncthreads();
      });
  // The resident kernel, launched behind this one with programmatic dependent launch
  // (SamplingClusterLaunch), may start once every CTA has come here; it waits for this kernel's
  // end before it reads a token.
  AllowDependentLaunch();
  // No CTA leaves while a peer may still push into its shared memory or arrive on its mbarrier.
  if constexpr (kTopK) cg::this_cluster().sync();
}

// How many clusters of a build fit at once (the persistent grid), once per device.
template <bool kTopK>
absl::Status FitClusters(int* fit) {
  static std::atomic<int> max_clusters[kMaxDevices];
  const absl::StatusOr<int> n = CachedPerDevice(max_clusters, []() -> absl::StatusOr<int> {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(kCluster * 256);
    config.blockDim = dim3(kThreads);
    int clusters = 0;
    CUDA_RETURN_IF_ERROR(
        cudaOccupancyMaxActiveClusters(&clusters, SamplingStreamKernel<kTopK>, &config));
    if (clusters <= 0) return absl::InternalError("SamplingStream: no cluster fits the device");
    return clusters;
  });
  if (!n.ok()) return n.status();
  *fit = *n;
  return absl::OkStatus();
}

template <bool kTopK>
absl::Status Launch(const SamplingArgs& args, bool vec_ok, int slice_len, bool with_top_k,
                    cudaStream_t stream) {
  int fit = 0;
  if (absl::Status st = FitClusters<kTopK>(&fit); !st.ok()) return st;
  const int64_t clusters = std::min<int64_t>(args.batch, fit);
  SamplingStreamKernel<kTopK>
      <<<clusters * kCluster, kThreads, 0, stream>>>(args, vec_ok, slice_len, with_top_k);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

template <bool kTopK>
std::string Describe() {
  int fit = 0;
  if (absl::Status st = FitClusters<kTopK>(&fit); !st.ok()) return std::string(st.message());
  cudaFuncAttributes a = {};
  if (cudaFuncGetAttributes(&a, SamplingStreamKernel<kTopK>) != cudaSuccess) return "no attrs";
  return absl::StrCat("clusters=", fit, " regs=", a.numRegs, " local_bytes=", a.localSizeBytes,
                      " static_smem=", a.sharedSizeBytes,
                      " carveout_pref=", a.preferredShmemCarveout);
}

}  // namespace

absl::Status SamplingStreamLaunch(const SamplingArgs& args, bool with_top_k, cudaStream_t stream,
                                  StreamBuild build) {
  if (args.batch < 0 || args.vocab_size <= 0 || !SamplingClusterSupports(args.vocab_size)) {
    return absl::InvalidArgumentError("SamplingStream: needs batch >= 0, 0 < vocab <= 155648");
  }
  if (with_top_k && build == StreamBuild::kNoTopK) {
    return absl::InvalidArgumentError("SamplingStream: the kNoTopK build has no top-k rows");
  }
  if (args.batch == 0) return absl::OkStatus();
  const bool vec_ok =
      args.vocab_size % 4 == 0 && (reinterpret_cast<uintptr_t>(args.logits) & 15u) == 0;
  const int slice_len = static_cast<int>((args.vocab_size + 4 * kCluster - 1) / (4 * kCluster) * 4);
  return build == StreamBuild::kNoTopK ? Launch<false>(args, vec_ok, slice_len, with_top_k, stream)
                                       : Launch<true>(args, vec_ok, slice_len, with_top_k, stream);
}

std::string SamplingStreamDescribe(StreamBuild build) {
  return build == StreamBuild::kNoTopK ? Describe<false>() : Describe<true>();
}

}  // namespace tandem
