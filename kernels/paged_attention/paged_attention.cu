// Paged decode attention on sm_90a (FlashDecoding). Numerics: bf16 q/K/V, fp32 scores and
// softmax (log2 domain), P rounded to bf16 for the P.V mma (as FlashAttention does), fp32
// output accumulators.
//
// A 4-warp CTA takes work items (attention_plan.h) of 16 packed rows x one key split through a
// kDecodeStages-deep cp.async pipeline of kDecodeKeys-key tiles; each warp computes a quarter
// of every tile, the warps merge at the end of the item, and the CTA that finishes the last
// split of a range combines the splits (attention_combine.cuh).
#include <cuda_bf16.h>

#include <atomic>

#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "kernels/paged_attention/attention_combine.cuh"
#include "kernels/paged_attention/attention_common.cuh"
#include "kernels/paged_attention/paged_attention.h"

namespace tandem::attention {
namespace {

// Merges the four warps' softmax states of one decode item (each warp saw a quarter of every
// tile) through shared memory and writes the output rows, or the partial rows and their
// log2-sum-exp. `smem` holds [4][16][D] fp32 outputs, then [4][16] maxima and [4][16] sums.
template <int D>
__device__ void MergeWarpsAndStore(const PagedAttentionArgs& a, const AttentionWorkItem& it,
                                   WarpAccum<D>& acc, float* smem, float* partial_out,
                                   float* partial_lse) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  float* o_s = smem;
  float* m_s = o_s + kDecodeWarps * kDecodeRows * D;
  float* l_s = m_s + kDecodeWarps * kDecodeRows;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    acc.l[i] += __shfl_xor_sync(0xffffffffu, acc.l[i], 1);
    acc.l[i] += __shfl_xor_sync(0xffffffffu, acc.l[i], 2);
    const int row = warp * kDecodeRows + g + 8 * i;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      reinterpret_cast<float2*>(o_s + row * D)[n * 4 + t] =
          make_float2(acc.o[n][2 * i], acc.o[n][2 * i + 1]);
    }
    if (t == 0) {
      m_s[row] = acc.m[i];
      l_s[row] = acc.l[i];
    }
  }
  __syncthreads();
  constexpr int kPerThread = D * kDecodeRows / (kDecodeWarps * 32);
  const int r = threadIdx.x * kPerThread / D;
  const int d0 = threadIdx.x * kPerThread % D;
  if (r < it.num_rows) {
    float mx = -INFINITY;
    for (int w = 0; w < kDecodeWarps; ++w) mx = fmaxf(mx, m_s[w * kDecodeRows + r]);
    float e[kDecodeWarps], sum = 0.0f;
    for (int w = 0; w < kDecodeWarps; ++w) {
      const float m = m_s[w * kDecodeRows + r];
      e[w] = m == -INFINITY ? 0.0f : exp2f(m - mx);
      sum += e[w] * l_s[w * kDecodeRows + r];
    }
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    float v[kPerThread];
#pragma unroll
    for (int d = 0; d < kPerThread; ++d) {
      float x = 0.0f;
      for (int w = 0; w < kDecodeWarps; ++w) x += e[w] * o_s[(w * kDecodeRows + r) * D + d0 + d];
      v[d] = x * inv;
    }
    if (it.partial < 0) {
      const int group = a.num_q_heads / a.num_kv_heads;
      const int packed = it.row_begin + r;
      const int64_t token = it.token_begin + packed / group;
      const int head = it.kv_head * group + packed % group;
      auto* dst = reinterpret_cast<uint32_t*>(static_cast<__nv_bfloat16*>(a.out) +
                                              (token * a.num_q_heads + head) * D + d0);
#pragma unroll
      for (int d = 0; d < kPerThread; d += 2) dst[d / 2] = attention::PackBf16(v[d], v[d + 1]);
    } else {
      const int64_t slot = int64_t{it.partial} * kDecodeRows + r;
      auto* dst = reinterpret_cast<float4*>(partial_out + slot * D + d0);
#pragma unroll
      for (int d = 0; d < kPerThread; d += 4) {
        dst[d / 4] = make_float4(v[d], v[d + 1], v[d + 2], v[d + 3]);
      }
      if (d0 == 0) partial_lse[slot] = sum > 0.0f ? mx + log2f(sum) : -INFINITY;
    }
  }
}

// Issues the K/V copies of one decode tile into `buf` (K, then V at + one tile): kEvictFirst
// with the evict-first L2 policy `policy`, else as plain copies (copies carrying an
// evict-normal policy measured ~10% slower than plain ones at batch 32-256: WORKLOG.md step 5).
template <int D, bool kEvictFirst>
__device__ __forceinline__ void LoadDecodeTile(const KvView& view, int key0, int key_end,
                                               __nv_bfloat16* buf, uint64_t policy) {
  constexpr int kTile = TileElems<D, kDecodeKeys>();
  attention::LoadKvTile<D, kDecodeKeys, kDecodeWarps * 32, kEvictFirst>(
      view, key0, key_end, buf, buf + kTile, threadIdx.x, policy);
}

// One CTA per work item at a time: the four warps share a kDecodeStages-deep cp.async pipeline
// of kDecodeKeys-key tiles; warp w computes keys [16 w, 16 w + 16) of every tile with its own
// online softmax, and the states are merged at the end of the item.
// kSplit: the variant for plans with split merges (small batches, a few tiles per item, where
// start-up and tail latency dominate): the CTA's first item is read speculatively together
// with the item count (slot blockIdx.x exists up to max_items) and the next one while the K/V
// stream, the merge item is read ahead (no dependent load before the arrival counter), and the
// K/V copies are evict-first, so the plan, block tables, queries and partials stay in L2. For
// plans without merges (large batches) none of this pays, and the hint costs bandwidth.
template <int D, bool kSplit>
__global__ void __launch_bounds__(kDecodeWarps * 32, 2)
    DecodeKernel(const __grid_constant__ PagedAttentionArgs a, const AttentionWorkItem* items,
                 const AttentionMergeItem* merges, const int32_t* counts, int32_t* counters,
                 float* partial_out, float* partial_lse, int max_items) {
  extern __shared__ uint4 smem_raw[];
  constexpr int kTile = TileElems<D, kDecodeKeys>();
  constexpr int kSub = kDecodeWarpKeys * (D + kRowPad);  // one warp's quarter of a tile
  auto* base = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float scale_log2 = a.scale * attention::kLog2e;
  AttentionWorkItem next_it{};
  uint64_t policy = 0;
  if constexpr (kSplit) {
    if (static_cast<int>(blockIdx.x) < max_items) next_it = items[blockIdx.x];
    policy = attention::EvictFirstPolicy();
  }
  const int num_items = counts[0];
  for (int idx = blockIdx.x; idx < num_items; idx += gridDim.x) {
    if constexpr (!kSplit) next_it = items[idx];
    const AttentionWorkItem it = next_it;
    AttentionMergeItem mi{};
    if constexpr (kSplit) {
      if (it.merge >= 0) mi = merges[it.merge];
    }
    const KvView view{static_cast<const __nv_bfloat16*>(a.kv_layer),
                      a.block_tables + int64_t{it.seq} * a.max_pages_per_seq,
                      a.num_kv_heads,
                      a.page_size,
                      attention::PageShift(a.page_size),
                      it.kv_head};
    const int tiles = (it.key_end - it.key_begin + kDecodeKeys - 1) / kDecodeKeys;
    __syncthreads();  // the previous item's merge no longer reads shared memory
    // K/V loads first: they are the long pole; the queries load while they fly.
    for (int s = 0; s < kDecodeStages - 1; ++s) {
      if (s < tiles) {
        LoadDecodeTile<D, kSplit>(view, it.key_begin + s * kDecodeKeys, it.key_end,
                                  base + s * 2 * kTile, policy);
      }
      attention::CpAsyncCommit();
    }
    if constexpr (kSplit) {
      if (idx + static_cast<int>(gridDim.x) < num_items) next_it = items[idx + gridDim.x];
    }
    const WarpRows<D> w = SliceRows<D>(a, it, it.row_begin, lane);
    WarpAccum<D> acc;
    attention::InitAccum(acc);
    attention::LoadQuery(acc, w.q[0], w.q[1], lane & 3);
    for (int i = 0; i < tiles; ++i) {
      const int next = i + kDecodeStages - 1;
      if (next < tiles) {
        LoadDecodeTile<D, kSplit>(view, it.key_begin + next * kDecodeKeys, it.key_end,
                                  base + (next % kDecodeStages) * 2 * kTile, policy);
      }
      attention::CpAsyncCommit();
      attention::CpAsyncWait<kDecodeStages - 1>();
      __syncthreads();
      const __nv_bfloat16* buf = base + (i % kDecodeStages) * 2 * kTile + warp * kSub;
      const int key0 = it.key_begin + i * kDecodeKeys + warp * kDecodeWarpKeys;
      if (key0 < w.max_limit) {
        attention::ProcessTile<D, kDecodeWarpKeys>(acc, buf, buf + kTile, key0, w.limit,
                                                   key0 + kDecodeWarpKeys > w.min_limit, scale_log2,
                                                   lane);
      }
      __syncthreads();
    }
    MergeWarpsAndStore(a, it, acc, reinterpret_cast<float*>(smem_raw), partial_out, partial_lse);
    if (it.merge >= 0) {
      if constexpr (!kSplit) mi = merges[it.merge];
      attention::ArriveAndMaybeCombine<D, kDecodeWarps * 32>(a, it, mi, counters, partial_out,
                                                             partial_lse);
    }
  }
}

template <int D, bool kSplit>
absl::Status LaunchDecodeKernel(const PagedAttentionArgs& a, const AttentionPlan& plan,
                                cudaStream_t stream) {
  constexpr int kPipe = kDecodeStages * 2 * TileElems<D, kDecodeKeys>() * sizeof(__nv_bfloat16);
  constexpr int kMerge = kDecodeWarps * kDecodeRows * (D + 2) * sizeof(float);
  constexpr int kSmem = kPipe > kMerge ? kPipe : kMerge;
  static std::atomic<int> cache[kMaxDevices];
  ASSIGN_OR_RETURN(const int per_sm,
                   BlocksPerSm(DecodeKernel<D, kSplit>, kDecodeWarps * 32, kSmem, cache));
  DecodeKernel<D, kSplit><<<NumSms() * per_sm, kDecodeWarps * 32, kSmem, stream>>>(
      a, plan.items(), plan.merges(), plan.counts(), plan.merge_counters(), plan.partial_out(),
      plan.partial_lse(), plan.capacity().max_items);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

// The variant follows the plan's last build (host copy of its merge count). Both variants
// compute the same function for any plan, so a graph captured with one plan and replayed with
// a rebuilt one stays correct; only the choice of variant is the captured one.
template <int D>
absl::Status LaunchDecode(const PagedAttentionArgs& a, const AttentionPlan& plan,
                          cudaStream_t stream) {
  if (plan.num_merges() > 0) return LaunchDecodeKernel<D, true>(a, plan, stream);
  return LaunchDecodeKernel<D, false>(a, plan, stream);
}

}  // namespace
}  // namespace tandem::attention

namespace tandem {

absl::Status PagedAttentionDecode(const PagedAttentionArgs& args, const AttentionPlan& plan,
                                  cudaStream_t stream) {
  if (args.num_seqs == 0) return absl::OkStatus();
  RETURN_IF_ERROR(attention::CheckArgs(args, plan));
  switch (args.head_dim) {
    case 64:
      return attention::LaunchDecode<64>(args, plan, stream);
    case 128:
      return attention::LaunchDecode<128>(args, plan, stream);
  }
  return absl::InvalidArgumentError("unsupported head_dim");
}

}  // namespace tandem
