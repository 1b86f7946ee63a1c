// TMA stages of the stream decode kernel on an fp8 cache (Fp8DecodeKernel::kFusedTma,
// stream_decode.cu; WORKLOG.md step 19). The cp.async stages (fp8_tile.cuh) cost every thread
// ~10 copies a tile, each with its page shuffle, 64-bit address and predicate: ~120 of the
// ~526 instructions a warp issues per 16-key tile in a kernel that is issue-bound, not
// bandwidth-bound (WORKLOG.md steps 15-16). Here one warp issues a tile's copies, one lane per
// page segment: two tensor copies (its K and V codes, box_rows x 128 bytes, written with TMA's
// 128-byte swizzle, Fp8FusedChunkOffset) and two bulk copies (its K and V scales), all
// completing on the stage's mbarrier; the other warps only wait on it.
//
// A segment is min(page_size, kDecodeKeys) keys of one page: pages of 8 to 64 keys hold a tile in
// whole pages (the plans start every item and split at a multiple of kDecodeKeys,
// decode_plan.h), larger pages hold it inside one page. A segment is copied whole even where its
// keys end before it (the item's last page): the cp.async copies zero-fill such rows, these copy
// whatever the pool holds there (unwritten slots, a later token's row: possibly NaN codes or
// scales), and segments past the item's end are not copied (the stage keeps an older tile's
// rows). So in an item's last, partial tile each warp zeroes the V codes and V scales of its rows
// past the item's keys before it reads them (ZeroFp8TailRows): their probabilities are 0, and
// 0 x NaN would still poison the P V products. K needs nothing: masked scores become -inf.
// Internal to kernels/paged_attention.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "kernels/paged_attention/attention_common.cuh"
#include "kernels/paged_attention/fp8_tile.cuh"
#include "kernels/paged_attention/tma_util.cuh"

namespace tandem::attention {

// Rows per copy (one page segment) and page sizes the TMA stages take: powers of two >= 8 (a
// segment of 8 rows is one 1024-byte swizzle atom, so every copy lands atom-aligned).
constexpr int kFp8TmaMinPage = 8;

__device__ __forceinline__ int Fp8TmaSegmentRows(const KvView& view) {
  return min(view.page_size, kDecodeKeys);
}

// The bytes a tile's copies complete on its barrier: every segment that holds one of its keys.
template <int D>
__device__ __forceinline__ uint32_t Fp8TmaTileBytes(const KvView& view, int key0, int key_end) {
  const int seg = Fp8TmaSegmentRows(view);
  const int segments = (min(kDecodeKeys, key_end - key0) + seg - 1) / seg;
  return static_cast<uint32_t>(segments * seg * 2 * (D + 4));
}

// Issues the copies of keys [key0, key_end) of tile key0 into `stage` (the fused kernel's stage
// layout: K codes [kDecodeKeys][D], V codes, K scales [kDecodeKeys], V scales; 1024-byte aligned)
// on `bar`. Called by every lane of one warp: lane 0 arms the barrier with the tile's bytes,
// then lane j issues segment j (its page: `entries` of lane j, TileTableEntries; the tile's
// first key is segment-aligned). `map`: the layer's codes (Fp8CodesTensorMap, stream_decode.cu).
template <int D>
__device__ __forceinline__ void IssueFp8TileTma(const KvView& view, const Fp8Pages& geo,
                                                const CUtensorMap* map, int32_t entries, int key0,
                                                int key_end, uint8_t* stage, uint64_t* bar,
                                                int lane) {
  const int seg = Fp8TmaSegmentRows(view);
  const int segments = (min(kDecodeKeys, key_end - key0) + seg - 1) / seg;
  if (lane == 0) sm90::MbarArriveExpectTx(bar, Fp8TmaTileBytes<D>(view, key0, key_end));
  __syncwarp();
  if (lane >= segments) return;
  const int in_page = (key0 + lane * seg) & (view.page_size - 1);
  const int row_k = view.kv_head * view.page_size + in_page;  // code rows of the page
  const int row_v = view.num_kv_heads * view.page_size + row_k;
  uint8_t* k_dst = stage + lane * seg * D;
  sm90::TmaLoad3d(k_dst, map, 0, row_k, entries, bar);
  sm90::TmaLoad3d(k_dst + kDecodeKeys * D, map, 0, row_v, entries, bar);
  const auto* scales = reinterpret_cast<const uint8_t*>(view.kv) +
                       int64_t{entries} * geo.page_bytes + geo.scale_start + int64_t{row_k} * 4;
  float* k_scales = reinterpret_cast<float*>(stage + 2 * kDecodeKeys * D) + lane * seg;
  const auto scale_bytes = static_cast<uint32_t>(seg * 4);
  sm90::BulkLoad(k_scales, scales, scale_bytes, bar);
  sm90::BulkLoad(k_scales + kDecodeKeys, scales + int64_t{view.num_kv_heads} * view.page_size * 4,
                 scale_bytes, bar);
}

// In a tile whose rows from `valid` on hold no key of the item: this warp's V codes and V
// scales of those rows set to 0 (the file comment), visible to the warp's reads, and ordered
// before the TMA copies that refill the stage (after the CTA barrier that frees it).
template <int D>
__device__ __forceinline__ void ZeroFp8TailRows(uint8_t* stage, int valid, int warp, int lane) {
  const int r0 = warp * kDecodeWarpKeys;
  if (r0 + kDecodeWarpKeys <= valid) return;  // warp-uniform
  constexpr int kChunksPerRow = D / 16;
  uint8_t* v_codes = stage + kDecodeKeys * D;
  float* v_scales = reinterpret_cast<float*>(stage + 2 * kDecodeKeys * D) + kDecodeKeys;
  for (int c = lane; c < kDecodeWarpKeys * kChunksPerRow; c += 32) {
    const int row = r0 + c / kChunksPerRow;
    if (row >= valid) {
      reinterpret_cast<uint4*>(v_codes + row * D)[c % kChunksPerRow] = make_uint4(0, 0, 0, 0);
    }
  }
  if (lane < kDecodeWarpKeys && r0 + lane >= valid) v_scales[r0 + lane] = 0.0f;
  sm90::FenceProxyAsync();
  __syncwarp();
}

}  // namespace tandem::attention
