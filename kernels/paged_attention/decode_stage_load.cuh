// The decode kernels' tile loads into their pipeline stages (paged_attention.cu's DecodeKernel
// and stream_decode.cu's stream kernel): the bf16 and fp8 copies of one kDecodeKeys tile,
// through the block-table-per-lane fast path (decode_tile_copy.cuh, fp8_tile.cuh) where the
// pages allow it, and the block-table entries that path reads one tile ahead.
// Internal to kernels/paged_attention.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/paged_attention/attention_common.cuh"
#include "kernels/paged_attention/decode_tile_copy.cuh"
#include "kernels/paged_attention/fp8_tile.cuh"

namespace tandem::attention {

// Issues the K/V copies of one decode tile into `buf` (K, then V at + one tile): kEvictFirst
// with the evict-first L2 policy `policy`, else as plain copies (copies carrying an
// evict-normal policy measured ~10% slower than plain ones at batch 32-256: WORKLOG.md step 5).
// `entries`: TileTableEntries of the tile where TablePerLane(view), else unused.
// The fp8 tile: kSwizzle for the fused kernel's stages (fp8_tile.cuh).
template <int D, bool kSwizzle, bool kEvictFirst>
__device__ __forceinline__ void LoadDecodeTileFp8(const KvView& view, const Fp8Pages& geo,
                                                  int32_t entries, int key0, int key_end,
                                                  uint8_t* stage, uint64_t policy) {
  constexpr int kThreads = kDecodeWarps * 32;
  if (attention::TablePerLane(view)) {
    CopyTileFp8TablePerLane<D, kDecodeKeys, kThreads, kSwizzle, kEvictFirst>(
        view, geo, entries, key0, key_end, stage, policy);
  } else {
    LoadKvTileFp8<D, kDecodeKeys, kThreads, kSwizzle, kEvictFirst>(view, geo, key0, key_end, stage,
                                                                   threadIdx.x, policy);
  }
}

template <int D, bool kEvictFirst>
__device__ __forceinline__ void LoadDecodeTile(const KvView& view, int32_t entries, int key0,
                                               int key_end, __nv_bfloat16* buf, uint64_t policy) {
  constexpr int kTile = TileElems<D, kDecodeKeys>();
  constexpr int kThreads = kDecodeWarps * 32;
  if (attention::TablePerLane(view)) {
    attention::CopyTileTablePerLane<D, kDecodeKeys, kThreads, kEvictFirst>(
        view, entries, key0, key_end, buf, buf + kTile, policy);
  } else {
    attention::LoadKvTile<D, kDecodeKeys, kThreads, kEvictFirst>(view, key0, key_end, buf,
                                                                 buf + kTile, threadIdx.x, policy);
  }
}

// The block-table entries of the tile at key0 (one per lane; 0 where the tile does not exist or
// the pages take the generic copy).
__device__ __forceinline__ int32_t DecodeTileEntries(const KvView& view, int key0, int key_end) {
  if (!attention::TablePerLane(view) || key0 >= key_end) return 0;
  return attention::TileTableEntries<kDecodeKeys>(view, key0, key_end);
}

}  // namespace tandem::attention
