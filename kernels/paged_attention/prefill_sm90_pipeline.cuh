// The shared-memory pipeline of the Hopper prefill kernel (paged_attention_prefill_sm90.cu):
// tile constants, the shared-memory layout and the producer warp that fills the K/V stages with
// TMA copies of the paged cache. Internal to kernels/paged_attention.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include "kernels/paged_attention/attention_common.cuh"
#include "kernels/paged_attention/prefill_wgmma.cuh"
#include "kernels/paged_attention/tma_util.cuh"

namespace tandem::attention::sm90 {

constexpr int kD = 128;
constexpr int kWgRows = 64;                       // rows per consumer warpgroup
constexpr int kKeys = 128;                        // keys per K/V tile
constexpr int kRowBytes = 128;                    // one swizzled row: 64 bf16
constexpr int kQHalfBytes = kWgRows * kRowBytes;  // 8 KB: 64 rows x 64 dims
constexpr int kKvHalfBytes = kKeys * kRowBytes;   // 16 KB: 128 keys x 64 dims
constexpr int kThreads = 384;                     // warpgroup 0: producer; 1, 2: consumers
constexpr int kConsumerWarps = 8;
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;  // 128 * 40 + 256 * 232 = 64512 <= 65536
static_assert(kPrefillRows == 2 * kWgRows, "a plan item is the two consumer warpgroups' rows");

// Every tile is [half][rows][128 bytes], 128-byte swizzled (prefill_wgmma.cuh), 1024-aligned.
// K and V have separate rings: a K stage is free again as soon as S = Q K^T of its tile is done,
// a round before the V stage of the same tile, so loads run further ahead (FlashAttention-3).
template <int kStages>
struct Smem {
  uint8_t q[2][2][kQHalfBytes];  // [warpgroup][half of head_dim]
  uint8_t k[kStages][2][kKvHalfBytes];
  uint8_t v[kStages][2][kKvHalfBytes];
  uint64_t full_k[kStages];   // the K tile landed
  uint64_t full_v[kStages];   // the V tile landed (TMA bytes, or the producer's fix-up arrive)
  uint64_t empty_k[kStages];  // every consumer warp is done with the stage
  uint64_t empty_v[kStages];
  uint64_t landed[kStages];  // tail V tiles: the TMA bytes landed, before the fix-up
};

__device__ __forceinline__ int CeilDiv(int a, int b) { return (a + b - 1) / b; }

// The k-th item of this CTA: waves of gridDim.x items; with `snake`, every other wave runs in
// reverse CTA order, so the CTA that got a wave's longest item (the plan sorts items longest
// first) gets the next wave's shortest. Items past the count come only in the last wave.
__device__ __forceinline__ int ItemOf(int k, bool snake) {
  const int b = snake && (k & 1) ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  return k * gridDim.x + b;
}

// The producer warp's view of one item: where its K/V rows are and how tiles map to stages.
struct KvSource {
  const CUtensorMap* map;
  const int32_t* table;  // the sequence's block table
  int chunk;             // keys per TMA box: min(page_size, kKeys), one page at most
  int shift;             // log2(page_size)
  int page_size;
  int kv_rows;    // rows from a page's K of a head to its V: num_kv_heads * page_size
  int head_row0;  // row of the item's head in page 0's K: kv_head * page_size
};

// Copies the K (v = 0) or V (v = 1) tile of keys [key0, key0 + kKeys) clipped to key_end into
// `dst` ([2 halves][kKeys rows][128 B]) completing on `bar`: lane j < chunks copies chunk j
// (`chunk` keys of one page) as two boxes, one per head_dim half.
__device__ __forceinline__ void LoadTile(const KvSource& src, int key0, int key_end, int v,
                                         uint8_t (&dst)[2][kKvHalfBytes], uint64_t* bar, int lane) {
  const int chunks = CeilDiv(min(key_end - key0, kKeys), src.chunk);
  if (lane == 0) MbarArriveExpectTx(bar, chunks * src.chunk * kD * 2);
  __syncwarp();
  if (lane < chunks) {
    const int key = key0 + lane * src.chunk;
    const int64_t page = src.table[key >> src.shift];
    const int row = static_cast<int>(page * 2 * src.kv_rows + v * src.kv_rows + src.head_row0 +
                                     (key & (src.page_size - 1)));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      TmaLoad2d(dst[h] + lane * src.chunk * kRowBytes, src.map, h * 64, row, bar);
    }
  }
}

// Producer (one warp): per item, K_0, then K_{t+1} and V_t for each tile t, each once its stage
// is free. A V tile that reaches past key_end lands on `landed`; the warp then zeroes its rows
// >= key_end (unwritten cache slots may hold NaN, and 0 * NaN is NaN in P V) and arrives on
// full_v itself — after issuing the next item's K_0, so that the two copies' latencies overlap.
// K needs no fix-up: those keys are masked to -inf before the softmax.
template <int kStages>
__device__ void Produce(const PagedAttentionArgs& a, const CUtensorMap* map,
                        const AttentionWorkItem* items, int num_items, bool snake,
                        Smem<kStages>& sm, int lane) {
  uint32_t cnt = 0, landed_parity = 0;
  int fix_stage = -1, fix_valid = 0;  // a tail V tile in flight on landed[fix_stage]
  const auto finish_fix = [&] {
    if (fix_stage < 0) return;
    MbarWait(&sm.landed[fix_stage], (landed_parity >> fix_stage) & 1);
    landed_parity ^= 1u << fix_stage;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (int p = fix_valid * 16 + lane; p < kKeys * 16; p += 32) {
      // Whole 128-byte rows: the swizzle only permutes chunks inside a row.
      const int row = p >> 4, h = (p >> 3) & 1, c = p & 7;
      reinterpret_cast<uint4*>(sm.v[fix_stage][h] + row * kRowBytes)[c] = zero;
    }
    FenceProxyAsync();
    __syncwarp();
    if (lane == 0) MbarArrive(&sm.full_v[fix_stage]);
    fix_stage = -1;
  };
  for (int k = 0, idx = ItemOf(0, snake); idx < num_items; idx = ItemOf(++k, snake)) {
    const AttentionWorkItem it = items[idx];
    const KvSource src{map,
                       a.block_tables + int64_t{it.seq} * a.max_pages_per_seq,
                       min(a.page_size, kKeys),
                       PageShift(a.page_size),
                       a.page_size,
                       a.num_kv_heads * a.page_size,
                       it.kv_head * a.page_size};
    const int tiles = CeilDiv(it.key_end - it.key_begin, kKeys);
    const auto load_k = [&](int t) {
      const int stage = (cnt + t) % kStages;
      MbarWait(&sm.empty_k[stage], (((cnt + t) / kStages) & 1) ^ 1);
      LoadTile(src, it.key_begin + t * kKeys, it.key_end, 0, sm.k[stage], &sm.full_k[stage], lane);
    };
    load_k(0);
    finish_fix();
    for (int t = 0; t < tiles; ++t) {
      if (t + 1 < tiles) load_k(t + 1);
      const int stage = (cnt + t) % kStages;
      MbarWait(&sm.empty_v[stage], (((cnt + t) / kStages) & 1) ^ 1);
      const int key0 = it.key_begin + t * kKeys;
      const int valid = min(it.key_end - key0, kKeys);
      uint64_t* bar = valid < kKeys ? &sm.landed[stage] : &sm.full_v[stage];
      LoadTile(src, key0, it.key_end, 1, sm.v[stage], bar, lane);
      if (valid < kKeys) {  // only the last tile; finished after the next item's K_0
        fix_stage = stage;
        fix_valid = valid;
      }
    }
    cnt += tiles;
  }
  finish_fix();
}

}  // namespace tandem::attention::sm90
