// The mixed-input tensor-core kernels' shared pieces (quant_gemm_tc.cu: QuantGemmTc, quant_gemv.cu:
// QuantGemv): code types, chunk geometry, mma.sync, one lane's A and B fragments of a chunk, and
// the host queries their launch plans share. CUDA only.
//
// A chunk is 64 code bytes of a weight row (int8: 64 k, uint4: 128 k). Lane (g, t) (g = lane / 4,
// t = lane % 4) holds bytes [16t, 16t + 16) of the chunk for rows g and g + 8 of a 16-row tile,
// and the mma's logical k inside the chunk is permuted so that those 16 bytes are exactly its
// A-fragment elements for the chunk's 4 (int8) or 8 (uint4) m16n8k16 steps (quant_gemm_tc.cu's
// header gives the permutation); its B fragments are a's elements at the same actual k's, read as
// 16-byte vectors of a's row at [LaneK t, LaneK (t + 1)) of the chunk.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/common/pdl.cuh"

namespace tandem::quant_tc {

enum class Code { kInt8, kUint4 };

inline constexpr int kChunkBytes = 64;  // code bytes of a row per chunk
inline constexpr int kSymmetricZero = 8;
inline constexpr float kTwo23 =
    8388608.0f;  // 2^23: an integer u < 2^23 in its mantissa is 2^23 + u

template <Code kCode>
constexpr int ChunkK() {
  return kCode == Code::kUint4 ? 2 * kChunkBytes : kChunkBytes;
}
// Consecutive k of a chunk per lane (16 int8 or 32 uint4 weights), and a's 16-byte vectors
// covering them (2 or 4): each feeds two mma steps.
template <Code kCode>
constexpr int LaneK() {
  return ChunkK<kCode>() / 4;
}
template <Code kCode>
constexpr int LaneAVectors() {
  return LaneK<kCode>() / 8;
}

__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Host: the SMs of the device current at the first call (a process's GPUs are assumed alike).
inline int DeviceSms() {
  static const int sms = [] {
    int device = 0, count = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      (void)cudaGetLastError();
    }
    return std::max(count, 1);
  }();
  return sms;
}

// Host: blocks of `kernel` at `threads` threads resident per SM (its registers and static shared
// memory); 1 if the runtime cannot say. Callers cache it per instantiation.
template <typename... Params>
int QueryBlocksPerSm(void (*kernel)(Params...), int threads) {
  int b = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, threads, 0) != cudaSuccess) {
    (void)cudaGetLastError();
  }
  return std::max(b, 1);
}

// A 16-byte vector of a (bf16): after a PDL wait a plain load (LoadAfterWait16: its producer may
// have run concurrently with the prologue), else through the read-only path.
template <bool kPdl>
__device__ __forceinline__ uint4 LoadA16(const __nv_bfloat16* p) {
  if constexpr (kPdl) return LoadAfterWait16(p);
  return __ldg(reinterpret_cast<const uint4*>(p));
}

// Two int8 codes (bytes b and b + 1 of x = word ^ 0x80808080) as an exact bf16 pair.
__device__ __forceinline__ uint32_t Int8PairToBf16x2(uint32_t x, int b) {
  const float lo = __uint_as_float(__byte_perm(x, 0x4b000000u, 0x7540 + b)) - (kTwo23 + 128.0f);
  const float hi = __uint_as_float(__byte_perm(x, 0x4b000000u, 0x7540 + b + 1)) - (kTwo23 + 128.0f);
  return __byte_perm(__float_as_uint(lo), __float_as_uint(hi), 0x7632);
}

// Nibbles i and i + 4 of word (shift = 4i) as bf16 (nibble - zero); zero2 holds bf16 128 + zero
// in both halves.
__device__ __forceinline__ uint32_t Uint4PairToBf16x2(uint32_t word, int shift, uint32_t zero2) {
  const uint32_t biased = ((word >> shift) & 0x000f000fu) | 0x43004300u;  // 128 + nibble
  const __nv_bfloat162 r = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&biased),
                                   *reinterpret_cast<const __nv_bfloat162*>(&zero2));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// bf16 128 + zero (zero 0..16) in both halves: 128's ulp is 1, so the zero point is the mantissa.
__device__ __forceinline__ uint32_t Uint4Zero2(uint32_t zero) {
  const uint32_t bits = 0x4300u + zero;
  return bits | (bits << 16);
}

// The B fragment (b0, b1) of mma step q (0, 1) of a's 16-byte vector av (8 bf16 at the lane's
// actual k's).
template <Code kCode>
__device__ __forceinline__ void BFragment(const uint4& av, int q, uint32_t& b0, uint32_t& b1) {
  if constexpr (kCode == Code::kInt8) {
    b0 = q == 0 ? av.x : av.z;
    b1 = q == 0 ? av.y : av.w;
  } else {
    const uint32_t lo = q == 0 ? av.x : av.y, hi = q == 0 ? av.z : av.w;
    b0 = __byte_perm(lo, hi, 0x5410);  // a[2q], a[2q + 4]
    b1 = __byte_perm(lo, hi, 0x7632);  // a[2q + 1], a[2q + 5]
  }
}

// The A fragment of mma step s (int8 0..3, uint4 0..7) of a chunk: rows g, g + 8 at logical k 2t,
// 2t + 1, then at 2t + 8, 2t + 9, from the lane's code vectors w[0] (row g) and w[1] (row g + 8);
// zero2[h] is Uint4Zero2 of row h's zero point (unused for int8).
template <Code kCode>
__device__ __forceinline__ void AFragment(const uint4 (&w)[2], int s, const uint32_t (&zero2)[2],
                                          uint32_t (&frag)[4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t words[4] = {w[h].x, w[h].y, w[h].z, w[h].w};
    if constexpr (kCode == Code::kInt8) {
      const uint32_t x = words[s] ^ 0x80808080u;
      frag[h] = Int8PairToBf16x2(x, 0);
      frag[2 + h] = Int8PairToBf16x2(x, 2);
    } else {
      const uint32_t word = words[s / 2];
      frag[h] = Uint4PairToBf16x2(word, 8 * (s % 2), zero2[h]);
      frag[2 + h] = Uint4PairToBf16x2(word, 8 * (s % 2) + 4, zero2[h]);
    }
  }
}

}  // namespace tandem::quant_tc
