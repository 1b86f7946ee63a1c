// TMA stages of the stream decode kernel (DecodeCopies::kTma, stream_decode.cu; WORKLOG.md step
// 19), on a bf16 cache or an fp8 one (the fused tile). The cp.async stages cost every thread
// ~10-16 copies a tile, each with its page shuffle, 64-bit address and predicate (on the fused
// fp8 kernel, which is issue-bound, ~120 of the ~526 instructions a warp issues per 16-key tile,
// WORKLOG.md steps 15-16). Here one warp issues a tile's copies, one lane per page segment, all
// completing on the stage's mbarrier that lane 0 arms; the other warps only wait on it:
//  - bf16: four tensor copies (K and V, head dims 0-63 and 64-127: boxes of 64 dims x segment
//    rows of the layer's [row][128] view), each half-tile [64 keys][64 dims] in TMA's 128-byte
//    swizzle (TileOffset<128, true>, smem_layout.h);
//  - fp8: two tensor copies (the segment's K and V codes, boxes of 128 bytes x segment rows of
//    the layer's [page][2 H P code rows] view, 128-byte swizzle, Fp8FusedChunkOffset) and two
//    bulk copies (its K and V scales).
// A segment is min(page_size, kDecodeKeys) keys of one page: pages of 8 to 64 keys hold a tile in
// whole pages (the plans start every item and split at a multiple of kDecodeKeys,
// decode_plan.h), larger pages hold it inside one page. A segment is copied whole even where its
// keys end before it (the item's last page): the cp.async copies zero-fill such rows, these copy
// whatever the pool holds there (unwritten slots, a later token's row: possibly NaN), and
// segments past the item's end are not copied (the stage keeps an older tile's rows). So in an
// item's last, partial tile each warp zeroes the V rows (and fp8 V scales) of its keys past the
// item's end before it reads them (ZeroTailRows): their probabilities are 0, and 0 x NaN would
// still poison the P V products. K needs nothing: masked scores become -inf.
// Internal to kernels/paged_attention.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/paged_attention/attention_common.cuh"
#include "kernels/paged_attention/fp8_tile.cuh"
#include "kernels/paged_attention/tma_util.cuh"

namespace tandem::attention {

// Page sizes the TMA stages take: powers of two >= 8 (a segment of 8 rows of 128 bytes is one
// 1024-byte swizzle atom, so every copy lands atom-aligned).
constexpr int kTmaMinPage = 8;

// The bf16 TMA stage: K then V, each two [kDecodeKeys][64] halves (head dims 0-63, 64-127),
// element (row, col) of a tile at TileOffset<128, true> (smem_layout.h): 16-byte chunk
// (col % 64) / 8 of the row at chunk ^ (row & 7), rows 128 bytes apart from a 1024-byte atom.
static_assert(kTmaTileKeys == kDecodeKeys, "the TMA layout's tile is the decode tile");
constexpr int kTmaHalfElems = kDecodeKeys * 64;

__device__ __forceinline__ int TmaSegmentRows(const KvView& view) {
  return min(view.page_size, kDecodeKeys);
}

// The bytes a tile's copies complete on its barrier: every segment that holds one of its keys.
template <int D, bool kFp8>
__device__ __forceinline__ uint32_t TmaTileBytes(const KvView& view, int key0, int key_end) {
  const int seg = TmaSegmentRows(view);
  const int segments = (min(kDecodeKeys, key_end - key0) + seg - 1) / seg;
  return static_cast<uint32_t>(segments * seg * 2 * (kFp8 ? D + 4 : 2 * D));
}

// Issues the copies of keys [key0, key_end) of tile key0 into `stage` (1024-byte aligned; bf16:
// the layout above; fp8: the fused kernel's K codes [kDecodeKeys][D], V codes, K scales
// [kDecodeKeys], V scales) on `bar`. Called by every lane of one warp: lane 0 arms the barrier
// with the tile's bytes, then lane j issues segment j (its page: `entries` of lane j,
// TileTableEntries; the tile's first key is segment-aligned). `map`: the layer's
// (Fp8CodesTensorMap, stream_decode.cu, or Bf16KvRowsTensorMap, tma_encode.h).
template <int D, bool kFp8>
__device__ __forceinline__ void IssueTileTma(const KvView& view, const Fp8Pages& geo,
                                             const CUtensorMap* map, int32_t entries, int key0,
                                             int key_end, uint8_t* stage, uint64_t* bar, int lane) {
  static_assert(D == 128, "one 128-byte swizzle span: fp8 code rows, bf16 half rows");
  const int seg = TmaSegmentRows(view);
  const int segments = (min(kDecodeKeys, key_end - key0) + seg - 1) / seg;
  if (lane == 0) sm90::MbarArriveExpectTx(bar, TmaTileBytes<D, kFp8>(view, key0, key_end));
  __syncwarp();
  if (lane >= segments) return;
  const int in_page = (key0 + lane * seg) & (view.page_size - 1);
  const int head_row = view.kv_head * view.page_size + in_page;  // within the page's K rows
  const int v_rows = view.num_kv_heads * view.page_size;         // V's rows after K's
  if constexpr (kFp8) {
    uint8_t* k_dst = stage + lane * seg * D;
    sm90::TmaLoad3d(k_dst, map, 0, head_row, entries, bar);
    sm90::TmaLoad3d(k_dst + kDecodeKeys * D, map, 0, v_rows + head_row, entries, bar);
    const auto* scales = reinterpret_cast<const uint8_t*>(view.kv) +
                         int64_t{entries} * geo.page_bytes + geo.scale_start +
                         int64_t{head_row} * 4;
    float* k_scales = reinterpret_cast<float*>(stage + 2 * kDecodeKeys * D) + lane * seg;
    const auto scale_bytes = static_cast<uint32_t>(seg * 4);
    sm90::BulkLoad(k_scales, scales, scale_bytes, bar);
    sm90::BulkLoad(k_scales + kDecodeKeys, scales + int64_t{v_rows} * 4, scale_bytes, bar);
  } else {
    // Rows of the layer's [row][D] view: page p's K rows start at row 2 p H P.
    const int row_k = entries * 2 * v_rows + head_row;
    auto* k_dst = reinterpret_cast<__nv_bfloat16*>(stage) + lane * seg * 64;
    for (int kv = 0; kv < 2; ++kv) {
      for (int half = 0; half < 2; ++half) {
        sm90::TmaLoad2d(k_dst + (2 * kv + half) * kTmaHalfElems, map, 64 * half,
                        row_k + kv * v_rows, bar);
      }
    }
  }
}

// In a tile whose rows from `valid` on hold no key of the item: this warp's V rows (and fp8 V
// scales) of those rows set to 0 (the file comment), visible to the warp's reads, and ordered
// before the TMA copies that refill the stage (after the CTA barrier that frees it).
template <int D, bool kFp8>
__device__ __forceinline__ void ZeroTailRows(uint8_t* stage, int valid, int warp, int lane) {
  const int r0 = warp * kDecodeWarpKeys;
  if (r0 + kDecodeWarpKeys <= valid) return;  // warp-uniform
  // The V tile's bytes per row (fp8: one code row; bf16: a half row, in each of two halves).
  constexpr int kRowBytes = kFp8 ? D : 128;
  constexpr int kHalves = kFp8 ? 1 : 2;
  constexpr int kHalfBytes = kFp8 ? 0 : kTmaHalfElems * 2;
  constexpr int kChunksPerRow = kRowBytes / 16;
  uint8_t* v = stage + (kFp8 ? kDecodeKeys * D : 2 * kTmaHalfElems * 2);
  for (int c = lane; c < kHalves * kDecodeWarpKeys * kChunksPerRow; c += 32) {
    const int half = c / (kDecodeWarpKeys * kChunksPerRow);
    const int row = r0 + (c / kChunksPerRow) % kDecodeWarpKeys;
    if (row >= valid) {
      reinterpret_cast<uint4*>(v + half * kHalfBytes + row * kRowBytes)[c % kChunksPerRow] =
          make_uint4(0, 0, 0, 0);
    }
  }
  if constexpr (kFp8) {
    float* v_scales = reinterpret_cast<float*>(stage + 2 * kDecodeKeys * D) + kDecodeKeys;
    if (lane < kDecodeWarpKeys && r0 + lane >= valid) v_scales[r0 + lane] = 0.0f;
  }
  sm90::FenceProxyAsync();
  __syncwarp();
}

}  // namespace tandem::attention
