// Fused QK-norm + rotary + KV-cache store (rope_kv_store.h), CUDA, bf16 qkv and cache.
//
// One CTA per token at a time. Its cos/sin are computed once into shared memory; the token's
// qkv row ((num_q_heads + 2 num_kv_heads) heads of D bf16) is read as 16-byte chunks, one per
// thread, kChunksPerThread of them in flight per thread. A head is D / 8 consecutive threads
// (inside one warp): the QK-norm sum of squares is a shuffle reduction over them, and the
// rotate-half partner of a chunk sits D / 16 threads away (one shuffle). The numerics follow
// RopeKvStoreRef: fp32 math, angle = float(position) * inv_freq[i] with an accurate sincosf
// (angles reach 10^5 rad), one rounding to bf16; the cache gets the rounded value.
#include <cuda_bf16.h>

#include <algorithm>

#include "base/cuda_check.h"
#include "kernels/rope_kv_store/rope_kv_store.h"

namespace tandem {
namespace {

constexpr int kThreads = 256;
constexpr int kChunksPerThread = 4;

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

// Normalises (optionally) and rotates one 16-byte chunk `c` of the token's row; stores it back
// and into the cache. Every lane must call this (shuffles), valid or not.
template <int D>
__device__ __forceinline__ void RotateChunk(const RopeKvStoreArgs& a, int64_t t, int c, bool valid,
                                            const uint4& raw, int32_t slot, const float* cos_s,
                                            const float* sin_s, const float (&wq)[8],
                                            const float (&wk)[8]) {
  constexpr int kPerHead = D / 8;
  const int heads = a.num_q_heads + 2 * a.num_kv_heads;
  const int h = c / kPerHead, part = c % kPerHead;
  const bool is_q = h < a.num_q_heads;
  const bool is_v = h >= a.num_q_heads + a.num_kv_heads;
  float v[8];
  Unpack(raw, v);
  if (a.q_norm_weight != nullptr) {
    float sum_sq = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) sum_sq += v[j] * v[j];
#pragma unroll
    for (int o = 1; o < kPerHead; o <<= 1) sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, o);
    if (!is_v && valid) {
      const float inv_rms = rsqrtf(sum_sq / static_cast<float>(D) + a.norm_eps);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = v[j] * inv_rms * (is_q ? wq[j] : wk[j]);
    }
  }
  float partner[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) partner[j] = __shfl_xor_sync(0xffffffffu, v[j], kPerHead / 2);
  if (!valid) return;
  auto* row = static_cast<uint4*>(a.qkv) + (t * heads + h) * kPerHead;
  if (!is_v) {
    const bool low = part < kPerHead / 2;
    const int i0 = (part % (kPerHead / 2)) * 8;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float cs = cos_s[i0 + j], sn = sin_s[i0 + j];
      v[j] = low ? v[j] * cs - partner[j] * sn : v[j] * cs + partner[j] * sn;
    }
    row[part] = Pack(v);
  }
  if (is_q || slot < 0) return;
  const int kv = is_v ? 1 : 0;
  const int kv_head = h - a.num_q_heads - kv * a.num_kv_heads;
  const int64_t dst_row =
      ((int64_t{slot / a.page_size} * 2 + kv) * a.num_kv_heads + kv_head) * a.page_size +
      slot % a.page_size;
  static_cast<uint4*>(a.kv_layer)[dst_row * kPerHead + part] = Pack(v);
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    RopeKvStoreKernel(const __grid_constant__ RopeKvStoreArgs a) {
  constexpr int kPerHead = D / 8;
  __shared__ float cos_s[D / 2], sin_s[D / 2];
  const int heads = a.num_q_heads + 2 * a.num_kv_heads;
  const int chunks = heads * kPerHead;
  // Every chunk this thread touches is part threadIdx.x % kPerHead of its head (kThreads is a
  // multiple of kPerHead), so its slice of the norm weights is loaded once.
  float wq[8] = {}, wk[8] = {};
  if (a.q_norm_weight != nullptr) {
    Unpack(static_cast<const uint4*>(a.q_norm_weight)[threadIdx.x % kPerHead], wq);
    Unpack(static_cast<const uint4*>(a.k_norm_weight)[threadIdx.x % kPerHead], wk);
  }
  for (int64_t t = blockIdx.x; t < a.num_tokens; t += gridDim.x) {
    __syncthreads();  // the previous token's cos/sin are no longer read
    if (threadIdx.x < D / 2) {
      float sn, cs;
      sincosf(static_cast<float>(a.positions[t]) * a.inv_freq[threadIdx.x], &sn, &cs);
      cos_s[threadIdx.x] = cs;
      sin_s[threadIdx.x] = sn;
    }
    const int32_t slot = a.slot_mapping[t];
    const auto* row = static_cast<const uint4*>(a.qkv) + t * chunks;
    __syncthreads();
    for (int c0 = 0; c0 < chunks; c0 += kThreads * kChunksPerThread) {
      uint4 raw[kChunksPerThread];
#pragma unroll
      for (int j = 0; j < kChunksPerThread; ++j) {
        const int c = c0 + j * kThreads + threadIdx.x;
        raw[j] = c < chunks ? row[c] : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int j = 0; j < kChunksPerThread; ++j) {
        const int c = c0 + j * kThreads + threadIdx.x;
        RotateChunk<D>(a, t, c, c < chunks, raw[j], slot, cos_s, sin_s, wq, wk);
      }
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
  switch (args.head_dim) {
    case 64:
      RopeKvStoreKernel<64><<<grid, kThreads, 0, stream>>>(args);
      break;
    case 128:
      RopeKvStoreKernel<128><<<grid, kThreads, 0, stream>>>(args);
      break;
    case 256:
      RopeKvStoreKernel<256><<<grid, kThreads, 0, stream>>>(args);
      break;
    default:
      return absl::InvalidArgumentError("CUDA RopeKvStore supports head_dim 64, 128 and 256");
  }
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tandem
