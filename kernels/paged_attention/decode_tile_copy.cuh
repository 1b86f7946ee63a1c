// The K/V tile copies of the decode kernel (paged_attention.cu) for power-of-two pages.
//
// Issuing the copies was the decode kernel's long pole at small batch (WORKLOG.md step 9): the
// generic LoadKvTile (attention_tile.cuh) reads one block-table entry per 16-byte chunk and
// rebuilds the 64-bit address from it (page division, two 64-bit products), ~80 dependent
// instructions per chunk and one L1/L2 round trip each, so one warp issued a 64-key tile's
// copies in ~650 instructions (~1.5 us at B=1, one warp per scheduler). Here a warp reads the
// tile's block-table entries once, one per lane and one tile ahead, and each chunk takes its
// page id with one shuffle and its address with one 32 x 32 -> 64-bit multiply-add.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/paged_attention/attention_tile.cuh"

namespace tandem::attention {

// Smallest log2(page size) of the fast path: a kKeys = 64 tile spans at most 64 / 4 + 1 = 17
// pages, one block-table entry per lane. Smaller or non-power-of-two pages take LoadKvTile.
constexpr int kMinTablePageShift = 2;

__device__ __forceinline__ bool TablePerLane(const KvView& view) {
  return view.page_shift >= kMinTablePageShift;
}

// The block-table entries of keys [key0, min(key0 + kKeys, key_end)): lane j returns the page id
// of the j-th page of that range (0 past it; never read). Requires TablePerLane(view) and every
// lane of the warp (the copies shuffle it).
template <int kKeys>
__device__ __forceinline__ int32_t TileTableEntries(const KvView& view, int key0, int key_end) {
  static_assert(kKeys / (1 << kMinTablePageShift) + 1 <= 32, "one page per lane");
  const int first = key0 >> view.page_shift;
  const int last = (min(key0 + kKeys, key_end) - 1) >> view.page_shift;
  const int page = first + (threadIdx.x & 31);
  return page <= last ? view.table[page] : 0;
}

// Copies keys [key0, key0 + kKeys) of K and V (rows >= key_end zero-filled) into k_s / v_s
// ([kKeys][D + kRowPad]), spread over kThreads threads (threadIdx.x < kThreads), the same chunk
// per thread as LoadKvTile. `entries`: TileTableEntries of this tile. kHinted: the copies carry
// the L2 policy `policy`. Rows are counted from the start of the tile's first page, so a chunk's
// page is entry (row >> page_shift) and its place in the page row & (page_size - 1); a chunk past
// key_end copies nothing (its address, page 0 or a page of the sequence, is never read).
template <int D, int kKeys, int kThreads, bool kHinted>
__device__ __forceinline__ void CopyTileTablePerLane(const KvView& view, int32_t entries, int key0,
                                                     int key_end, __nv_bfloat16* k_s,
                                                     __nv_bfloat16* v_s, uint64_t policy) {
  constexpr int kChunksPerRow = D / 8;  // 16-byte chunks
  constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  constexpr uint32_t kRowBytes = D * sizeof(__nv_bfloat16);
  static_assert(kThreads % kChunksPerRow == 0 && kKeys % kRowsPerPass == 0, "even split");
  const int shift = view.page_shift;
  const int mask = (1 << shift) - 1;
  const uint32_t head_bytes = kRowBytes << shift;  // one head of one page
  const uint32_t page_bytes = 2u * view.num_kv_heads * head_bytes;
  const uint32_t v_bytes = view.num_kv_heads * head_bytes;  // V after K within a page
  const int r0 = threadIdx.x / kChunksPerRow;
  const int col = (threadIdx.x % kChunksPerRow) * 8;
  const int first_row = (key0 & mask) + r0;      // this thread's first row
  const int row_end = key_end - (key0 & ~mask);  // rows below it hold keys
  const char* head = reinterpret_cast<const char*>(view.kv) + uint64_t{head_bytes} * view.kv_head +
                     col * sizeof(__nv_bfloat16);
#pragma unroll
  for (int i = 0; i < kKeys / kRowsPerPass; ++i) {
    const int row = first_row + i * kRowsPerPass;
    const uint32_t page = __shfl_sync(0xffffffffu, entries, row >> shift);
    const char* k_src = head + (uint64_t{page} * page_bytes + (row & mask) * kRowBytes);
    const bool valid = row < row_end;
    const int dst = (r0 + i * kRowsPerPass) * (D + kRowPad) + col;
    if constexpr (kHinted) {
      CpAsync16Hinted(k_s + dst, k_src, valid, policy);
      CpAsync16Hinted(v_s + dst, k_src + v_bytes, valid, policy);
    } else {
      CpAsync16(k_s + dst, k_src, valid);
      CpAsync16(v_s + dst, k_src + v_bytes, valid);
    }
  }
}

}  // namespace tandem::attention
