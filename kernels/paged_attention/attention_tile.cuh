// Warp-level building blocks of the paged-attention kernels (sm_80+ mma.sync, bf16 in, fp32
// accumulate), shared by the decode and prefill kernels in paged_attention.cu.
//
// A warp owns 16 packed query rows (attention_plan.h) and streams K/V tiles of kKeys keys from
// shared memory. Fragment layouts are those of mma.m16n8k16 (g = lane / 4, t = lane % 4):
//   A (16x16 bf16): a0 (row g, k 2t..2t+1), a1 (row g+8, k 2t..), a2 (row g, k 2t+8..), a3 (g+8,
//   2t+8) B (16x8 bf16):  b0 (k 2t..2t+1, col g), b1 (k 2t+8.., col g) C (16x8 f32):   c0 c1 (row
//   g, cols 2t, 2t+1), c2 c3 (row g+8, cols 2t, 2t+1)
// so each thread owns rows g and g+8 of the tile. Scores live in the log2 domain (scaled by
// scale * log2(e)) so the softmax uses exp2.
//
// Shared-memory tiles hold kKeys rows of head_dim bf16 plus 16 bytes of padding per row: the
// 16-byte pad staggers rows by 4 banks, so both the 32-bit K reads and the ldmatrix V reads are
// conflict-free.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/paged_attention/smem_layout.h"

namespace tandem::attention {

constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ void Mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const void* smem) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* smem) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// 16-byte async copy global -> shared; `valid == false` writes zeros and reads nothing.
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(gmem),
               "r"(bytes));
}
// The same copy with an L2 cache-eviction policy (EvictFirstPolicy).
__device__ __forceinline__ void CpAsync16Hinted(void* smem, const void* gmem, bool valid,
                                                uint64_t policy) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(addr),
               "l"(gmem), "r"(bytes), "l"(policy));
}

// L2 evict-first policy for a stream read once per launch (K/V in small-batch decode, so the
// small data that every launch re-reads stays in L2).
__device__ __forceinline__ uint64_t EvictFirstPolicy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n"); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Where one sequence's K/V live: the paged layout of kernels/common/kv_layout.h for one layer.
struct KvView {
  const __nv_bfloat16* kv;  // [num_pages][2][num_kv_heads][page_size][head_dim]
  const int32_t* table;     // this sequence's block table
  int num_kv_heads;
  int page_size;
  int page_shift;  // log2(page_size) when it is a power of two, else -1 (slow division)
  int kv_head;
};

__host__ __device__ inline int PageShift(int page_size) {
  int shift = 0;
  while ((1 << shift) < page_size) ++shift;
  return (1 << shift) == page_size ? shift : -1;
}

// Copies keys [key0, key0 + kKeys) of K and V (rows >= key_end zero-filled) into k_s / v_s
// ([kKeys][D + kRowPad]), spread over kThreads threads starting at `tid`. kHinted: the copies
// carry the L2 policy `policy` (EvictFirstPolicy); otherwise it is ignored.
template <int D, int kKeys, int kThreads, bool kHinted = false>
__device__ __forceinline__ void LoadKvTile(const KvView& view, int key0, int key_end,
                                           __nv_bfloat16* k_s, __nv_bfloat16* v_s, int tid,
                                           uint64_t policy = 0) {
  constexpr int kChunksPerRow = D / 8;  // 16-byte chunks
  constexpr int kChunks = kKeys * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "tile must split evenly over the threads");
#pragma unroll
  for (int i = 0; i < kChunks / kThreads; ++i) {
    const int c = tid + i * kThreads;
    const int row = c / kChunksPerRow;
    const int col = (c % kChunksPerRow) * 8;
    const int key = key0 + row;
    const bool valid = key < key_end;
    const __nv_bfloat16* k_src = view.kv;
    if (valid) {
      const bool pow2 = view.page_shift >= 0;
      const int page_idx = pow2 ? key >> view.page_shift : key / view.page_size;
      const int in_page = pow2 ? key & (view.page_size - 1) : key - page_idx * view.page_size;
      const int64_t page = view.table[page_idx];
      const int64_t head_elems = int64_t{view.page_size} * D;
      k_src = view.kv + (page * 2 * view.num_kv_heads + view.kv_head) * head_elems +
              int64_t{in_page} * D + col;
    }
    const __nv_bfloat16* v_src =
        valid ? k_src + int64_t{view.num_kv_heads} * view.page_size * D : view.kv;
    if constexpr (kHinted) {
      CpAsync16Hinted(k_s + row * (D + kRowPad) + col, k_src, valid, policy);
      CpAsync16Hinted(v_s + row * (D + kRowPad) + col, v_src, valid, policy);
    } else {
      CpAsync16(k_s + row * (D + kRowPad) + col, k_src, valid);
      CpAsync16(v_s + row * (D + kRowPad) + col, v_src, valid);
    }
  }
}

// Online-softmax state of one warp's 16 rows: output accumulators, running max (log2 domain)
// and this thread's partial row sums (summed over the quad at the end).
template <int D>
struct WarpAccum {
  float o[D / 8][4];
  float m[2];
  float l[2];
  uint32_t q[D / 16][4];  // A fragments of the queries
};

template <int D>
__device__ __forceinline__ void InitAccum(WarpAccum<D>& acc) {
#pragma unroll
  for (int n = 0; n < D / 8; ++n) acc.o[n][0] = acc.o[n][1] = acc.o[n][2] = acc.o[n][3] = 0.0f;
  acc.m[0] = acc.m[1] = -INFINITY;
  acc.l[0] = acc.l[1] = 0.0f;
}

// Loads the A fragments of the warp's queries. q_row[i] points at row (g + 8 i)'s head vector,
// or is null for a row past the end (its fragment is zero).
template <int D>
__device__ __forceinline__ void LoadQuery(WarpAccum<D>& acc, const __nv_bfloat16* q_row0,
                                          const __nv_bfloat16* q_row1, int t) {
  const uint32_t* r0 = reinterpret_cast<const uint32_t*>(q_row0);
  const uint32_t* r1 = reinterpret_cast<const uint32_t*>(q_row1);
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const int w = ks * 8 + t;  // 32-bit word of columns 16 ks + 2t
    acc.q[ks][0] = r0 ? r0[w] : 0u;
    acc.q[ks][1] = r1 ? r1[w] : 0u;
    acc.q[ks][2] = r0 ? r0[w + 4] : 0u;
    acc.q[ks][3] = r1 ? r1[w + 4] : 0u;
  }
}

// One K/V tile: S = Q K^T (log2-scaled), causal/length mask, online softmax, O += P V.
// Key j of the tile is absolute key key0 + j; row i of this thread (0: g, 1: g+8) sees keys
// < limit[i]. `masked` is false when every key of the tile is visible to every row. kTma: k_s and
// v_s are in the TMA stages' layout (TileOffset, smem_layout.h), rows counted from a multiple of
// 8.
template <int D, int kKeys, bool kTma = false>
__device__ __forceinline__ void ProcessTile(WarpAccum<D>& acc, const __nv_bfloat16* k_s,
                                            const __nv_bfloat16* v_s, int key0,
                                            const int (&limit)[2], bool masked, float scale_log2,
                                            int lane) {
  const int g = lane >> 2, t = lane & 3;
  float s[kKeys / 8][4];
#pragma unroll
  for (int n = 0; n < kKeys / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) {
      const int r = n * 8 + g;
      const auto* k0 =
          reinterpret_cast<const uint32_t*>(k_s + TileOffset<D, kTma>(r, ks * 16 + 2 * t));
      const auto* k1 =
          reinterpret_cast<const uint32_t*>(k_s + TileOffset<D, kTma>(r, ks * 16 + 8 + 2 * t));
      Mma16816(s[n], acc.q[ks], *k0, *k1);
    }
  }
  float row_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = key0 + n * 8 + 2 * t + (e & 1);
      float v = s[n][e] * scale_log2;
      if (masked && key >= limit[e >> 1]) v = -INFINITY;
      s[n][e] = v;
      row_max[e >> 1] = fmaxf(row_max[e >> 1], v);
    }
  }
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
  }
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    acc.o[n][0] *= corr[0];
    acc.o[n][1] *= corr[0];
    acc.o[n][2] *= corr[1];
    acc.o[n][3] *= corr[1];
  }
#pragma unroll
  for (int n = 0; n < kKeys / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[n][e] = exp2f(s[n][e] - row_max[e >> 1]);
      acc.l[e >> 1] += s[n][e];
    }
  }
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    const uint32_t a[4] = {
        PackBf16(s[2 * kk][0], s[2 * kk][1]), PackBf16(s[2 * kk][2], s[2 * kk][3]),
        PackBf16(s[2 * kk + 1][0], s[2 * kk + 1][1]), PackBf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
    const int key = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int dn = 0; dn < D / 16; ++dn) {
      uint32_t b[4];
      LdMatrixX4Trans(b, v_s + TileOffset<D, kTma>(key, dn * 16 + (lane >> 4) * 8));
      Mma16816(acc.o[2 * dn], a, b[0], b[1]);
      Mma16816(acc.o[2 * dn + 1], a, b[2], b[3]);
    }
  }
}

// Sums the partial row sums over the quad; returns 1 / l (0 for a row with no keys).
template <int D>
__device__ __forceinline__ void FinishRows(WarpAccum<D>& acc, float (&inv_l)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    acc.l[i] += __shfl_xor_sync(0xffffffffu, acc.l[i], 1);
    acc.l[i] += __shfl_xor_sync(0xffffffffu, acc.l[i], 2);
    inv_l[i] = acc.l[i] > 0.0f ? 1.0f / acc.l[i] : 0.0f;
  }
}

}  // namespace tandem::attention
