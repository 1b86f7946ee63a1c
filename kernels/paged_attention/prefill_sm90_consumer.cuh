// The consumer warpgroups of the Hopper prefill kernel (paged_attention_prefill_sm90.cu): each
// owns 64 of an item's 128 packed rows, computes S = Q K^T and O += P V with wgmma and keeps the
// online softmax (fp32, exp2) in registers. Internal to kernels/paged_attention.
//
// Schedule (FlashAttention-3's intra-warpgroup overlap): round j issues S_j = Q K_j^T and then
// O += P_{j-1} V_{j-1}, waits for S_j only, runs the softmax of S_j while the P V wgmma is still
// in flight, then waits for it, rescales O by the new row maxima and packs P_j. Optional
// ping-pong (kPingPong): the two warpgroups take turns issuing their wgmma (named barriers 3 and
// 4), so one warpgroup's softmax runs while the other's matrix work holds the tensor cores.
#pragma once

#include <cuda_bf16.h>

#include <type_traits>

#include "kernels/paged_attention/prefill_sm90_pipeline.cuh"

namespace tandem::attention::sm90 {

constexpr int kTurnBarrier = 3;  // + warpgroup: "this warpgroup may issue its wgmma"

// Starts the copy (cp.async, 16 bytes a thread at a time) of the warpgroup's 64 packed query
// rows of `it` into its swizzled Q tile; rows past the item are zero-filled. The caller waits
// (CpAsyncWait<0>), fences the async proxy and syncs the warpgroup before the wgmma read it.
__device__ __forceinline__ void IssueQuery(const PagedAttentionArgs& a, const AttentionWorkItem& it,
                                           int row0, uint8_t (&q_s)[2][kQHalfBytes], int tid) {
  const int group = a.num_q_heads / a.num_kv_heads;
  const int64_t q_stride = a.q_stride != 0 ? a.q_stride : int64_t{a.num_q_heads} * kD;
  const auto* q = static_cast<const __nv_bfloat16*>(a.q);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int c = tid + i * 128, r = c >> 4, ch = c & 15;
    const bool valid = row0 + r < it.num_rows;
    const __nv_bfloat16* src = q;
    if (valid) {
      const int packed = it.row_begin + row0 + r;
      const int64_t token = it.token_begin + packed / group;
      const int head = it.kv_head * group + packed % group;
      src = q + token * q_stride + int64_t{head} * kD + ch * 8;
    }
    CpAsync16(q_s[ch >> 3] + r * kRowBytes + ((ch & 7) ^ (r & 7)) * 16, src, valid);
  }
  CpAsyncCommit();
}

// 2^x on the SFU (ex2.approx.ftz): exp2f adds a range check and two multiplies per element for
// results below 2^-126, which a softmax weight rounds to 0 in bf16 anyway. 2^-inf = 0.
__device__ __forceinline__ float FastExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Online softmax of one 64 x 128 score tile (raw Q K^T in s; this thread's rows g and g + 8 of
// its warp): s becomes exp2(s * scale_log2 - m_new), m and l move to the new maxima; returns in
// corr the factor the previous output rows must be scaled by. kMasked: some key of the tile is
// past some row's limit (the diagonal tiles; a separate instantiation keeps the compares out of
// the other tiles).
template <bool kMasked>
__device__ __forceinline__ void SoftmaxTile(float (&s)[64], float (&m)[2], float (&l)[2],
                                            float (&corr)[2], int key0, const int (&limit)[2],
                                            float scale_log2, int quad) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    if (kMasked && key0 + (i >> 2) * 8 + 2 * quad + (i & 1) >= limit[(i >> 1) & 1]) {
      s[i] = -INFINITY;
    }
    mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
  }
  float base[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    const float m_new = fmaxf(m[r], mx[r] * scale_log2);
    base[r] = m_new == -INFINITY ? 0.0f : m_new;  // no visible key yet: no NaN
    corr[r] = FastExp2(m[r] - base[r]);
    m[r] = m_new;
    l[r] *= corr[r];
  }
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    s[i] = FastExp2(fmaf(s[i], scale_log2, -base[(i >> 1) & 1]));
    l[(i >> 1) & 1] += s[i];
  }
}

// P as the A fragments of the P V wgmma, one per 16-key step (prefill_wgmma.cuh layouts).
__device__ __forceinline__ void PackP(const float (&s)[64], uint32_t (&p)[8][4]) {
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
#pragma unroll
    for (int i = 0; i < 4; ++i) p[kk][i] = PackBf16(s[8 * kk + 2 * i], s[8 * kk + 2 * i + 1]);
  }
}

// Descriptor address words of this warpgroup's Q tile and of stage 0 of the K and V rings
// (prefill_wgmma.cuh: K-major Q and K, MN-major V with the second head_dim half at LBO).
struct TileDescs {
  uint32_t q, k, v;
  static constexpr uint32_t kStage = 2 * kKvHalfBytes >> 4;  // one stage of K or V
  template <int kStages>
  __device__ __forceinline__ TileDescs(Smem<kStages>& sm, int wg)
      : q(DescLo(sm.q[wg][0], 16)),
        k(DescLo(sm.k[0][0], 16)),
        v(DescLo(sm.v[0][0], kKvHalfBytes)) {}
};

// S = Q K^T of one stage: 8 k16 steps, 4 per head_dim half (32-byte steps inside the rows).
__device__ __forceinline__ void IssueS(float (&s)[64], const TileDescs& d, int stage) {
  WgmmaFence();
  const uint32_t k = d.k + stage * TileDescs::kStage;
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks) {
    const uint32_t off = (ks >> 2) * (kQHalfBytes >> 4) + (ks & 3) * 2;
    const uint32_t k_off = (ks >> 2) * (kKvHalfBytes >> 4) + (ks & 3) * 2;
    WgmmaSs(s, Desc(d.q + off), Desc(k + k_off), ks);
  }
  WgmmaCommit();
}

// O += P V of one stage: 8 k16 steps of 16 keys (16 rows of 128 bytes each).
__device__ __forceinline__ void IssuePv(float (&o)[64], const uint32_t (&p)[8][4],
                                        const TileDescs& d, int stage) {
  WgmmaFence();
  const uint32_t v = d.v + stage * TileDescs::kStage;
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk)
    WgmmaRsTransB(o, p[kk], Desc(v + kk * (16 * kRowBytes >> 4)));
  WgmmaCommit();
}

// Which rows of the item this warpgroup and this thread own, and the keys they see.
struct RowLimits {
  bool active;    // the warpgroup has a row of the item
  int min_limit;  // keys < min_limit are visible to every row of the warpgroup
  int tiles;      // key tiles the warpgroup computes (a prefix of the item's tiles)
  int limit[2];   // keys < limit[r] are visible to this thread's row g + 8 r
};

__device__ __forceinline__ RowLimits LimitsOf(const AttentionWorkItem& it, int group, int row0,
                                              int warp, int g) {
  RowLimits r;
  const auto limit_of = [&](int row) {
    return min(it.first_pos + (it.row_begin + row) / group + 1, it.key_end);
  };
  r.active = row0 < it.num_rows;
  r.min_limit = limit_of(row0);
  const int max_limit = r.active ? limit_of(min(row0 + kWgRows, it.num_rows) - 1) : it.key_begin;
  r.tiles = CeilDiv(max_limit - it.key_begin, kKeys);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = row0 + warp * 16 + g + 8 * i;
    r.limit[i] = row < it.num_rows ? limit_of(row) : it.key_end;
  }
  return r;
}

// Normalises and writes this thread's two rows of O (bf16 pairs) to out.
__device__ __forceinline__ void StoreRows(const PagedAttentionArgs& a, const AttentionWorkItem& it,
                                          int row0, const float (&o)[64], float (&l)[2], int lane) {
  const int group = a.num_q_heads / a.num_kv_heads;
  const int warp_row = row0 + ((threadIdx.x & 127) >> 5) * 16 + (lane >> 2);
  auto* out = static_cast<__nv_bfloat16*>(a.out);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int row = warp_row + 8 * r;
    if (row >= it.num_rows) continue;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    const int packed = it.row_begin + row;
    const int64_t token = it.token_begin + packed / group;
    const int head = it.kv_head * group + packed % group;
    auto* dst = reinterpret_cast<uint32_t*>(out + (token * a.num_q_heads + head) * kD);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      dst[j * 4 + (lane & 3)] = PackBf16(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
    }
  }
}

// Ping-pong turns of the two consumer warpgroups (named barriers kTurnBarrier + wg): Begin()
// waits for this warpgroup's turn, End() hands the turn to the other one, except after the
// very last turn of warpgroup 1 (no one would wait for it). No-ops without kPingPong.
template <bool kPingPong>
struct Turns {
  int wg;
  bool last_item;
  __device__ __forceinline__ void Begin() const {
    if (kPingPong) NamedBarrierSync(kTurnBarrier + wg, 256);
  }
  __device__ __forceinline__ void End(bool last_turn) const {
    if (kPingPong && !(wg == 1 && last_item && last_turn)) {
      NamedBarrierArrive(kTurnBarrier + 1 - wg, 256);
    }
  }
};

// One consumer warpgroup `wg` (0, 1): rows [64 wg, 64 wg + 64) of every item of this CTA.
template <int kStages, bool kPingPong>
__device__ void Consume(const PagedAttentionArgs& a, const AttentionWorkItem* items, int num_items,
                        bool snake, Smem<kStages>& sm, int wg, int tid) {
  const int warp = tid >> 5, lane = tid & 31;
  const int group = a.num_q_heads / a.num_kv_heads;
  const float scale_log2 = a.scale * kLog2e;
  const int row0 = wg * kWgRows;
  // Warpgroup 0 takes the first turn: warpgroup 1 opens its barrier once.
  if (kPingPong && wg == 1 && blockIdx.x < num_items) NamedBarrierArrive(kTurnBarrier, 256);
  const TileDescs descs(sm, wg);
  uint32_t cnt = 0;  // tiles consumed before this item (the stage ring position)
  // Q of the first item now; Q of item k + 1 once the last S = Q K^T of item k is done (below),
  // so its load runs under item k's last P V and output stores.
  if (ItemOf(0, snake) < num_items) IssueQuery(a, items[ItemOf(0, snake)], row0, sm.q[wg], tid);
  for (int k = 0, idx = ItemOf(0, snake); idx < num_items; idx = ItemOf(++k, snake)) {
    const AttentionWorkItem it = items[idx];
    CpAsyncWait<0>();
    FenceProxyAsync();
    NamedBarrierSync(1 + wg, 128);  // the warpgroup's Q tile landed
    const RowLimits rl = LimitsOf(it, group, row0, warp, lane >> 2);
    const int tiles = CeilDiv(it.key_end - it.key_begin, kKeys);
    const bool last_item = ItemOf(k + 1, snake) >= num_items;
    float o[64], s[64], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, corr[2];
    uint32_t p[8][4];
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.0f;
    Turns<kPingPong> turns{wg, last_item};
    const auto stage = [&](int j) { return (cnt + j) % kStages; };
    const auto parity = [&](int j) { return ((cnt + j) / kStages) & 1; };
    const auto release = [&](uint64_t* empty, int j) {
      __syncwarp();
      if (lane == 0) MbarArrive(&empty[stage(j)]);
    };
    const auto softmax = [&](auto masked, int j) {
      FenceRegs(s);
      SoftmaxTile<decltype(masked)::value>(s, m, l, corr, it.key_begin + j * kKeys, rl.limit,
                                           scale_log2, lane & 3);
    };
    // One steady round: S_j and P_{j-1} V_{j-1} in flight, the softmax of S_j under the latter.
    const auto round = [&](auto masked, int j) {
      MbarWait(&sm.full_k[stage(j)], parity(j));
      MbarWait(&sm.full_v[stage(j - 1)], parity(j - 1));
      turns.Begin();
      IssueS(s, descs, stage(j));
      IssuePv(o, p, descs, stage(j - 1));
      turns.End(false);
      WgmmaWait<1>();
      release(sm.empty_k, j);
      softmax(masked, j);
      WgmmaWait<0>();
      FenceRegs(o);
      release(sm.empty_v, j - 1);
#pragma unroll
      for (int i = 0; i < 64; ++i) o[i] *= corr[(i >> 1) & 1];
      PackP(s, p);
    };
    // Tiles [0, unmasked) lie below every row's limit.
    const int unmasked = (rl.min_limit - it.key_begin) / kKeys;
    // Rounds: S_0; then S_j with P_{j-1} V_{j-1}; then the last P V; then the tiles past this
    // warpgroup's rows (waited for and released only). Every warpgroup takes tiles + 1 turns.
    if (rl.tiles > 0) {
      MbarWait(&sm.full_k[stage(0)], parity(0));
      turns.Begin();
      IssueS(s, descs, stage(0));
      turns.End(false);
      WgmmaWait<0>();
      release(sm.empty_k, 0);
      softmax(std::true_type{}, 0);
      PackP(s, p);
    }
    for (int j = 1; j < min(unmasked, rl.tiles); ++j) round(std::false_type{}, j);
    for (int j = max(unmasked, 1); j < rl.tiles; ++j) round(std::true_type{}, j);
    // Every S wgmma of this item has completed in each warp: the Q tile is free.
    NamedBarrierSync(1 + wg, 128);
    if (ItemOf(k + 1, snake) < num_items) {
      IssueQuery(a, items[ItemOf(k + 1, snake)], row0, sm.q[wg], tid);
    }
    if (rl.tiles > 0) {
      MbarWait(&sm.full_v[stage(rl.tiles - 1)], parity(rl.tiles - 1));
      turns.Begin();
      IssuePv(o, p, descs, stage(rl.tiles - 1));
      turns.End(rl.tiles == tiles);
      WgmmaWait<0>();
      FenceRegs(o);
      release(sm.empty_v, rl.tiles - 1);
    } else {
      turns.Begin();
      turns.End(rl.tiles == tiles);
    }
    for (int j = rl.tiles; j < tiles; ++j) {
      MbarWait(&sm.full_k[stage(j)], parity(j));
      release(sm.empty_k, j);
      MbarWait(&sm.full_v[stage(j)], parity(j));
      release(sm.empty_v, j);
      turns.Begin();
      turns.End(j == tiles - 1);
    }
    cnt += tiles;
    if (rl.active) StoreRows(a, it, row0, o, l, lane);
  }
}

}  // namespace tandem::attention::sm90
