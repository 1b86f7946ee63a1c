// The fused FP8 decode tile (Fp8DecodeKernel::kFused, paged_attention.cu; WORKLOG.md step 13):
// a warp reads the e4m3 codes of its 16 keys straight from the shared stage (fp8_tile.cuh,
// swizzled copies) into registers, converts them exactly to f16 (cvt.rn.f16x2.e4m3x2, two codes
// per instruction) and feeds f16 mma.sync; the per-key scales are applied outside the dot
// products:
//   score_j = scale_log2 * k_scale_j * (q . codes_j),   O += (p_j * v_scale_j) * vcodes_j.
// No shared bf16 tile and no dequantize pass (the kDequant kernel's cost: WORKLOG.md step 12).
//
// Ranges. f16 has 5 exponent bits, so both f16 operands are brought near 2^15 by powers of two
// (exact): the queries by one factor per item and warp (the 16 packed rows' largest |q| lands in
// [2^14, 2^15); a row 2^28 smaller than the largest still converts exactly), and p * v_scale by a
// running factor 2^(141 - v_exp), where v_exp is the largest V scale's biased exponent seen so
// far: a new maximum rescales O by the ratio (folded into the softmax correction), so every
// weight stays below 2^15 and weights down to 2^-29 of the largest scale keep 11 bits. The
// accumulated O is unscaled once at the end of the item (FinishFused). Codes are exact in f16.
//
// Layouts (g = lane / 4, t = lane % 4). The dot products' reduction order is free, so the
// head dims are permuted to suit the fp8 bytes:
//  - S = Q K^T: k-step ks takes, in thread t, dims 16 FusedKChunk(t, ks / 4) + 4 (ks % 4) +
//    {0, 1} (register b0) and + {2, 3} (b1); so one 16-byte shared load gives a key row's codes
//    for four k-steps, and the queries are loaded in the same order (LoadQueryFused). The chunk
//    is t + 4 (ks / 4) on the cp.async stages' swizzle; on the TMA stages' (kTma,
//    Fp8FusedChunkOffset) it is 2 t + ks / 4: a quarter-warp reads rows r, r + 1 (r even), whose
//    XORs r & 7 differ in bit 0, so chunks {0, 2, 4, 6} of one and {1, 3, 5, 7} of the other
//    land on distinct banks (t + 4 c would put both rows on chunks 0-3).
//  - O += P V: n-tile 8 J + j (J < D / 64, j < 8), column g, is head dim 64 J + 8 g + j; thread
//    (g, t) loads 8 bytes of V rows 2t, 2t + 1, 2t + 8, 2t + 9 at dims 64 J + 8 g, and one prmt
//    per two dims pairs the bytes of keys 2t, 2t + 1 (the mma's k pairs). The accumulator
//    o[8 J + j][c] then holds dim 64 J + 16 t + 8 c + j: a thread owns 16 consecutive dims per J
//    and row (StoreFusedRow writes them in order). On either swizzle a half-warp's 8-byte reads
//    (rows 2t + const, t < 4: XORs 2t or 2t + 1) cover 16 distinct bank pairs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/paged_attention/attention_tile.cuh"
#include "kernels/paged_attention/fp8_tile.cuh"

namespace tandem::attention {

// The smallest running V exponent (the weights' factor 2^(141 - v_exp) <= 2^126 and the final
// unscale 2^(v_exp - 141) >= 2^-126 stay normal fp32).
constexpr int kFusedMinVExp = 15;

// Per-warp state of the fused kernel besides WarpAccum.
struct FusedState {
  float k_factor = 0.0f;      // scale_log2 / (the queries' power-of-two factor)
  int v_exp = kFusedMinVExp;  // biased fp32 exponent bound of the V scales so far
};

__device__ __forceinline__ float Pow2(int biased_exp) {  // 2^(biased_exp - 127), exp in [1, 254]
  return __int_as_float(biased_exp << 23);
}

__device__ __forceinline__ void MmaF16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                       uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four e4m3 codes (bytes 0..3 of w) to two f16x2: lo = bytes 0, 1 and hi = bytes 2, 3, the lower
// byte in the lower half. Exact.
__device__ __forceinline__ void E4m3x4ToF16x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
  asm("{\n"
      " .reg .b16 l, h;\n"
      " mov.b32 {l, h}, %2;\n"
      " cvt.rn.f16x2.e4m3x2 %0, l;\n"
      " cvt.rn.f16x2.e4m3x2 %1, h;\n"
      "}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
}

__device__ __forceinline__ uint32_t Prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

__device__ __forceinline__ uint32_t PackF16(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t Word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Loads the warp's queries as f16 A fragments in the permuted dim order above (acc.q), scaled by
// one power of two so that the 16 rows' largest |q| lies in [2^14, 2^15); returns the score
// factor scale_log2 / that power. q_row[i]: row (g + 8 i)'s head vector, or null (zeros).
template <int D, bool kTma = false>
__device__ __forceinline__ float LoadQueryFused(WarpAccum<D>& acc, const __nv_bfloat16* q_row0,
                                                const __nv_bfloat16* q_row1, int lane,
                                                float scale_log2) {
  const int t = lane & 3;
  const uint32_t* rows[2] = {reinterpret_cast<const uint32_t*>(q_row0),
                             reinterpret_cast<const uint32_t*>(q_row1)};
  uint32_t raw[D / 16][4];  // bf16x2: [ks][a0 a1 a2 a3]
  float amax = 0.0f;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const int w = (16 * FusedKChunk<kTma>(t, ks / 4) + 4 * (ks % 4)) / 2;  // 32-bit word
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      raw[ks][i] = rows[i] ? rows[i][w] : 0u;
      raw[ks][i + 2] = rows[i] ? rows[i][w + 1] : 0u;
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      amax = fmaxf(amax, fabsf(__uint_as_float(raw[ks][r] << 16)));
      amax = fmaxf(amax, fabsf(__uint_as_float(raw[ks][r] & 0xffff0000u)));
    }
  }
#pragma unroll
  for (int m = 1; m < 32; m <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
  // amax in [2^(e - 127), 2^(e - 126)): times 2^(141 - e) it lies in [2^14, 2^15).
  const int e = (__float_as_int(amax) >> 23) & 0xff;
  const int shift = min(max(141 - e, -126), 126);
  const float up = Pow2(127 + shift);
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      acc.q[ks][r] = PackF16(__uint_as_float(raw[ks][r] << 16) * up,
                             __uint_as_float(raw[ks][r] & 0xffff0000u) * up);
    }
  }
  return scale_log2 * Pow2(127 - shift);
}

// One warp's 16 keys (tile rows [row0, row0 + 16) of `stage`, smem_layout.h's Fp8ChunkOffset
// layout, or with kTma the TMA stages' Fp8FusedChunkOffset): S = Q K^T on the codes, scores times
// the K scales, mask, online softmax, O += (P x V scales) V. Same key/limit contract as ProcessTile
// (attention_tile.cuh). The queries must have been loaded with the same kTma.
template <int D, int kKeys, bool kTma = false>
__device__ __forceinline__ void ProcessTileFused(WarpAccum<D>& acc, FusedState& st,
                                                 const uint8_t* stage, int row0, int key0,
                                                 const int (&limit)[2], bool masked, int lane) {
  const int g = lane >> 2, t = lane & 3;
  const uint8_t* k_codes = stage;
  const uint8_t* v_codes = stage + kKeys * D;
  const float* k_scales = reinterpret_cast<const float*>(stage + 2 * kKeys * D) + row0;
  const float* v_scales = k_scales + kKeys;
  constexpr int kChunks = D / 64;  // 16-byte K chunks per thread and key row
  // S = Q K^T: keys n * 8 + g (n = 0, 1); thread t's chunks t + 4 c of the row.
  uint4 kw[2][kChunks];
#pragma unroll
  for (int n = 0; n < 2; ++n) {
    const int r = row0 + n * 8 + g;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      kw[n][c] = *reinterpret_cast<const uint4*>(
          k_codes + Fp8FusedChunkOffset<D, kTma>(r, 16 * FusedKChunk<kTma>(t, c)));
    }
  }
  float s[2][4];
#pragma unroll
  for (int n = 0; n < 2; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      uint32_t b0, b1;
      E4m3x4ToF16x2(Word(kw[n][ks / 4], ks % 4), b0, b1);
      MmaF16(s[n], acc.q[ks], b0, b1);
    }
  }
  // Scores: s[n][e] is row g + 8 (e / 2), key n * 8 + 2t + (e & 1).
  float2 ksc[2], vsc[2];
#pragma unroll
  for (int n = 0; n < 2; ++n) {
    ksc[n] = *reinterpret_cast<const float2*>(k_scales + n * 8 + 2 * t);
    vsc[n] = *reinterpret_cast<const float2*>(v_scales + n * 8 + 2 * t);
  }
  float row_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < 2; ++n) {
    const float f[2] = {ksc[n].x * st.k_factor, ksc[n].y * st.k_factor};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = key0 + n * 8 + 2 * t + (e & 1);
      float v = s[n][e] * f[e & 1];
      if (masked && key >= limit[e >> 1]) v = -INFINITY;
      s[n][e] = v;
      row_max[e >> 1] = fmaxf(row_max[e >> 1], v);
    }
  }
  // The V weights' running exponent: the largest V scale of the warp's 16 keys (quad max).
  float vmax = fmaxf(fmaxf(vsc[0].x, vsc[0].y), fmaxf(vsc[1].x, vsc[1].y));
  vmax = fmaxf(vmax, __shfl_xor_sync(0xffffffffu, vmax, 1));
  vmax = fmaxf(vmax, __shfl_xor_sync(0xffffffffu, vmax, 2));
  const int v_exp = max(st.v_exp, (__float_as_int(vmax) >> 23) & 0xff);
  const int drop = v_exp - st.v_exp;  // O's factor falls by 2^drop (0 below fp32's range)
  const float o_rescale = drop > 126 ? 0.0f : Pow2(127 - drop);
  st.v_exp = v_exp;
  const float w_factor = Pow2(268 - v_exp);  // 2^(141 - v_exp): v_scale * it < 2^15
  float corr[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    row_max[i] = fmaxf(row_max[i], __shfl_xor_sync(0xffffffffu, row_max[i], 1));
    row_max[i] = fmaxf(row_max[i], __shfl_xor_sync(0xffffffffu, row_max[i], 2));
    const float m_new = fmaxf(acc.m[i], row_max[i]);
    // A row that has seen no visible key yet keeps m = -inf; subtract 0 instead (no NaN).
    const float base = m_new == -INFINITY ? 0.0f : m_new;
    corr[i] = exp2f(acc.m[i] - base);
    acc.m[i] = m_new;
    row_max[i] = base;
    acc.l[i] *= corr[i];
    corr[i] *= o_rescale;
  }
  // Past the first tiles a row's maximum and the V exponent rarely move (corr is then exactly 1):
  // the D / 2 multiplies are skipped when no row of the warp needs them.
  if (!__all_sync(0xffffffffu, corr[0] == 1.0f && corr[1] == 1.0f)) {
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      acc.o[n][0] *= corr[0];
      acc.o[n][1] *= corr[0];
      acc.o[n][2] *= corr[1];
      acc.o[n][3] *= corr[1];
    }
  }
#pragma unroll
  for (int n = 0; n < 2; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[n][e] = exp2f(s[n][e] - row_max[e >> 1]);
      acc.l[e >> 1] += s[n][e];
    }
  }
  // A = P x V scales (x 2^(141 - v_exp)) in f16: a0 row g keys 2t, 2t + 1; a1 row g + 8; a2, a3
  // the same rows, keys 2t + 8, 2t + 9.
  float w[2][2];
#pragma unroll
  for (int n = 0; n < 2; ++n) w[n][0] = vsc[n].x * w_factor, w[n][1] = vsc[n].y * w_factor;
  const uint32_t a[4] = {
      PackF16(s[0][0] * w[0][0], s[0][1] * w[0][1]), PackF16(s[0][2] * w[0][0], s[0][3] * w[0][1]),
      PackF16(s[1][0] * w[1][0], s[1][1] * w[1][1]), PackF16(s[1][2] * w[1][0], s[1][3] * w[1][1])};
  // O += A V: rows 2t, 2t + 1 (b0) and 2t + 8, 2t + 9 (b1), 8 bytes at dims 64 J + 8 g.
  const int r_lo = row0 + 2 * t;
#pragma unroll
  for (int J = 0; J < D / 64; ++J) {
    const int col = 64 * J + 16 * (g >> 1);  // the 16-byte chunk holding dims 64 J + 8 g
    const int half = 8 * (g & 1);
    uint2 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int r = r_lo + (k & 1) + 8 * (k >> 1);
      v[k] = *reinterpret_cast<const uint2*>(v_codes + Fp8FusedChunkOffset<D, kTma>(r, col) + half);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // dims + 4 h .. + 4 h + 3
      const uint32_t x0 = h ? v[0].y : v[0].x, x1 = h ? v[1].y : v[1].x;
      const uint32_t x8 = h ? v[2].y : v[2].x, x9 = h ? v[3].y : v[3].x;
      // Byte pairs (key 2t, key 2t + 1) of dims + 0, + 1 (0x5140) and + 2, + 3 (0x7362).
      uint32_t b0[4], b1[4];
      E4m3x4ToF16x2(Prmt(x0, x1, 0x5140), b0[0], b0[1]);
      E4m3x4ToF16x2(Prmt(x0, x1, 0x7362), b0[2], b0[3]);
      E4m3x4ToF16x2(Prmt(x8, x9, 0x5140), b1[0], b1[1]);
      E4m3x4ToF16x2(Prmt(x8, x9, 0x7362), b1[2], b1[3]);
#pragma unroll
      for (int j = 0; j < 4; ++j) MmaF16(acc.o[8 * J + 4 * h + j], a, b0[j], b1[j]);
    }
  }
}

// Undoes the V weights' factor 2^(141 - v_exp) in O (once per item, before the warp merge).
template <int D>
__device__ __forceinline__ void FinishFused(WarpAccum<D>& acc, const FusedState& st) {
  const float unscale = Pow2(st.v_exp - 14);  // 2^(v_exp - 141)
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc.o[n][e] *= unscale;
  }
}

// Writes this thread's outputs of row g + 8 i (i = 0, 1) in head-dim order to `row` (fp32, D
// floats, 16-byte aligned): per J, dims 64 J + 16 t + [0, 16) (see the layout above), times `e`;
// kAdd: added to what `row` holds (the stream kernel's chained warp merge, stream_decode.cu).
template <int D, bool kAdd = false>
__device__ __forceinline__ void StoreFusedRow(const WarpAccum<D>& acc, int i, int t, float* row,
                                              float e = 1.0f) {
#pragma unroll
  for (int J = 0; J < D / 64; ++J) {
    float4* dst = reinterpret_cast<float4*>(row + 64 * J + 16 * t);
#pragma unroll
    for (int c = 0; c < 2; ++c) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int n = 8 * J + 4 * h;
        float4 v = make_float4(acc.o[n][2 * i + c] * e, acc.o[n + 1][2 * i + c] * e,
                               acc.o[n + 2][2 * i + c] * e, acc.o[n + 3][2 * i + c] * e);
        if constexpr (kAdd) {
          const float4 old = dst[2 * c + h];
          v.x += old.x, v.y += old.y, v.z += old.z, v.w += old.w;
        }
        dst[2 * c + h] = v;
      }
    }
  }
}

}  // namespace tandem::attention
