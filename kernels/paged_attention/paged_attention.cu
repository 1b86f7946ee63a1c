// Paged attention on sm_90a: FlashDecoding split-KV decode, FA2-style chunked prefill, and the
// split merge. Numerics: bf16 q/K/V, fp32 scores and softmax (log2 domain), P rounded to bf16
// for the P.V mma (as FlashAttention does), fp32 output accumulators.
//
// Decode kernel: a 4-warp CTA takes work items (attention_plan.h) of 16 packed rows x one key
// split through a kDecodeStages-deep cp.async pipeline of kDecodeKeys-key tiles; each warp
// computes a quarter of every tile, the warps merge at the end of the item, and the CTA that
// finishes the last split of a range combines the splits (attention_combine.cuh). Prefill
// kernel: a 4-warp CTA takes items of 128 rows, queries staged in shared memory; the warps
// share each 64-key tile (double-buffered), 32 rows each (prefill_tile.cuh).
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>

#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "kernels/paged_attention/attention_combine.cuh"
#include "kernels/paged_attention/attention_tile.cuh"
#include "kernels/paged_attention/paged_attention.h"
#include "kernels/paged_attention/prefill_tile.cuh"

namespace tandem {
namespace {

using attention::kRowPad;
using attention::KvView;
using attention::WarpAccum;

constexpr int kDecodeWarps = 4;
constexpr int kDecodeKeys = 64;  // per tile; each warp computes a quarter of it
constexpr int kDecodeWarpKeys = kDecodeKeys / kDecodeWarps;
constexpr int kDecodeStages = 3;
constexpr int kPrefillWarps = 4;  // each owns kPrefillRows / 4 rows
constexpr int kPrefillKeys = 64;
constexpr int kPrefillHalf = kPrefillKeys / 2;
constexpr int kPrefillStages = 2;
constexpr int kMaxDevices = 64;  // per-device launch-configuration cache

template <int D, int kKeys>
constexpr int TileElems() {
  return kKeys * (D + kRowPad);
}

// Per-row addressing of one warp's 16-row slice: rows g and g + 8 of this thread.
template <int D>
struct WarpRows {
  const __nv_bfloat16* q[2] = {nullptr, nullptr};
  int64_t token[2] = {-1, -1};  // global token index (row of q/out); -1: row past the end
  int head[2] = {0, 0};
  int limit[2] = {0, 0};  // keys < limit are visible to the row
  int min_limit = 0;      // smallest limit over the slice's valid rows
  int max_limit = 0;
};

template <int D>
__device__ WarpRows<D> SliceRows(const PagedAttentionArgs& a, const AttentionWorkItem& it,
                                 int slice_begin, int lane) {
  WarpRows<D> w;
  const int group = a.num_q_heads / a.num_kv_heads;
  const int q0 = it.token_begin;
  const int first_pos = it.first_pos;
  const int64_t q_stride = a.q_stride != 0 ? a.q_stride : int64_t{a.num_q_heads} * D;
  const auto* q = static_cast<const __nv_bfloat16*>(a.q);
  const int row_end = it.row_begin + it.num_rows;
  for (int i = 0; i < 2; ++i) {
    const int r = slice_begin + (lane >> 2) + 8 * i;
    w.limit[i] = it.key_end;
    if (r >= row_end) continue;
    const int token = r / group;
    w.token[i] = q0 + token;
    w.head[i] = it.kv_head * group + r % group;
    w.q[i] = q + w.token[i] * q_stride + int64_t{w.head[i]} * D;
    w.limit[i] = min(first_pos + token + 1, it.key_end);
  }
  const int last = min(slice_begin + 15, row_end - 1);
  w.min_limit = min(first_pos + slice_begin / group + 1, it.key_end);
  w.max_limit = min(first_pos + last / group + 1, it.key_end);
  return w;
}

template <int D>
__device__ void StoreOutput(const PagedAttentionArgs& a, const WarpRows<D>& w, WarpAccum<D>& acc,
                            int lane) {
  float inv_l[2];
  attention::FinishRows(acc, inv_l);
  auto* out = static_cast<__nv_bfloat16*>(a.out);
  const int t = lane & 3;
  for (int i = 0; i < 2; ++i) {
    if (w.token[i] < 0) continue;
    auto* row = reinterpret_cast<uint32_t*>(out + (w.token[i] * a.num_q_heads + w.head[i]) * D);
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      row[n * 4 + t] =
          attention::PackBf16(acc.o[n][2 * i] * inv_l[i], acc.o[n][2 * i + 1] * inv_l[i]);
    }
  }
}

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

// One CTA per work item at a time: the four warps share a kDecodeStages-deep cp.async pipeline
// of kDecodeKeys-key tiles; warp w computes keys [16 w, 16 w + 16) of every tile with its own
// online softmax, and the states are merged at the end of the item.
template <int D>
__global__ void __launch_bounds__(kDecodeWarps * 32, 2)
    DecodeKernel(const __grid_constant__ PagedAttentionArgs a, const AttentionWorkItem* items,
                 const AttentionMergeItem* merges, const int32_t* counts, int32_t* counters,
                 float* partial_out, float* partial_lse) {
  extern __shared__ uint4 smem_raw[];
  constexpr int kTile = TileElems<D, kDecodeKeys>();
  constexpr int kThreads = kDecodeWarps * 32;
  constexpr int kSub = kDecodeWarpKeys * (D + kRowPad);  // one warp's quarter of a tile
  auto* base = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float scale_log2 = a.scale * attention::kLog2e;
  const int num_items = counts[0];
  for (int idx = blockIdx.x; idx < num_items; idx += gridDim.x) {
    const AttentionWorkItem it = items[idx];
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
        __nv_bfloat16* buf = base + s * 2 * kTile;
        attention::LoadKvTile<D, kDecodeKeys, kThreads>(view, it.key_begin + s * kDecodeKeys,
                                                        it.key_end, buf, buf + kTile, threadIdx.x);
      }
      attention::CpAsyncCommit();
    }
    const WarpRows<D> w = SliceRows<D>(a, it, it.row_begin, lane);
    WarpAccum<D> acc;
    attention::InitAccum(acc);
    attention::LoadQuery(acc, w.q[0], w.q[1], lane & 3);
    for (int i = 0; i < tiles; ++i) {
      const int next = i + kDecodeStages - 1;
      if (next < tiles) {
        __nv_bfloat16* buf = base + (next % kDecodeStages) * 2 * kTile;
        attention::LoadKvTile<D, kDecodeKeys, kThreads>(view, it.key_begin + next * kDecodeKeys,
                                                        it.key_end, buf, buf + kTile, threadIdx.x);
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
      attention::ArriveAndMaybeCombine<D, kDecodeWarps * 32>(a, it, merges, counters, partial_out,
                                                             partial_lse);
    }
  }
}

// Copies the item's packed query rows [row_begin, row_begin + kPrefillRows) into q_s
// ([kPrefillRows][D + kRowPad]); rows past the item are zero.
template <int D>
__device__ void LoadQueryTile(const PagedAttentionArgs& a, const AttentionWorkItem& it,
                              __nv_bfloat16* q_s) {
  constexpr int kChunksPerRow = D / 8;
  const int group = a.num_q_heads / a.num_kv_heads;
  const int64_t q_stride = a.q_stride != 0 ? a.q_stride : int64_t{a.num_q_heads} * D;
  const auto* q = static_cast<const __nv_bfloat16*>(a.q);
  for (int c = threadIdx.x; c < kPrefillRows * kChunksPerRow; c += kPrefillWarps * 32) {
    const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
    const bool valid = r < it.num_rows;
    const __nv_bfloat16* src = q;
    if (valid) {
      const int packed = it.row_begin + r;
      const int64_t token = it.token_begin + packed / group;
      src = q + token * q_stride + int64_t{it.kv_head * group + packed % group} * D + col;
    }
    attention::CpAsync16(q_s + r * (D + kRowPad) + col, src, valid);
  }
}

// A 4-warp CTA per item of kPrefillRows packed rows; warp w owns rows [32 w, 32 w + 32) (two
// mma row tiles) and all warps share each double-buffered kPrefillKeys-key tile.
template <int D>
__global__ void __launch_bounds__(kPrefillWarps * 32, 2)
    PrefillKernel(const __grid_constant__ PagedAttentionArgs a, const AttentionWorkItem* items,
                  const int32_t* counts) {
  extern __shared__ uint4 smem_raw[];
  constexpr int kTile = TileElems<D, kPrefillKeys>();
  constexpr int kM = kPrefillRows / (16 * kPrefillWarps);
  auto* q_s = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  auto* base = q_s + kPrefillRows * (D + kRowPad);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float scale_log2 = a.scale * attention::kLog2e;
  const int num_items = counts[0];
  for (int idx = blockIdx.x; idx < num_items; idx += gridDim.x) {
    const AttentionWorkItem it = items[idx];
    WarpAccum<D> acc[kM];
    int limit[kM][2];
    int min_limit = it.key_end, max_limit = 0;
    const bool active = warp * 16 * kM < it.num_rows;
#pragma unroll
    for (int mt = 0; mt < kM; ++mt) {
      const WarpRows<D> w = SliceRows<D>(a, it, it.row_begin + (warp * kM + mt) * 16, lane);
      attention::InitAccum(acc[mt]);
      limit[mt][0] = w.limit[0];
      limit[mt][1] = w.limit[1];
      min_limit = min(min_limit, w.min_limit);
      max_limit = max(max_limit, w.max_limit);
    }
    const KvView view{static_cast<const __nv_bfloat16*>(a.kv_layer),
                      a.block_tables + int64_t{it.seq} * a.max_pages_per_seq,
                      a.num_kv_heads,
                      a.page_size,
                      attention::PageShift(a.page_size),
                      it.kv_head};
    const int tiles = (it.key_end - it.key_begin + kPrefillKeys - 1) / kPrefillKeys;
    __syncthreads();  // the previous item no longer reads q_s or the last tile
    LoadQueryTile<D>(a, it, q_s);
    attention::LoadKvTile<D, kPrefillKeys, kPrefillWarps * 32>(view, it.key_begin, it.key_end, base,
                                                               base + kTile, threadIdx.x);
    attention::CpAsyncCommit();
    for (int i = 0; i < tiles; ++i) {
      if (i + 1 < tiles) {
        __nv_bfloat16* buf = base + ((i + 1) % 2) * 2 * kTile;
        attention::LoadKvTile<D, kPrefillKeys, kPrefillWarps * 32>(
            view, it.key_begin + (i + 1) * kPrefillKeys, it.key_end, buf, buf + kTile, threadIdx.x);
      }
      attention::CpAsyncCommit();
      attention::CpAsyncWait<1>();
      __syncthreads();
      const __nv_bfloat16* buf = base + (i % 2) * 2 * kTile;
      const int key0 = it.key_begin + i * kPrefillKeys;
      // Two 32-key halves: keeps the score fragments at 32 registers (no spills at D = 128).
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int k0 = key0 + half * kPrefillHalf;
        if (active && k0 < max_limit) {
          const int off = half * kPrefillHalf * (D + kRowPad);
          attention::ProcessTileM<D, kPrefillHalf, kM>(
              acc, q_s + warp * kM * 16 * (D + kRowPad), buf + off, buf + kTile + off, k0, limit,
              k0 + kPrefillHalf > min_limit, scale_log2, lane);
        }
      }
      __syncthreads();
    }
#pragma unroll
    for (int mt = 0; mt < kM; ++mt) {
      // Recomputed rather than kept live through the key loop (register pressure).
      StoreOutput(a, SliceRows<D>(a, it, it.row_begin + (warp * kM + mt) * 16, lane), acc[mt],
                  lane);
    }
  }
}

int NumSms() {
  static const int sms = [] {
    int device = 0, n = 132;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device);
    return n;
  }();
  return sms;
}

absl::Status CheckArgs(const PagedAttentionArgs& a, const AttentionPlan& plan) {
  if (a.dtype != DType::kBF16 || a.kv_dtype != DType::kBF16) {
    return absl::InvalidArgumentError("CUDA paged attention supports bf16 q/out/cache only");
  }
  if (a.head_dim != 64 && a.head_dim != 128) {
    return absl::InvalidArgumentError("CUDA paged attention supports head_dim 64 and 128");
  }
  if (a.num_kv_heads <= 0 || a.num_q_heads % a.num_kv_heads != 0 || a.page_size <= 0) {
    return absl::InvalidArgumentError("paged attention: bad head counts or page size");
  }
  if (a.head_dim > plan.capacity().max_head_dim) {
    return absl::InvalidArgumentError("paged attention: head_dim above the plan's capacity");
  }
  return absl::OkStatus();
}

// Resident CTAs per SM of `kernel` with `smem` bytes of dynamic shared memory, after raising
// its shared-memory limit. Cached per device in `cache` (one per kernel instantiation): the
// occupancy query costs microseconds of host time on every decode launch otherwise.
template <typename Kernel>
absl::StatusOr<int> BlocksPerSm(Kernel kernel, int threads, int smem,
                                std::atomic<int> (&cache)[kMaxDevices]) {
  int device = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  if (device < kMaxDevices) {
    const int cached = cache[device].load(std::memory_order_relaxed);
    if (cached > 0) return cached;
  }
  CUDA_RETURN_IF_ERROR(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int per_sm = 0;
  CUDA_RETURN_IF_ERROR(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  per_sm = std::max(per_sm, 1);
  if (device < kMaxDevices) cache[device].store(per_sm, std::memory_order_relaxed);
  return per_sm;
}

template <int D>
absl::Status LaunchDecode(const PagedAttentionArgs& a, const AttentionPlan& plan,
                          cudaStream_t stream) {
  constexpr int kPipe = kDecodeStages * 2 * TileElems<D, kDecodeKeys>() * sizeof(__nv_bfloat16);
  constexpr int kMerge = kDecodeWarps * kDecodeRows * (D + 2) * sizeof(float);
  constexpr int kSmem = kPipe > kMerge ? kPipe : kMerge;
  static std::atomic<int> cache[kMaxDevices];
  ASSIGN_OR_RETURN(const int per_sm, BlocksPerSm(DecodeKernel<D>, kDecodeWarps * 32, kSmem, cache));
  DecodeKernel<D><<<NumSms() * per_sm, kDecodeWarps * 32, kSmem, stream>>>(
      a, plan.items(), plan.merges(), plan.counts(), plan.merge_counters(), plan.partial_out(),
      plan.partial_lse());
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

template <int D>
absl::Status LaunchPrefill(const PagedAttentionArgs& a, const AttentionPlan& plan,
                           cudaStream_t stream) {
  constexpr int kSmem =
      (kPrefillStages * 2 * TileElems<D, kPrefillKeys>() + kPrefillRows * (D + kRowPad)) *
      sizeof(__nv_bfloat16);
  static std::atomic<int> cache[kMaxDevices];
  ASSIGN_OR_RETURN(const int per_sm,
                   BlocksPerSm(PrefillKernel<D>, kPrefillWarps * 32, kSmem, cache));
  PrefillKernel<D>
      <<<NumSms() * per_sm, kPrefillWarps * 32, kSmem, stream>>>(a, plan.items(), plan.counts());
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace

absl::Status PagedAttentionDecode(const PagedAttentionArgs& args, const AttentionPlan& plan,
                                  cudaStream_t stream) {
  if (args.num_seqs == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckArgs(args, plan));
  switch (args.head_dim) {
    case 64:
      return LaunchDecode<64>(args, plan, stream);
    case 128:
      return LaunchDecode<128>(args, plan, stream);
  }
  return absl::InvalidArgumentError("unsupported head_dim");
}

absl::Status PagedAttentionPrefill(const PagedAttentionArgs& args, const AttentionPlan& plan,
                                   cudaStream_t stream) {
  if (args.num_seqs == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckArgs(args, plan));
  switch (args.head_dim) {
    case 64:
      return LaunchPrefill<64>(args, plan, stream);
    case 128:
      return LaunchPrefill<128>(args, plan, stream);
  }
  return absl::InvalidArgumentError("unsupported head_dim");
}

}  // namespace tandem
