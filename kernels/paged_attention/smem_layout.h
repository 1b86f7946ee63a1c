// Where the decode kernels' shared-memory tiles keep an element (pure index math, host and
// device, so that tests/kernels/smem_layout_test.cc can check on the CPU that each read pattern
// of the kernels is free of bank conflicts). Internal to kernels/paged_attention.
//
// Four layouts of one key tile (rows = keys, kDecodeKeys of them):
//  - bf16, cp.async stages (attention_tile.cuh's ProcessTile): rows of D + kRowPad elements;
//  - bf16, TMA stages (tma_tile.cuh): two [kTmaTileKeys][64] halves (dims 0-63, 64-127) in TMA's
//    128-byte swizzle: 16-byte chunk (col % 64) / 8 of a row at chunk ^ (row & 7);
//  - fp8 codes, cp.async stages of the fused kernel (fp8_tile.cuh): unpadded rows of D bytes,
//    chunk c of row r at c ^ Fp8ChunkSwizzle<D>(r);
//  - fp8 codes, TMA stages (head_dim 128): TMA's 128-byte swizzle, chunk c at c ^ (r & 7).
// A TMA stage starts on a 1024-byte swizzle atom and its rows are 128 bytes apart, so the
// hardware's swizzle (address bits 4-6 XOR bits 7-9) is this row & 7 from the stage's start.
#pragma once

#include "kernels/common/host_device.h"

namespace tandem::attention {

constexpr int kRowPad = 8;  // bf16 elements of padding per cp.async row (16 bytes)
// Keys of a decode tile in the stream kernel's TMA stages (tma_tile.cuh): kDecodeKeys.
constexpr int kTmaTileKeys = 64;

// Element offset of (row, col) in a bf16 K or V tile as ProcessTile reads it: padded rows, or
// (kTma) the TMA stages' swizzled halves. The padded rows' stride (D + 8 elements: 4 words
// past 32 banks) and the swizzle (the 8 rows of a read have distinct row & 7, so one logical
// chunk lands on 8 distinct physical ones) keep ProcessTile's K words and V ldmatrix rows free
// of bank conflicts.
template <int D, bool kTma>
TANDEM_HOST_DEVICE constexpr int TileOffset(int row, int col) {
  if constexpr (kTma) {
    static_assert(D == 128, "the TMA stages' halves are 64 dims");
    const int c = col & 63;
    return (col >> 6) * (kTmaTileKeys * 64) + row * 64 + ((((c >> 3) ^ (row & 7)) << 3) | (c & 7));
  }
  return row * (D + kRowPad) + col;
}

// The fused kernel's cp.async stages (fp8_tile.cuh): 16-byte chunk c of tile row r sits at chunk
// c ^ Fp8ChunkSwizzle<D>(r) of the row, so that the fused kernel's K reads (16 bytes of two
// adjacent rows per quarter-warp) and, at D = 128, its V reads (8 bytes of rows 2t, 2t + 1, ...
// per half-warp) hit distinct banks; the rows themselves are D bytes apart, unpadded. Rows 0..7
// take XORs 0 4 2 6 4 0 6 2 at D = 128 (eight chunks a row), 0 0 2 2 0 0 2 2 at D = 64 (four
// chunks; there the V reads take two passes whatever the swizzle: smem_layout_test.cc).
template <int D>
TANDEM_HOST_DEVICE constexpr int Fp8ChunkSwizzle(int row) {
  return ((row & 6) ^ ((row & 1) << 2)) & (D / 16 - 1);
}
template <int D, bool kSwizzle>
TANDEM_HOST_DEVICE constexpr int Fp8ChunkOffset(int row, int col) {  // col: a multiple of 16
  if constexpr (kSwizzle) return row * D + (col ^ (Fp8ChunkSwizzle<D>(row) << 4));
  return row * D + col;
}

// The fused kernel's byte offset of (row, col) in its codes: the cp.async stages' swizzle, or
// (kTma, head_dim 128) TMA's 128-byte swizzle, chunk c of row r at chunk c ^ (r & 7).
template <int D, bool kTma>
TANDEM_HOST_DEVICE constexpr int Fp8FusedChunkOffset(int row, int col) {
  if constexpr (kTma) {
    static_assert(D == 128, "the TMA stages' rows are one 128-byte swizzle span");
    return row * D + (col ^ ((row & 7) << 4));
  }
  return Fp8ChunkOffset<D, true>(row, col);
}

// The 16-byte K chunk of a key row that thread t (lane % 4) of the fused tile reads for k-steps
// 4 c .. 4 c + 3 (fp8_fused_tile.cuh's layout comment): t + 4 c on the cp.async swizzle; 2 t + c
// on TMA's, where a quarter-warp's rows r, r + 1 (r even) differ in bit 0 of their XOR, so chunks
// {0, 2, 4, 6} of one and {1, 3, 5, 7} of the other land on distinct banks (t + 4 c would put
// both rows on chunks 0-3).
template <bool kTma>
TANDEM_HOST_DEVICE constexpr int FusedKChunk(int t, int c) {
  return kTma ? 2 * t + c : t + 4 * c;
}

}  // namespace tandem::attention
