// The prefill kernel's warp step (paged_attention.cu): like ProcessTile (attention_tile.cuh) but
// a warp owns kM row tiles of 16 (32 rows for kM = 2) and takes its query fragments from shared
// memory with ldmatrix, so every K and V fragment read from shared memory feeds kM mma: the
// shared-memory traffic per FLOP, which bounds a 16-row warp, drops by ~2.5x for kM = 2.
#pragma once

#include "kernels/paged_attention/attention_tile.cuh"

namespace tandem::attention {

// One K/V tile of kKeys keys for kM row tiles. q_s: the warp's first query row in shared
// memory ([kM * 16][D + kRowPad]); limit[mt][i]: keys < limit are visible to row (g + 8 i) of
// row tile mt; `masked`: some key of the tile is invisible to some row.
template <int D, int kKeys, int kM>
__device__ __forceinline__ void ProcessTileM(WarpAccum<D> (&acc)[kM], const __nv_bfloat16* q_s,
                                             const __nv_bfloat16* k_s, const __nv_bfloat16* v_s,
                                             int key0, const int (&limit)[kM][2], bool masked,
                                             float scale_log2, int lane) {
  const int t = lane & 3;
  constexpr int kStride = D + kRowPad;
  const int lrow = (lane & 7) + ((lane >> 3) & 1) * 8;  // ldmatrix row of this lane (A, V)
  const int lcol = (lane >> 4) * 8;
  float s[kM][kKeys / 8][4];
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) {
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0;
  }
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    uint32_t qa[kM][4];
#pragma unroll
    for (int mt = 0; mt < kM; ++mt) {
      LdMatrixX4(qa[mt], q_s + (mt * 16 + lrow) * kStride + ks * 16 + lcol);
    }
#pragma unroll
    for (int n = 0; n < kKeys / 8; n += 2) {
      // b[0], b[1]: n-tile n; b[2], b[3]: n-tile n + 1 (keys are the rows of k_s).
      uint32_t b[4];
      const int key = n * 8 + (lane & 7) + (lane >> 4) * 8;
      LdMatrixX4(b, k_s + key * kStride + ks * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
        Mma16816(s[mt][n], qa[mt], b[0], b[1]);
        Mma16816(s[mt][n + 1], qa[mt], b[2], b[3]);
      }
    }
  }
  uint32_t pa[kM][kKeys / 16][4];  // P as A fragments, per row tile and 16-key step
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) {
    float row_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + n * 8 + 2 * t + (e & 1);
        float v = s[mt][n][e] * scale_log2;
        if (masked && key >= limit[mt][e >> 1]) v = -INFINITY;
        s[mt][n][e] = v;
        row_max[e >> 1] = fmaxf(row_max[e >> 1], v);
      }
    }
    float corr[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      row_max[i] = fmaxf(row_max[i], __shfl_xor_sync(0xffffffffu, row_max[i], 1));
      row_max[i] = fmaxf(row_max[i], __shfl_xor_sync(0xffffffffu, row_max[i], 2));
      const float m_new = fmaxf(acc[mt].m[i], row_max[i]);
      const float base = m_new == -INFINITY ? 0.0f : m_new;  // no keys seen yet: no NaN
      corr[i] = exp2f(acc[mt].m[i] - base);
      acc[mt].m[i] = m_new;
      row_max[i] = base;
      acc[mt].l[i] *= corr[i];
    }
    // Rescale only when some row's maximum moved (rarer as a row sees more keys): the 4 D / 8
    // multiplies per row tile are a large share of the non-mma instructions.
    if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) {
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        acc[mt].o[n][0] *= corr[0];
        acc[mt].o[n][1] *= corr[0];
        acc[mt].o[n][2] *= corr[1];
        acc[mt].o[n][3] *= corr[1];
      }
    }
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[mt][n][e] = exp2f(s[mt][n][e] - row_max[e >> 1]);
        acc[mt].l[e >> 1] += s[mt][n][e];
      }
    }
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      pa[mt][kk][0] = PackBf16(s[mt][2 * kk][0], s[mt][2 * kk][1]);
      pa[mt][kk][1] = PackBf16(s[mt][2 * kk][2], s[mt][2 * kk][3]);
      pa[mt][kk][2] = PackBf16(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
      pa[mt][kk][3] = PackBf16(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
    }
  }
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
#pragma unroll
    for (int dn = 0; dn < D / 16; ++dn) {
      uint32_t b[4];
      LdMatrixX4Trans(b, v_s + (kk * 16 + lrow) * kStride + dn * 16 + lcol);
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
        Mma16816(acc[mt].o[2 * dn], pa[mt][kk], b[0], b[1]);
        Mma16816(acc[mt].o[2 * dn + 1], pa[mt][kk], b[2], b[3]);
      }
    }
  }
}

}  // namespace tandem::attention
