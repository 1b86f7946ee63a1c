// FP8 KV tiles of the paged-attention kernels (--kv-cache-dtype fp8, kernels/common/kv_layout.h):
// the K/V e4m3 codes of a tile and their per-token fp32 scales are copied into a shared-memory
// stage with cp.async (16-byte copies: 16 codes each; 4-byte copies for the scales), then
// dequantized in shared memory into the bf16 tiles the bf16 kernels' ProcessTile / ProcessTileM
// read (code -> f16 exactly, times the row's scale in fp32, rounded once to bf16). So the
// kernels' math is unchanged and HBM carries the fp8 bytes (codes + scales); the dequantize costs
// shared-memory traffic and ~2 instructions per element (kernels/paged_attention/WORKLOG.md).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/paged_attention/attention_tile.cuh"

namespace tandem::attention {

// Byte geometry of one layer's fp8 pages (KvLayout::PageBytes / PageScaleStart, from the host).
struct Fp8Pages {
  int64_t page_bytes = 0;
  int64_t scale_start = 0;
};

// A stage: K codes [kKeys][D], V codes [kKeys][D], K scales [kKeys] fp32, V scales [kKeys] fp32.
template <int D, int kKeys>
constexpr int Fp8StageBytes() {
  return 2 * kKeys * D + 2 * kKeys * 4;
}

// 4-byte async copy global -> shared (through L1); `valid == false` writes zeros.
__device__ __forceinline__ void CpAsync4(void* smem, const void* gmem, bool valid) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(addr), "l"(gmem), "r"(bytes));
}
// The same copy with an L2 cache-eviction policy (EvictFirstPolicy).
__device__ __forceinline__ void CpAsync4Hinted(void* smem, const void* gmem, bool valid,
                                               uint64_t policy) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], 4, %2, %3;\n" ::"r"(addr),
               "l"(gmem), "r"(bytes), "l"(policy));
}

// The 16-byte chunk copies of one stage, plain or with the L2 policy.
template <bool kHinted>
__device__ __forceinline__ void CpAsync16Maybe(void* smem, const void* gmem, bool valid,
                                               uint64_t policy) {
  if constexpr (kHinted) {
    CpAsync16Hinted(smem, gmem, valid, policy);
  } else {
    CpAsync16(smem, gmem, valid);
  }
}
template <bool kHinted>
__device__ __forceinline__ void CpAsync4Maybe(void* smem, const void* gmem, bool valid,
                                              uint64_t policy) {
  if constexpr (kHinted) {
    CpAsync4Hinted(smem, gmem, valid, policy);
  } else {
    CpAsync4(smem, gmem, valid);
  }
}

// The stages' layouts (Fp8ChunkOffset, Fp8FusedChunkOffset): smem_layout.h.

// Copies keys [key0, key0 + kKeys) of K and V of view.kv_head (rows >= key_end zero-filled, so
// their codes and scales are 0) into `stage`, spread over kThreads threads starting at `tid`.
// view.kv is the layer's base address (bytes). kSwizzle: the chunks go to Fp8ChunkOffset's
// places; kHinted: the copies carry the L2 policy `policy`.
template <int D, int kKeys, int kThreads, bool kSwizzle = false, bool kHinted = false>
__device__ __forceinline__ void LoadKvTileFp8(const KvView& view, const Fp8Pages& geo, int key0,
                                              int key_end, uint8_t* stage, int tid,
                                              uint64_t policy = 0) {
  constexpr int kChunksPerRow = D / 16;  // 16 codes per 16-byte chunk
  constexpr int kChunks = kKeys * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "tile must split evenly over the threads");
  const auto* kv = reinterpret_cast<const uint8_t*>(view.kv);
  const int64_t v_codes = int64_t{view.num_kv_heads} * view.page_size * D;  // V after K
  const int64_t v_scales = int64_t{view.num_kv_heads} * view.page_size * 4;
  const bool pow2 = view.page_shift >= 0;
#pragma unroll
  for (int i = 0; i < kChunks / kThreads; ++i) {
    const int c = tid + i * kThreads;
    const int row = c / kChunksPerRow;
    const int col = (c % kChunksPerRow) * 16;
    const int key = key0 + row;
    const bool valid = key < key_end;
    const uint8_t* src = kv;
    if (valid) {
      const int page_idx = pow2 ? key >> view.page_shift : key / view.page_size;
      const int in_page = pow2 ? key & (view.page_size - 1) : key - page_idx * view.page_size;
      const int64_t page = view.table[page_idx];
      src =
          kv + page * geo.page_bytes + (int64_t{view.kv_head} * view.page_size + in_page) * D + col;
    }
    const int dst = Fp8ChunkOffset<D, kSwizzle>(row, col);
    CpAsync16Maybe<kHinted>(stage + dst, src, valid, policy);
    CpAsync16Maybe<kHinted>(stage + kKeys * D + dst, valid ? src + v_codes : kv, valid, policy);
  }
  float* scales = reinterpret_cast<float*>(stage + 2 * kKeys * D);
  for (int row = tid; row < kKeys; row += kThreads) {
    const int key = key0 + row;
    const bool valid = key < key_end;
    const uint8_t* src = kv;
    if (valid) {
      const int page_idx = pow2 ? key >> view.page_shift : key / view.page_size;
      const int in_page = pow2 ? key & (view.page_size - 1) : key - page_idx * view.page_size;
      const int64_t page = view.table[page_idx];
      src = kv + page * geo.page_bytes + geo.scale_start +
            (int64_t{view.kv_head} * view.page_size + in_page) * 4;
    }
    CpAsync4Maybe<kHinted>(scales + row, src, valid, policy);
    CpAsync4Maybe<kHinted>(scales + kKeys + row, valid ? src + v_scales : kv, valid, policy);
  }
}

// LoadKvTileFp8 for power-of-two pages of >= 4 tokens (decode_tile_copy.cuh's fast path, same
// contract): `entries` holds the tile's block-table entries one per lane (TileTableEntries), so
// a chunk's page is one shuffle and its address one 32 x 32 -> 64-bit multiply-add. Every thread
// of the kThreads must call it (the shuffles); threadIdx.x < kThreads.
template <int D, int kKeys, int kThreads, bool kSwizzle = false, bool kHinted = false>
__device__ __forceinline__ void CopyTileFp8TablePerLane(const KvView& view, const Fp8Pages& geo,
                                                        int32_t entries, int key0, int key_end,
                                                        uint8_t* stage, uint64_t policy = 0) {
  constexpr int kChunksPerRow = D / 16;
  constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  static_assert(kThreads % kChunksPerRow == 0 && kKeys % kRowsPerPass == 0, "even split");
  static_assert(kThreads >= kKeys, "one scale row per thread");
  const int shift = view.page_shift;
  const int mask = (1 << shift) - 1;
  const auto page_bytes = static_cast<uint32_t>(geo.page_bytes);
  const uint32_t v_codes = (static_cast<uint32_t>(view.num_kv_heads) << shift) * D;
  const uint32_t v_scales = (static_cast<uint32_t>(view.num_kv_heads) << shift) * 4;
  const auto* kv = reinterpret_cast<const uint8_t*>(view.kv);
  const int r0 = threadIdx.x / kChunksPerRow;
  const int col = (threadIdx.x % kChunksPerRow) * 16;
  const int first_row = (key0 & mask) + r0;      // rows counted from the tile's first page
  const int row_end = key_end - (key0 & ~mask);  // rows below it hold keys
  const uint8_t* head = kv + (static_cast<uint32_t>(view.kv_head) << shift) * D + col;
#pragma unroll
  for (int i = 0; i < kKeys / kRowsPerPass; ++i) {
    const int row = first_row + i * kRowsPerPass;
    const uint32_t page = __shfl_sync(0xffffffffu, entries, row >> shift);
    const uint8_t* src = head + (uint64_t{page} * page_bytes + (row & mask) * D);
    const bool valid = row < row_end;
    const int dst = Fp8ChunkOffset<D, kSwizzle>(r0 + i * kRowsPerPass, col);
    CpAsync16Maybe<kHinted>(stage + dst, src, valid, policy);
    CpAsync16Maybe<kHinted>(stage + kKeys * D + dst, src + v_codes, valid, policy);
  }
  // Scales: thread t < kKeys copies tile row t's K and V scale (all lanes shuffle).
  const int t = threadIdx.x % kKeys;
  const int srow = (key0 & mask) + t;
  const uint32_t page = __shfl_sync(0xffffffffu, entries, srow >> shift);
  if (threadIdx.x < kKeys) {
    const uint8_t* src =
        kv + (uint64_t{page} * page_bytes + geo.scale_start +
              ((static_cast<uint32_t>(view.kv_head) << shift) + (srow & mask)) * 4);
    const bool valid = srow < row_end;
    float* scales = reinterpret_cast<float*>(stage + 2 * kKeys * D);
    CpAsync4Maybe<kHinted>(scales + t, src, valid, policy);
    CpAsync4Maybe<kHinted>(scales + kKeys + t, src + v_scales, valid, policy);
  }
}

// Dequantizes rows [row0, row0 + kRows) of K and V of `stage` into k_s / v_s (bf16, rows
// [0, kRows) of stride D + kRowPad), spread over kThreads threads starting at `tid`.
template <int D, int kKeys, int kRows, int kThreads>
__device__ __forceinline__ void DequantizeTileFp8(const uint8_t* stage, int row0,
                                                  __nv_bfloat16* k_s, __nv_bfloat16* v_s, int tid) {
  constexpr int kChunksPerRow = D / 16;
  const float* scales = reinterpret_cast<const float*>(stage + 2 * kKeys * D);
  for (int c = tid; c < 2 * kRows * kChunksPerRow; c += kThreads) {
    const int kv = c / (kRows * kChunksPerRow);
    const int cc = c % (kRows * kChunksPerRow);
    const int row = cc / kChunksPerRow;
    const int col = (cc % kChunksPerRow) * 16;
    const uint4 u =
        *reinterpret_cast<const uint4*>(stage + kv * kKeys * D + (row0 + row) * D + col);
    const float s = scales[kv * kKeys + row0 + row];
    const auto* pairs = reinterpret_cast<const __nv_fp8x2_storage_t*>(&u);
    uint32_t out[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pairs[j], __NV_E4M3)));
      out[j] = PackBf16(f.x * s, f.y * s);
    }
    __nv_bfloat16* dst = (kv == 0 ? k_s : v_s) + row * (D + kRowPad) + col;
    reinterpret_cast<uint4*>(dst)[0] = make_uint4(out[0], out[1], out[2], out[3]);
    reinterpret_cast<uint4*>(dst)[1] = make_uint4(out[4], out[5], out[6], out[7]);
  }
}

}  // namespace tandem::attention
