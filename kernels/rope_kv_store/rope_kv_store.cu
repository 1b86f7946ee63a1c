// Fused QK-norm + rotary + KV-cache store (rope_kv_store.h), CUDA, bf16 qkv and cache.
//
// One CTA per token at a time. A thread owns rotate-half pairs of 16-byte chunks: chunk p of a
// head (dims [8p, 8p + 8)) together with chunk p + D/16 (dims D/2 + [8p, 8p + 8)), so the
// rotation needs no data from other threads. A head is D / 16 consecutive threads (inside one
// warp): the QK-norm sum of squares is a shuffle reduction over them. kPairsPerThread pairs
// (2 x 16 bytes each) are in flight per thread. cos/sin of the token's angles are computed into
// one of two shared buffers while the previous token is processed, so a token costs one barrier.
// The numerics follow RopeKvStoreRef: fp32 math, angle = float(position) * inv_freq[i] with an
// accurate sincosf (angles reach 10^5 rad), one rounding to bf16; the cache gets the rounded
// value.
//
// FP8 cache (kF8E4M3, kernels/common/kv_layout.h): the lanes of one K/V head (D / 16 of them)
// take the amax of the head's bf16-rounded row with a shuffle reduction, every lane writes its
// 2 x 8 codes e4m3(x / scale) (__fdiv_rn, RNE, satfinite) and the head's first lane its fp32
// scale = amax / 448 (0 for an all-zero row), as RopeKvStoreRef does, bit for bit.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "base/cuda_check.h"
#include "kernels/common/kv_layout.h"
#include "kernels/common/launch_config.cuh"
#include "kernels/common/pdl.cuh"
#include "kernels/rope_kv_store/rope_kv_store.h"

namespace tandem {
namespace {

constexpr int kThreads = 256;
constexpr int kPairsPerThread = 2;  // 48 heads x 8 pairs (D = 128) = 384 pairs per token

// Byte geometry of an fp8 page (KvLayout's, computed on the host).
struct Fp8Pages {
  int64_t page_bytes = 0;   // KvLayout::PageBytes()
  int64_t scale_start = 0;  // KvLayout::PageScaleStart()
};

__device__ __forceinline__ void Unpack(const uint4& u, float (&v)[8]) {
  const auto* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __bfloat1622float2(h[j]);
    v[2 * j] = f.x;
    v[2 * j + 1] = f.y;
  }
}

__device__ __forceinline__ uint4 Pack(const float (&v)[8]) {
  uint4 u;
  auto* h = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
  for (int j = 0; j < 4; ++j) h[j] = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
  return u;
}

// Normalises (optionally) and rotates pair q of the token's row (head q / (D/16), chunks
// part = q % (D/16) and part + D/16: lo, hi); stores them back and, for K and V, into the cache.
// Every lane must call this (the QK-norm shuffles), valid or not. norm_w: [2][D] fp32, q then k.
// kFp8: the cache is fp8 pages of geometry `fp8`.
template <int D, bool kFp8>
__device__ __forceinline__ void RotatePair(const RopeKvStoreArgs& a, int64_t t, int q, bool valid,
                                           const uint4& lo_raw, const uint4& hi_raw, int32_t slot,
                                           const float* cos_s, const float* sin_s,
                                           const float* norm_w, const Fp8Pages& fp8) {
  constexpr int kPerHead = D / 8, kHalf = D / 16;
  const int heads = a.num_q_heads + 2 * a.num_kv_heads;
  const int h = q / kHalf, part = q % kHalf;
  const bool is_q = h < a.num_q_heads;
  const bool is_v = h >= a.num_q_heads + a.num_kv_heads;
  float lo[8], hi[8];
  Unpack(lo_raw, lo);
  Unpack(hi_raw, hi);
  if (a.q_norm_weight != nullptr) {
    float sum_sq = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) sum_sq += lo[j] * lo[j] + hi[j] * hi[j];
#pragma unroll
    for (int o = 1; o < kHalf; o <<= 1) sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, o);
    if (!is_v && valid) {
      const float inv_rms = rsqrtf(sum_sq / static_cast<float>(D) + a.norm_eps);
      const float* w = norm_w + (is_q ? 0 : D) + part * 8;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        lo[j] = lo[j] * inv_rms * w[j];
        hi[j] = hi[j] * inv_rms * w[D / 2 + j];
      }
    }
  }
  if (!valid) return;
  auto* row = static_cast<uint4*>(a.qkv) + (t * heads + h) * kPerHead;
  if (!is_v) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float cs = cos_s[part * 8 + j], sn = sin_s[part * 8 + j];
      const float x = lo[j], y = hi[j];
      lo[j] = x * cs - y * sn;
      hi[j] = y * cs + x * sn;
    }
    row[part] = Pack(lo);
    row[part + kHalf] = Pack(hi);
  }
  if (is_q || slot < 0) return;
  const int kv = is_v ? 1 : 0;
  const int kv_head = h - a.num_q_heads - kv * a.num_kv_heads;
  if constexpr (kFp8) {
    // The lanes of this head (kHalf consecutive lanes, all valid, all storing: one token) reduce
    // the amax of the values the bf16 store would write.
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      lo[j] = __bfloat162float(__float2bfloat16_rn(lo[j]));
      hi[j] = __bfloat162float(__float2bfloat16_rn(hi[j]));
      amax = fmaxf(amax, fmaxf(fabsf(lo[j]), fabsf(hi[j])));
    }
    const int lane = threadIdx.x & 31;
    const unsigned group = (kHalf == 32 ? 0xffffffffu : ((1u << kHalf) - 1u))
                           << (lane & ~(kHalf - 1));
#pragma unroll
    for (int o = 1; o < kHalf; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(group, amax, o));
    const float scale = __fdiv_rn(amax, 448.0f);
    uint32_t w[4] = {0, 0, 0, 0};  // lo codes in w[0..1], hi codes in w[2..3]
    if (amax > 0.0f) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint32_t cl =
            __nv_cvt_float_to_fp8(__fdiv_rn(lo[j], scale), __NV_SATFINITE, __NV_E4M3);
        const uint32_t ch =
            __nv_cvt_float_to_fp8(__fdiv_rn(hi[j], scale), __NV_SATFINITE, __NV_E4M3);
        w[j / 4] |= cl << (8 * (j % 4));
        w[2 + j / 4] |= ch << (8 * (j % 4));
      }
    }
    const int64_t page = slot / a.page_size;
    const int64_t row = (int64_t{kv} * a.num_kv_heads + kv_head) * a.page_size + slot % a.page_size;
    char* page_base = static_cast<char*>(a.kv_layer) + page * fp8.page_bytes;
    char* codes = page_base + row * D;
    *reinterpret_cast<uint2*>(codes + part * 8) = make_uint2(w[0], w[1]);
    *reinterpret_cast<uint2*>(codes + D / 2 + part * 8) = make_uint2(w[2], w[3]);
    if (part == 0) *reinterpret_cast<float*>(page_base + fp8.scale_start + row * 4) = scale;
    return;
  }
  const int64_t dst_row =
      ((int64_t{slot / a.page_size} * 2 + kv) * a.num_kv_heads + kv_head) * a.page_size +
      slot % a.page_size;
  auto* dst = static_cast<uint4*>(a.kv_layer) + dst_row * kPerHead;
  dst[part] = Pack(lo);
  dst[part + kHalf] = Pack(hi);
}

// Loads pairs q = q0 + j * kThreads + threadIdx.x of one token's row (zeros past `pairs`).
template <int D>
__device__ __forceinline__ void LoadPairs(const uint4* row, int q0, int pairs,
                                          uint4 (&lo)[kPairsPerThread],
                                          uint4 (&hi)[kPairsPerThread]) {
  constexpr int kPerHead = D / 8, kHalf = D / 16;
#pragma unroll
  for (int j = 0; j < kPairsPerThread; ++j) {
    const int q = q0 + j * kThreads + threadIdx.x;
    const int c = (q / kHalf) * kPerHead + q % kHalf;
    lo[j] = q < pairs ? row[c] : make_uint4(0, 0, 0, 0);
    hi[j] = q < pairs ? row[c + kHalf] : make_uint4(0, 0, 0, 0);
  }
}

// cos/sin of the rotary angles of `position` into cos_s / sin_s (threads < D / 2).
template <int D>
__device__ __forceinline__ void Angles(const RopeKvStoreArgs& a, int32_t position, float* cos_s,
                                       float* sin_s) {
  if (threadIdx.x < D / 2) {
    float sn, cs;
    sincosf(static_cast<float>(position) * a.inv_freq[threadIdx.x], &sn, &cs);
    cos_s[threadIdx.x] = cs;
    sin_s[threadIdx.x] = sn;
  }
}

// At most 64 registers: 4 CTAs (1024 threads) per SM.
template <int D, bool kFp8>
__global__ void __launch_bounds__(kThreads, 4)
    RopeKvStoreKernel(const __grid_constant__ RopeKvStoreArgs a, const Fp8Pages fp8) {
  AllowDependentLaunch();  // a PDL decode attention after us may start its first K/V copies
  __shared__ float cos_s[2][D / 2], sin_s[2][D / 2];
  // QK-norm weights (q then k, fp32), read per pair from shared memory rather than held in
  // registers (4 CTAs per SM fit in 64 registers only without them).
  __shared__ __align__(16) float norm_w[2 * D];
  const int heads = a.num_q_heads + 2 * a.num_kv_heads;
  const int pairs = heads * (D / 16);
  if (a.q_norm_weight != nullptr && threadIdx.x < 2 * D / 8) {
    const int part = threadIdx.x % (D / 8);
    const void* wp = threadIdx.x < D / 8 ? a.q_norm_weight : a.k_norm_weight;
    float w[8];
    Unpack(static_cast<const uint4*>(wp)[part], w);
#pragma unroll
    for (int j = 0; j < 8; ++j) norm_w[threadIdx.x * 8 + j] = w[j];
  }
  if (blockIdx.x < a.num_tokens) Angles<D>(a, a.positions[blockIdx.x], cos_s[0], sin_s[0]);
  int buf = 0;
  for (int64_t t = blockIdx.x; t < a.num_tokens; t += gridDim.x, buf ^= 1) {
    const auto* row = static_cast<const uint4*>(a.qkv) + t * heads * (D / 8);
    const int32_t slot = a.slot_mapping[t];
    const int64_t next = t + gridDim.x;
    const int32_t next_position = next < a.num_tokens ? a.positions[next] : 0;
    uint4 lo[kPairsPerThread], hi[kPairsPerThread];
    LoadPairs<D>(row, 0, pairs, lo, hi);  // in flight across the barrier
    // cos_s[buf] (and, at the first token, norm_w) is written; cos_s[buf ^ 1] is no longer
    // read (the previous token's).
    __syncthreads();
    for (int q0 = 0; q0 < pairs; q0 += kThreads * kPairsPerThread) {
      if (q0 > 0) LoadPairs<D>(row, q0, pairs, lo, hi);
#pragma unroll
      for (int j = 0; j < kPairsPerThread; ++j) {
        const int q = q0 + j * kThreads + threadIdx.x;
        RotatePair<D, kFp8>(a, t, q, q < pairs, lo[j], hi[j], slot, cos_s[buf], sin_s[buf], norm_w,
                            fp8);
      }
    }
    if (next < a.num_tokens) Angles<D>(a, next_position, cos_s[buf ^ 1], sin_s[buf ^ 1]);
  }
}

}  // namespace

absl::Status RopeKvStore(const RopeKvStoreArgs& args, cudaStream_t stream) {
  if (args.num_tokens == 0) return absl::OkStatus();
  if (args.dtype != DType::kBF16 ||
      (args.kv_dtype != DType::kBF16 && args.kv_dtype != DType::kF8E4M3)) {
    return absl::InvalidArgumentError("CUDA RopeKvStore supports bf16 qkv and a bf16 or fp8 cache");
  }
  if ((args.q_norm_weight == nullptr) != (args.k_norm_weight == nullptr)) {
    return absl::InvalidArgumentError("RopeKvStore: q_norm_weight and k_norm_weight go together");
  }
  const void* buffers[] = {args.qkv, args.kv_layer, args.q_norm_weight, args.k_norm_weight};
  for (const void* p : buffers) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
      return absl::InvalidArgumentError("CUDA RopeKvStore needs 16-byte aligned buffers");
    }
  }
  const int grid = static_cast<int>(std::min<int64_t>(args.num_tokens, int64_t{NumSms()} * 8));
  const KvLayout layout{.num_layers = 1,
                        .num_pages = args.num_pages,
                        .page_size = args.page_size,
                        .num_kv_heads = args.num_kv_heads,
                        .head_dim = args.head_dim,
                        .dtype = args.kv_dtype};
  const Fp8Pages fp8{layout.PageBytes(), layout.PageScaleStart()};
  const bool f8 = layout.fp8();
  switch (args.head_dim) {
    case 64:
      if (f8) {
        RopeKvStoreKernel<64, true><<<grid, kThreads, 0, stream>>>(args, fp8);
      } else {
        RopeKvStoreKernel<64, false><<<grid, kThreads, 0, stream>>>(args, fp8);
      }
      break;
    case 128:
      if (f8) {
        RopeKvStoreKernel<128, true><<<grid, kThreads, 0, stream>>>(args, fp8);
      } else {
        RopeKvStoreKernel<128, false><<<grid, kThreads, 0, stream>>>(args, fp8);
      }
      break;
    case 256:
      if (f8) {
        RopeKvStoreKernel<256, true><<<grid, kThreads, 0, stream>>>(args, fp8);
      } else {
        RopeKvStoreKernel<256, false><<<grid, kThreads, 0, stream>>>(args, fp8);
      }
      break;
    default:
      return absl::InvalidArgumentError("CUDA RopeKvStore supports head_dim 64, 128 and 256");
  }
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tandem
