// Fused QK-norm + rotary + KV-cache store (rope_kv_store.h), CUDA, bf16 qkv and cache.
//
// One warp per (token, head) row of qkv; lane owns element pairs (2p, 2p + 1) of the low half
// and the same pair of the high half, p = lane, lane + 32, ... (32-bit loads and stores). The
// numerics follow RopeKvStoreRef: fp32 math, angle = float(position) * inv_freq[i] with an
// accurate sincosf (angles reach 10^5 rad), one rounding to bf16; the cache gets the rounded
// value. V rows are only copied to the cache.
#include <cuda_bf16.h>

#include <algorithm>

#include "base/cuda_check.h"
#include "kernels/rope_kv_store/rope_kv_store.h"

namespace tandem {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kMaxPairsPerLane = 4;  // head_dim <= 4 * 32 * 2 * 2 = 512

__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    RopeKvStoreKernel(const __grid_constant__ RopeKvStoreArgs a) {
  const int lane = threadIdx.x & 31;
  const int heads = a.num_q_heads + 2 * a.num_kv_heads;
  const int64_t rows = a.num_tokens * heads;
  const int half = a.head_dim / 2;
  const int pairs = half / 2;  // bf16x2 pairs per half
  for (int64_t row = int64_t{blockIdx.x} * kWarpsPerBlock + (threadIdx.x >> 5); row < rows;
       row += int64_t{gridDim.x} * kWarpsPerBlock) {
    const int64_t t = row / heads;
    const int h = static_cast<int>(row % heads);
    const bool is_q = h < a.num_q_heads;
    const bool is_v = h >= a.num_q_heads + a.num_kv_heads;
    auto* x = static_cast<__nv_bfloat162*>(a.qkv) + row * half;  // head_dim / 2 bf16x2
    float2 lo[kMaxPairsPerLane], hi[kMaxPairsPerLane];
    float sum_sq = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxPairsPerLane; ++j) {
      const int p = lane + 32 * j;
      if (p < pairs) {
        lo[j] = __bfloat1622float2(x[p]);
        hi[j] = __bfloat1622float2(x[p + pairs]);
        sum_sq += lo[j].x * lo[j].x + lo[j].y * lo[j].y + hi[j].x * hi[j].x + hi[j].y * hi[j].y;
      }
    }
    const void* weight = is_q ? a.q_norm_weight : a.k_norm_weight;
    if (!is_v) {
      float inv_rms = 1.0f;
      if (weight != nullptr) {
        for (int o = 16; o > 0; o >>= 1) sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, o);
        inv_rms = rsqrtf(sum_sq / static_cast<float>(a.head_dim) + a.norm_eps);
      }
      const float pos = static_cast<float>(a.positions[t]);
      const auto* w = static_cast<const __nv_bfloat162*>(weight);
#pragma unroll
      for (int j = 0; j < kMaxPairsPerLane; ++j) {
        const int p = lane + 32 * j;
        if (p >= pairs) continue;
        if (w != nullptr) {
          const float2 wl = __bfloat1622float2(w[p]), wh = __bfloat1622float2(w[p + pairs]);
          lo[j] = make_float2(lo[j].x * inv_rms * wl.x, lo[j].y * inv_rms * wl.y);
          hi[j] = make_float2(hi[j].x * inv_rms * wh.x, hi[j].y * inv_rms * wh.y);
        }
        float s0, c0, s1, c1;
        sincosf(pos * a.inv_freq[2 * p], &s0, &c0);
        sincosf(pos * a.inv_freq[2 * p + 1], &s1, &c1);
        const float2 l = lo[j], r = hi[j];
        lo[j] = make_float2(l.x * c0 - r.x * s0, l.y * c1 - r.y * s1);
        hi[j] = make_float2(r.x * c0 + l.x * s0, r.y * c1 + l.y * s1);
        x[p] = __float22bfloat162_rn(lo[j]);
        x[p + pairs] = __float22bfloat162_rn(hi[j]);
      }
    }
    const int32_t slot = a.slot_mapping[t];
    if (is_q || slot < 0) continue;
    const int kv = is_v ? 1 : 0;
    const int kv_head = h - a.num_q_heads - kv * a.num_kv_heads;
    const int64_t page = slot / a.page_size;
    const int64_t dst_row =
        ((page * 2 + kv) * a.num_kv_heads + kv_head) * a.page_size + slot % a.page_size;
    auto* dst = static_cast<__nv_bfloat162*>(a.kv_layer) + dst_row * half;
#pragma unroll
    for (int j = 0; j < kMaxPairsPerLane; ++j) {
      const int p = lane + 32 * j;
      if (p >= pairs) continue;
      dst[p] = __float22bfloat162_rn(lo[j]);
      dst[p + pairs] = __float22bfloat162_rn(hi[j]);
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

}  // namespace

absl::Status RopeKvStore(const RopeKvStoreArgs& args, cudaStream_t stream) {
  if (args.num_tokens == 0) return absl::OkStatus();
  if (args.dtype != DType::kBF16 || args.kv_dtype != DType::kBF16) {
    return absl::InvalidArgumentError("CUDA RopeKvStore supports bf16 qkv and cache only");
  }
  if (args.head_dim % 4 != 0 || args.head_dim > 4 * 32 * kMaxPairsPerLane) {
    return absl::InvalidArgumentError("CUDA RopeKvStore: head_dim must be a multiple of 4, <= 512");
  }
  if ((args.q_norm_weight == nullptr) != (args.k_norm_weight == nullptr)) {
    return absl::InvalidArgumentError("RopeKvStore: q_norm_weight and k_norm_weight go together");
  }
  const int64_t rows = args.num_tokens * (args.num_q_heads + 2 * args.num_kv_heads);
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const int grid = static_cast<int>(std::min<int64_t>(blocks, int64_t{NumSms()} * 16));
  RopeKvStoreKernel<<<grid, kWarpsPerBlock * 32, 0, stream>>>(args);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tandem
