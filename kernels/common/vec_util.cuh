// Device helpers for memory-bound kernels: 16-byte loads/stores and bf16 <-> f32 on packed words.
// A uint4 holds 8 bf16 (or 4 f32). CUDA only.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace tandem {

// A 16-byte load that bypasses L1 (data read exactly once, e.g. weights or logits), with an L2
// prefetch hint of 256 bytes.
__device__ __forceinline__ uint4 LoadStreaming16(const void* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}

// Low and high bf16 of a 32-bit word as f32 (exact: bf16 is the top half of an f32).
__device__ __forceinline__ float Bf16Lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float Bf16Hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// Unpacks 8 bf16 into f32.
__device__ __forceinline__ void UnpackBf16x8(const uint4& v, float (&f)[8]) {
  f[0] = Bf16Lo(v.x);
  f[1] = Bf16Hi(v.x);
  f[2] = Bf16Lo(v.y);
  f[3] = Bf16Hi(v.y);
  f[4] = Bf16Lo(v.z);
  f[5] = Bf16Hi(v.z);
  f[6] = Bf16Lo(v.w);
  f[7] = Bf16Hi(v.w);
}

// Rounds two f32 to bf16 (nearest-even) and packs them, lo in the low half.
__device__ __forceinline__ uint32_t PackBf16x2(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ uint4 PackBf16x8(const float (&f)[8]) {
  return make_uint4(PackBf16x2(f[0], f[1]), PackBf16x2(f[2], f[3]), PackBf16x2(f[4], f[5]),
                    PackBf16x2(f[6], f[7]));
}

__device__ __forceinline__ float RoundBf16(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}

// Element i of a kF32 (is_bf16 = false) or kBF16 buffer as f32; the generic (slow) paths use it.
__device__ __forceinline__ float LoadAny(const void* p, bool is_bf16, int64_t i) {
  if (is_bf16) return Bf16Lo(static_cast<const uint16_t*>(p)[i]);
  return static_cast<const float*>(p)[i];
}
__device__ __forceinline__ void StoreAny(void* p, bool is_bf16, int64_t i, float v) {
  if (is_bf16) {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  } else {
    static_cast<float*>(p)[i] = v;
  }
}

inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace tandem
