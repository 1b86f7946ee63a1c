// Paged attention on sm_90a: FlashDecoding split-KV decode, FA2-style chunked prefill, and the
// split merge. Numerics: bf16 q/K/V, fp32 scores and softmax (log2 domain), P rounded to bf16
// for the P.V mma (as FlashAttention does), fp32 output accumulators.
//
// Decode kernel: every warp is an independent worker that takes work items (attention_plan.h)
// of 16 packed rows x one key split, with its own kDecodeStages-deep cp.async pipeline of
// kDecodeKeys-key tiles. Prefill kernel: a 4-warp CTA takes items of 64 rows; the warps share
// each 64-key tile (double-buffered), one 16-row slice each.
#include <cuda_bf16.h>

#include <algorithm>

#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "kernels/paged_attention/attention_tile.cuh"
#include "kernels/paged_attention/paged_attention.h"

namespace tandem {
namespace {

using attention::kRowPad;
using attention::KvView;
using attention::WarpAccum;

constexpr int kDecodeWarps = 4;
constexpr int kDecodeKeys = 32;
constexpr int kDecodeStages = 3;
constexpr int kPrefillWarps = kPrefillRows / 16;
constexpr int kPrefillKeys = 64;
constexpr int kPrefillStages = 2;
constexpr int kCombineWarps = 4;

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
  const int q0 = a.query_start[it.seq];
  const int first_pos = a.seq_lens[it.seq] - (a.query_start[it.seq + 1] - q0);
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

template <int D>
__device__ void StorePartial(const AttentionWorkItem& it, const WarpRows<D>& w, WarpAccum<D>& acc,
                             float* partial_out, float* partial_lse, int lane) {
  float inv_l[2];
  attention::FinishRows(acc, inv_l);
  const int g = lane >> 2, t = lane & 3;
  for (int i = 0; i < 2; ++i) {
    if (w.token[i] < 0) continue;
    const int64_t slot = int64_t{it.partial} * kDecodeRows + g + 8 * i;
    auto* row = reinterpret_cast<float2*>(partial_out + slot * D);
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      row[n * 4 + t] = make_float2(acc.o[n][2 * i] * inv_l[i], acc.o[n][2 * i + 1] * inv_l[i]);
    }
    if (t == 0) partial_lse[slot] = acc.l[i] > 0.0f ? acc.m[i] + log2f(acc.l[i]) : -INFINITY;
  }
}

template <int D>
__global__ void __launch_bounds__(kDecodeWarps * 32)
    DecodeKernel(const __grid_constant__ PagedAttentionArgs a, const AttentionWorkItem* items,
                 const int32_t* counts, float* partial_out, float* partial_lse) {
  extern __shared__ uint4 smem_raw[];
  constexpr int kTile = TileElems<D, kDecodeKeys>();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  auto* base = reinterpret_cast<__nv_bfloat16*>(smem_raw) + warp * kDecodeStages * 2 * kTile;
  const float scale_log2 = a.scale * attention::kLog2e;
  const int num_items = counts[0];
  for (int idx = blockIdx.x * kDecodeWarps + warp; idx < num_items;
       idx += gridDim.x * kDecodeWarps) {
    const AttentionWorkItem it = items[idx];
    const WarpRows<D> w = SliceRows<D>(a, it, it.row_begin, lane);
    const KvView view{static_cast<const __nv_bfloat16*>(a.kv_layer),
                      a.block_tables + int64_t{it.seq} * a.max_pages_per_seq, a.num_kv_heads,
                      a.page_size, it.kv_head};
    WarpAccum<D> acc;
    attention::InitAccum(acc);
    attention::LoadQuery(acc, w.q[0], w.q[1], lane & 3);
    const int tiles = (it.key_end - it.key_begin + kDecodeKeys - 1) / kDecodeKeys;
    for (int s = 0; s < kDecodeStages - 1; ++s) {
      if (s < tiles) {
        attention::LoadKvTile<D, kDecodeKeys, 32>(view, it.key_begin + s * kDecodeKeys, it.key_end,
                                                  base + s * 2 * kTile,
                                                  base + s * 2 * kTile + kTile, lane);
      }
      attention::CpAsyncCommit();
    }
    for (int i = 0; i < tiles; ++i) {
      const int next = i + kDecodeStages - 1;
      if (next < tiles) {
        __nv_bfloat16* buf = base + (next % kDecodeStages) * 2 * kTile;
        attention::LoadKvTile<D, kDecodeKeys, 32>(view, it.key_begin + next * kDecodeKeys,
                                                  it.key_end, buf, buf + kTile, lane);
      }
      attention::CpAsyncCommit();
      attention::CpAsyncWait<kDecodeStages - 1>();
      __syncwarp();
      const __nv_bfloat16* buf = base + (i % kDecodeStages) * 2 * kTile;
      const int key0 = it.key_begin + i * kDecodeKeys;
      attention::ProcessTile<D, kDecodeKeys>(acc, buf, buf + kTile, key0, w.limit,
                                             key0 + kDecodeKeys > w.min_limit, scale_log2, lane);
      __syncwarp();
    }
    if (it.partial < 0) {
      StoreOutput(a, w, acc, lane);
    } else {
      StorePartial(it, w, acc, partial_out, partial_lse, lane);
    }
  }
}

template <int D>
__global__ void __launch_bounds__(kPrefillWarps * 32)
    PrefillKernel(const __grid_constant__ PagedAttentionArgs a, const AttentionWorkItem* items,
                  const int32_t* counts) {
  extern __shared__ uint4 smem_raw[];
  constexpr int kTile = TileElems<D, kPrefillKeys>();
  auto* base = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float scale_log2 = a.scale * attention::kLog2e;
  const int num_items = counts[0];
  for (int idx = blockIdx.x; idx < num_items; idx += gridDim.x) {
    const AttentionWorkItem it = items[idx];
    const int slice = it.row_begin + warp * 16;
    const bool active = slice < it.row_begin + it.num_rows;
    const WarpRows<D> w = SliceRows<D>(a, it, slice, lane);
    const KvView view{static_cast<const __nv_bfloat16*>(a.kv_layer),
                      a.block_tables + int64_t{it.seq} * a.max_pages_per_seq, a.num_kv_heads,
                      a.page_size, it.kv_head};
    WarpAccum<D> acc;
    attention::InitAccum(acc);
    attention::LoadQuery(acc, w.q[0], w.q[1], lane & 3);
    const int tiles = (it.key_end - it.key_begin + kPrefillKeys - 1) / kPrefillKeys;
    __syncthreads();  // the previous item's last tile is no longer read
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
      if (active && key0 < w.max_limit) {
        attention::ProcessTile<D, kPrefillKeys>(acc, buf, buf + kTile, key0, w.limit,
                                                key0 + kPrefillKeys > w.min_limit, scale_log2,
                                                lane);
      }
      __syncthreads();
    }
    if (active) StoreOutput(a, w, acc, lane);
  }
}

// Merges the splits of each merge item: out = sum_k 2^(lse_k - M) O_k / sum_k 2^(lse_k - M).
// One warp per packed row; lane owns D / 32 consecutive dims.
template <int D>
__global__ void __launch_bounds__(kCombineWarps * 32)
    CombineKernel(const __grid_constant__ PagedAttentionArgs a, const AttentionMergeItem* merges,
                  const int32_t* counts, const float* partial_out, const float* partial_lse) {
  constexpr int kPerLane = D / 32;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int group = a.num_q_heads / a.num_kv_heads;
  const int num_merges = counts[1];
  auto* out = static_cast<__nv_bfloat16*>(a.out);
  for (int m = blockIdx.x; m < num_merges; m += gridDim.x) {
    const AttentionMergeItem mi = merges[m];
    for (int r = warp; r < mi.num_rows; r += kCombineWarps) {
      float lse_max = -INFINITY;
      for (int k = lane; k < mi.num_splits; k += 32) {
        lse_max = fmaxf(lse_max, partial_lse[int64_t{mi.first_partial + k} * kDecodeRows + r]);
      }
      for (int o = 16; o > 0; o >>= 1) {
        lse_max = fmaxf(lse_max, __shfl_xor_sync(0xffffffffu, lse_max, o));
      }
      float acc[kPerLane] = {};
      float sum = 0.0f;
      for (int k = 0; k < mi.num_splits; ++k) {
        const int64_t slot = int64_t{mi.first_partial + k} * kDecodeRows + r;
        const float lse = partial_lse[slot];
        const float wgt = lse == -INFINITY ? 0.0f : exp2f(lse - lse_max);
        sum += wgt;
        const float* src = partial_out + slot * D + lane * kPerLane;
#pragma unroll
        for (int d = 0; d < kPerLane; ++d) acc[d] += wgt * src[d];
      }
      const int packed = mi.row_begin + r;
      const int64_t token = a.query_start[mi.seq] + packed / group;
      const int head = mi.kv_head * group + packed % group;
      __nv_bfloat16* dst = out + (token * a.num_q_heads + head) * D + lane * kPerLane;
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
#pragma unroll
      for (int d = 0; d < kPerLane; ++d) dst[d] = __float2bfloat16(acc[d] * inv);
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

template <int D>
absl::Status LaunchDecode(const PagedAttentionArgs& a, const AttentionPlan& plan,
                          cudaStream_t stream) {
  constexpr int kSmem =
      kDecodeWarps * kDecodeStages * 2 * TileElems<D, kDecodeKeys>() * sizeof(__nv_bfloat16);
  static const cudaError_t attr =
      cudaFuncSetAttribute(DecodeKernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  CUDA_RETURN_IF_ERROR(attr);
  DecodeKernel<D><<<NumSms(), kDecodeWarps * 32, kSmem, stream>>>(
      a, plan.items(), plan.counts(), plan.partial_out(), plan.partial_lse());
  CUDA_RETURN_IF_LAUNCH_ERROR();
  if (plan.capacity().max_merges > 0) {
    CombineKernel<D><<<NumSms() * 2, kCombineWarps * 32, 0, stream>>>(
        a, plan.merges(), plan.counts(), plan.partial_out(), plan.partial_lse());
    CUDA_RETURN_IF_LAUNCH_ERROR();
  }
  return absl::OkStatus();
}

template <int D>
absl::Status LaunchPrefill(const PagedAttentionArgs& a, const AttentionPlan& plan,
                           cudaStream_t stream) {
  constexpr int kSmem = kPrefillStages * 2 * TileElems<D, kPrefillKeys>() * sizeof(__nv_bfloat16);
  static const cudaError_t attr =
      cudaFuncSetAttribute(PrefillKernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  CUDA_RETURN_IF_ERROR(attr);
  int per_sm = 0;
  CUDA_RETURN_IF_ERROR(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, PrefillKernel<D>,
                                                                     kPrefillWarps * 32, kSmem));
  const int grid = NumSms() * std::max(per_sm, 1);
  PrefillKernel<D><<<grid, kPrefillWarps * 32, kSmem, stream>>>(a, plan.items(), plan.counts());
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
