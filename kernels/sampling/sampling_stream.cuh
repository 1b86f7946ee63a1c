// Internals of the streaming cluster kernel (sampling_stream.cu): constants, the shared-memory
// layout, a CTA's slice of a row and the grouped loads. The kernel streams each row from HBM once
// (no shared-memory copy of the row, so many rows are in flight): greedy and temperature-only rows
// (sampling_stream.cu) and top-k rows with k <= kStreamTopKMax (sampling_stream_topk.cuh).
#pragma once

#include <cooperative_groups.h>

#include <cstdint>

#include "kernels/sampling/sampling_cluster.cuh"

namespace tandem::sampling_stream {

using sampling_cluster::kCluster;
using sampling_cluster::kFallbackToken;
using sampling_cluster::kSliceCap;
using sampling_cluster::kStreamTopKMax;
using sampling_internal::ArgMaxPair;
using sampling_internal::KeyOf;
using sampling_internal::KeyToFloat;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTileElems = 4 * kThreads;                                // 4 logits per thread
constexpr int kSliceTiles = (kSliceCap + kTileElems - 1) / kTileElems;  // 19
constexpr int kEntries = kSliceTiles * kWarps;                          // 152
constexpr int kEntrySlots = (kEntries + 31) / 32 * 32;                  // 160: 5 per lane
constexpr int kGroup = 8;  // tiles loaded together: 8 x 16 bytes in flight per thread

// Top-k rows: candidates one CTA keeps from its slice (those >= its running lower bound of the
// k-th largest logit; ~0.7% of a N(0, s^2) slice at k = 50), the CTAs' local top-k sets gathered in
// the row's leader CTA (kRegion per CTA, sorted), and the leader's top-k set (k + ties). A row that
// overflows any of them is left to the resident kernel (kFallbackToken).
constexpr int kLocalCap = 1024;
constexpr int kRegion = 256;
constexpr int kKeptCap = 512;
static_assert(kStreamTopKMax <= 32 * kWarps && kStreamTopKMax <= kRegion);
static_assert(kKeptCap % kThreads == 0 && kLocalCap % 4 == 0 && kRegion % 4 == 0);

struct TopKShared {
  // This CTA's candidates (logit, id), `count` of them (may exceed kLocalCap: overflow).
  alignas(16) float x[kLocalCap];
  int32_t id[kLocalCap];
  // This CTA's local top-k set, `len` of them (may exceed kRegion: overflow).
  alignas(16) float lx[kRegion];
  int32_t lid[kRegion];
  uint32_t lidx[kRegion];  //   and their candidate indices (ties are ordered by them)
  // Leader: CTA c's local top-k set in region c, in descending (logit, candidate index) order,
  // g_len[c] of them; pushed through DSMEM.
  float gx[kCluster][kRegion];
  int32_t gid[kCluster][kRegion];
  float kx[kKeptCap];  // leader: the row's top-k set (logit, id, fixed-point weight)
  int32_t kid[kKeptCap];
  uint64_t kw[kKeptCap];
  uint64_t full;  // leader: mbarrier, kCluster * kThreads arrivals per row it leads
  uint32_t g_len[kCluster];
  uint32_t proposal[kWarps];  // first load group: each warp's bound key
  uint32_t votes[kWarps];     //   and how many lanes' maxima are >= each
  uint32_t count;             // candidates appended to x / id
  uint32_t len;               // this CTA's local top-k set size
  uint32_t g_overflow;        // leader: a CTA's candidates or local top-k set overflowed
  uint32_t k_count;           // leader: the top-k set's size (may exceed kKeptCap)
  int32_t token;              // leader: the drawn token, kFallbackToken until found
};

// The layouts are flat structs: a member reached through a base class of a __shared__ object
// cost the kernel 8 registers and spills (ptxas: 56 -> 64 registers, 0 -> 40 bytes of stack).
struct StreamShared {
  float entry_max[kEntrySlots];  // m_e (-inf: no weight)
  float entry_sum[kEntrySlots];  // S_e
  uint64_t entry_mass[kEntrySlots];
  uint64_t peer_total[kCluster];      // pushed by each CTA: its mass
  ArgMaxPair peer_best[2][kCluster];  // pushed by each CTA: its (max, id); by row parity
  uint64_t scratch[kWarps];
  ArgMaxPair argmax_scratch[kWarps];
  int row_flags[kThreads];
  TopKShared topk;
};
static_assert(sizeof(StreamShared) <= 48 * 1024, "static shared memory; 4 CTAs per SM");

// StreamBuild::kNoTopK: StreamShared without the top-k buffers (4.9 KiB per CTA).
struct StreamSharedLean {
  float entry_max[kEntrySlots];
  float entry_sum[kEntrySlots];
  uint64_t entry_mass[kEntrySlots];
  uint64_t peer_total[kCluster];
  ArgMaxPair peer_best[2][kCluster];
  uint64_t scratch[kWarps];
  ArgMaxPair argmax_scratch[kWarps];
  int row_flags[kThreads];
};

// The kernel's shared memory, at namespace scope so that functions not inlined into the kernel
// (TopKRow) still address it as shared memory (LDS/STS, not generic loads); one per layout (a
// kernel's static shared memory holds only the one it uses).
static __shared__ StreamShared stream_shared;
static __shared__ StreamSharedLean stream_shared_lean;
template <typename S>
__device__ __forceinline__ S& SharedOf();
template <>
__device__ __forceinline__ StreamShared& SharedOf<StreamShared>() {
  return stream_shared;
}
template <>
__device__ __forceinline__ StreamSharedLean& SharedOf<StreamSharedLean>() {
  return stream_shared_lean;
}

struct Slice {
  const float* logits;  // the slice in global memory, n logits
  int n;
  int32_t base;  // id of the first logit
};

// The 4 logits at `local` (a multiple of 4) of the slice; NaN and beyond the slice: -inf.
__device__ __forceinline__ void Load4(const Slice& sl, bool vec_ok, int local, float (&q)[4]) {
  if (vec_ok && local + 3 < sl.n) {
    const float4 v = __ldcs(reinterpret_cast<const float4*>(sl.logits + local));
    q[0] = v.x, q[1] = v.y, q[2] = v.z, q[3] = v.w;
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) q[e] = local + e < sl.n ? sl.logits[local + e] : -INFINITY;
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) q[e] = isnan(q[e]) ? -INFINITY : q[e];
}

// This thread's 4 logits of each tile t0 .. t0 + kGroup - 1: every 16-byte load first, into its
// own registers (then kGroup are in flight); the rare scalar logits (unaligned rows, the row's
// last partial float4) after. NaN and beyond the slice: -inf.
__device__ __forceinline__ void LoadGroup(const Slice& sl, bool vec_ok, int t0,
                                          float (&q)[kGroup][4]) {
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    const int local = (t0 + g) * kTileElems + 4 * threadIdx.x;
    float4 v = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
    if (t0 + g < kSliceTiles && vec_ok && local + 3 < sl.n) {
      v = __ldcs(reinterpret_cast<const float4*>(sl.logits + local));
    }
    q[g][0] = v.x, q[g][1] = v.y, q[g][2] = v.z, q[g][3] = v.w;
  }
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    const int local = (t0 + g) * kTileElems + 4 * threadIdx.x;
    if (t0 + g < kSliceTiles && !(vec_ok && local + 3 < sl.n) && local < sl.n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) q[g][e] = local + e < sl.n ? sl.logits[local + e] : -INFINITY;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) q[g][e] = isnan(q[g][e]) ? -INFINITY : q[g][e];
  }
}

}  // namespace tandem::sampling_stream
