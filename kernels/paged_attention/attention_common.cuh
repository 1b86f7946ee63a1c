// Pieces shared by the paged-attention kernels (paged_attention.cu: decode,
// paged_attention_prefill.cu: prefill): tile constants, per-row addressing, output stores and
// argument checks (the cached launch configuration is kernels/common/launch_config.cuh's).
// Internal to kernels/paged_attention.
#pragma once

#include <cuda_bf16.h>

#include "absl/status/statusor.h"
#include "base/cuda_check.h"
#include "kernels/common/kv_layout.h"
#include "kernels/common/launch_config.cuh"
#include "kernels/paged_attention/attention_tile.cuh"
#include "kernels/paged_attention/fp8_tile.cuh"
#include "kernels/paged_attention/paged_attention.h"

namespace tandem::attention {

constexpr int kDecodeWarps = 4;
constexpr int kDecodeKeys = 64;  // per tile; each warp computes a quarter of it
static_assert(kDecodeKeys == kDecodeTileKeys, "the decode plans split and cut at whole tiles");
constexpr int kDecodeWarpKeys = kDecodeKeys / kDecodeWarps;
constexpr int kDecodeStages = 3;
constexpr int kPrefillWarps = 4;  // each owns kPrefillRows / 4 rows
constexpr int kPrefillKeys = 64;
constexpr int kPrefillHalf = kPrefillKeys / 2;
constexpr int kPrefillStages = 2;
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
  FinishRows(acc, inv_l);
  auto* out = static_cast<__nv_bfloat16*>(a.out);
  const int t = lane & 3;
  for (int i = 0; i < 2; ++i) {
    if (w.token[i] < 0) continue;
    auto* row = reinterpret_cast<uint32_t*>(out + (w.token[i] * a.num_q_heads + w.head[i]) * D);
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      row[n * 4 + t] = PackBf16(acc.o[n][2 * i] * inv_l[i], acc.o[n][2 * i + 1] * inv_l[i]);
    }
  }
}

// Where a decode item's merged packed row r goes (bf16, D values): its output row, or its split's
// partial slot, whose log2-sum-exp (mx + log2(sum), -inf for a row that saw no key) `write_lse`
// stores. `sum`: the row's softmax sum at maximum `mx` (log2 domain).
template <int D>
__device__ __forceinline__ uint16_t* MergedRowDst(const PagedAttentionArgs& a,
                                                  const AttentionWorkItem& it, int r,
                                                  bool write_lse, float mx, float sum,
                                                  uint16_t* partial_out, float* partial_lse) {
  if (it.partial < 0) {
    const int group = a.num_q_heads / a.num_kv_heads;
    const int row = it.row_begin + r;
    const int64_t token = it.token_begin + row / group;
    const int head = it.kv_head * group + row % group;
    return static_cast<uint16_t*>(a.out) + (token * a.num_q_heads + head) * D;
  }
  const int64_t slot = int64_t{it.partial} * kDecodeRows + r;
  if (write_lse) partial_lse[slot] = sum > 0.0f ? mx + log2f(sum) : -INFINITY;
  return partial_out + slot * D;
}

inline absl::Status CheckArgs(const PagedAttentionArgs& a, const AttentionPlan& plan) {
  if (a.dtype != DType::kBF16 || (a.kv_dtype != DType::kBF16 && a.kv_dtype != DType::kF8E4M3)) {
    return absl::InvalidArgumentError(
        "CUDA paged attention supports bf16 q/out and a bf16 or fp8 cache only");
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

// The fp8 page geometry of `a`'s layer (unused for a bf16 cache).
inline Fp8Pages Fp8Geometry(const PagedAttentionArgs& a) {
  const KvLayout l{.num_layers = 1,
                   .num_pages = 1,
                   .page_size = a.page_size,
                   .num_kv_heads = a.num_kv_heads,
                   .head_dim = a.head_dim,
                   .dtype = a.kv_dtype};
  return Fp8Pages{l.PageBytes(), l.PageScaleStart()};
}

}  // namespace tandem::attention
