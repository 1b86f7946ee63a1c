// The decode kernels' shared-memory layouts (kernels/paged_attention/smem_layout.h) on the CPU:
// each layout is a bijection of a tile's elements onto its bytes (no two elements share a byte,
// none falls outside the tile), and every read pattern of the kernels that use it is free of
// bank conflicts. The read patterns are replayed from the kernels' own index expressions
// (ProcessTile in attention_tile.cuh, ProcessTileFused in fp8_fused_tile.cuh) with the
// hardware's rule for shared memory: 32 banks of 4 bytes; a warp's 4-, 8- and 16-byte loads are
// served in phases of 32, 16 and 8 threads, and a phase without two addresses in one bank (other
// than the same word) takes one pass. ldmatrix reads an 8 x 16-byte matrix per phase.
#include "kernels/paged_attention/smem_layout.h"

#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::attention {
namespace {

// The banks a phase's accesses of `bytes` each touch; false when two distinct words share one.
bool ConflictFree(const std::vector<int>& byte_addrs, int bytes, std::string* why) {
  std::vector<int> word_in_bank(32, -1);
  for (int a : byte_addrs) {
    for (int w = a / 4; w < (a + bytes) / 4; ++w) {
      const int bank = w % 32;
      if (word_in_bank[bank] >= 0 && word_in_bank[bank] != w) {
        *why = "bank " + std::to_string(bank) + ": words " + std::to_string(word_in_bank[bank]) +
               " and " + std::to_string(w);
        return false;
      }
      word_in_bank[bank] = w;
    }
  }
  return true;
}

// Every (row, col) of a rows x cols tile of elem_bytes elements maps to distinct bytes inside
// [0, tile_bytes).
template <typename Offset>
void ExpectBijective(Offset offset, int rows, int cols, int elem_bytes, int tile_bytes) {
  std::set<int> seen;
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      const int byte = offset(r, c) * elem_bytes;
      ASSERT_GE(byte, 0);
      ASSERT_LE(byte + elem_bytes, tile_bytes) << "row " << r << " col " << c;
      ASSERT_TRUE(seen.insert(byte).second) << "row " << r << " col " << c << " shares a byte";
    }
  }
}

// ProcessTile's reads of one warp's 16 keys (rows row0 .. row0 + 15 of the K and V tiles):
// S = Q K^T reads, per k-step ks and n-tile n, the 32-bit words at (n 8 + g, 16 ks + 2 t) and
// (.., + 8); O += P V reads, per key block kk and dim block dn, an ldmatrix.x4.trans whose lane l
// gives row kk 16 + (l & 7) + ((l >> 3) & 1) 8, column dn 16 + (l >> 4) 8.
template <int D, bool kTma>
void ExpectBf16ReadsConflictFree() {
  SCOPED_TRACE(kTma ? "bf16, TMA stages" : "bf16, cp.async stages");
  for (int row0 = 0; row0 < 64; row0 += 16) {
    for (int ks = 0; ks < D / 16; ++ks) {
      for (int n = 0; n < 2; ++n) {
        for (int second = 0; second < 2; ++second) {
          std::vector<int> phase;
          for (int lane = 0; lane < 32; ++lane) {
            const int g = lane >> 2, t = lane & 3;
            phase.push_back(2 *
                            TileOffset<D, kTma>(row0 + n * 8 + g, ks * 16 + 8 * second + 2 * t));
          }
          std::string why;
          EXPECT_TRUE(ConflictFree(phase, 4, &why))
              << "K read ks " << ks << " n " << n << " row0 " << row0 << ": " << why;
        }
      }
    }
    for (int kk = 0; kk < 1; ++kk) {
      for (int dn = 0; dn < D / 16; ++dn) {
        for (int m = 0; m < 4; ++m) {  // the four 8x8 matrices, one phase each
          std::vector<int> phase;
          for (int lane = 8 * m; lane < 8 * m + 8; ++lane) {
            const int key = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
            phase.push_back(2 * TileOffset<D, kTma>(row0 + key, dn * 16 + (lane >> 4) * 8));
          }
          std::string why;
          EXPECT_TRUE(ConflictFree(phase, 16, &why))
              << "V ldmatrix dn " << dn << " matrix " << m << " row0 " << row0 << ": " << why;
        }
      }
    }
  }
}

// ProcessTileFused's reads of one warp's 16 keys: K, a 16-byte load of row row0 + n 8 + g at
// chunk FusedKChunk(t, c) (phases of 8 lanes); V, 8-byte loads of rows row0 + 2 t + (k & 1) +
// 8 (k >> 1) at dims 64 J + 8 g (phases of 16 lanes).
// Returns the V phases with a conflict (the K reads must have none).
template <int D, bool kTma>
int Fp8ReadConflicts() {
  SCOPED_TRACE(kTma ? "fp8, TMA stages" : "fp8, cp.async stages");
  int v_conflicts = 0;
  for (int row0 = 0; row0 < 64; row0 += 16) {
    for (int n = 0; n < 2; ++n) {
      for (int c = 0; c < D / 64; ++c) {
        for (int p = 0; p < 4; ++p) {
          std::vector<int> phase;
          for (int lane = 8 * p; lane < 8 * p + 8; ++lane) {
            const int g = lane >> 2, t = lane & 3;
            phase.push_back(
                Fp8FusedChunkOffset<D, kTma>(row0 + n * 8 + g, 16 * FusedKChunk<kTma>(t, c)));
          }
          std::string why;
          EXPECT_TRUE(ConflictFree(phase, 16, &why))
              << "K read n " << n << " c " << c << " phase " << p << ": " << why;
        }
      }
    }
    for (int J = 0; J < D / 64; ++J) {
      for (int k = 0; k < 4; ++k) {
        for (int p = 0; p < 2; ++p) {
          std::vector<int> phase;
          for (int lane = 16 * p; lane < 16 * p + 16; ++lane) {
            const int g = lane >> 2, t = lane & 3;
            const int r = row0 + 2 * t + (k & 1) + 8 * (k >> 1);
            const int col = 64 * J + 16 * (g >> 1);
            phase.push_back(Fp8FusedChunkOffset<D, kTma>(r, col) + 8 * (g & 1));
          }
          std::string why;
          v_conflicts += !ConflictFree(phase, 8, &why);
        }
      }
    }
  }
  return v_conflicts;
}

// The fused tile's K chunks of one thread cover each chunk of a row exactly once over t.
template <bool kTma, int D>
void ExpectKChunksPartitionARow() {
  std::set<int> chunks;
  for (int t = 0; t < 4; ++t) {
    for (int c = 0; c < D / 64; ++c) EXPECT_TRUE(chunks.insert(FusedKChunk<kTma>(t, c)).second);
  }
  EXPECT_EQ(chunks.size(), static_cast<size_t>(D / 16));
  EXPECT_EQ(*chunks.rbegin(), D / 16 - 1);
}

TEST(SmemLayoutTest, EveryLayoutIsABijectionOntoItsTile) {
  ExpectBijective([](int r, int c) { return TileOffset<128, false>(r, c); }, 64, 128, 2,
                  64 * (128 + kRowPad) * 2);
  ExpectBijective([](int r, int c) { return TileOffset<64, false>(r, c); }, 64, 64, 2,
                  64 * (64 + kRowPad) * 2);
  ExpectBijective([](int r, int c) { return TileOffset<128, true>(r, c); }, kTmaTileKeys, 128, 2,
                  kTmaTileKeys * 128 * 2);
  // fp8: chunk-level maps (columns in 16-byte steps), the bytes of a chunk kept together.
  ExpectBijective([](int r, int c) { return Fp8FusedChunkOffset<128, false>(r, 16 * c) / 16; }, 64,
                  8, 1, 64 * 8);
  ExpectBijective([](int r, int c) { return Fp8FusedChunkOffset<64, false>(r, 16 * c) / 16; }, 64,
                  4, 1, 64 * 4);
  ExpectBijective([](int r, int c) { return Fp8FusedChunkOffset<128, true>(r, 16 * c) / 16; }, 64,
                  8, 1, 64 * 8);
}

// TMA's 128-byte swizzle as the hardware applies it (byte address bits 4-6 XOR bits 7-9, from a
// 1024-byte aligned stage): the layouts' TMA variants are exactly that map of the unswizzled
// dense rows, so what TMA writes is where the kernels read.
TEST(SmemLayoutTest, TmaLayoutsAreTheHardwareSwizzleOfDenseRows) {
  const auto swizzle128 = [](int byte) { return byte ^ (((byte >> 7) & 7) << 4); };
  for (int r = 0; r < 64; ++r) {
    for (int col = 0; col < 128; col += 16) {  // fp8 codes: dense rows of 128 bytes
      EXPECT_EQ((Fp8FusedChunkOffset<128, true>(r, col)), swizzle128(r * 128 + col));
    }
    for (int col = 0; col < 128; ++col) {  // bf16: a dense [64][64] half per 64 dims
      const int half = col / 64, dense = half * kTmaTileKeys * 128 + r * 128 + (col % 64) * 2;
      EXPECT_EQ((2 * TileOffset<128, true>(r, col)), swizzle128(dense)) << r << " " << col;
    }
  }
}

TEST(SmemLayoutTest, ProcessTileReadsAreConflictFree) {
  ExpectBf16ReadsConflictFree<128, false>();
  ExpectBf16ReadsConflictFree<64, false>();
  ExpectBf16ReadsConflictFree<128, true>();
}

TEST(SmemLayoutTest, FusedFp8ReadsAreConflictFree) {
  EXPECT_EQ((Fp8ReadConflicts<128, false>()), 0);
  EXPECT_EQ((Fp8ReadConflicts<128, true>()), 0);
  // Head dim 64: the K reads are conflict-free, the V reads cannot be. A half-warp reads 32
  // bytes of each of rows 2t + const (t < 4), four even (or four odd) rows of 64 bytes, which all
  // sit in the same half of a 128-byte bank line: 128 bytes through 64 bytes of banks, two
  // passes whatever the swizzle (every one of the 32 V phases of the 4 warps' row blocks).
  EXPECT_EQ((Fp8ReadConflicts<64, false>()), 4 * 4 * 2);
  ExpectKChunksPartitionARow<false, 128>();
  ExpectKChunksPartitionARow<true, 128>();
  ExpectKChunksPartitionARow<false, 64>();
}

// The reason for the TMA stages' K chunk assignment: with the cp.async one (t + 4 c) on TMA's
// swizzle a quarter-warp's two rows collide.
TEST(SmemLayoutTest, TheCpAsyncKChunksWouldConflictOnTmaStages) {
  std::vector<int> phase;
  for (int lane = 0; lane < 8; ++lane) {
    const int g = lane >> 2, t = lane & 3;
    phase.push_back(Fp8FusedChunkOffset<128, true>(g, 16 * FusedKChunk<false>(t, 0)));
  }
  std::string why;
  EXPECT_FALSE(ConflictFree(phase, 16, &why));
}

}  // namespace
}  // namespace tandem::attention
