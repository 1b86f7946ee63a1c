// The top-N selection of the logprobs kernel (logprobs.cu), N <= kMaxTopLogprobs. CUDA only.
//
// A candidate is a 64-bit pair: the logit's order-preserving key in the high word (-0 mapped to
// +0, so equal logits have equal keys) and ~id in the low word, so that a larger pair is a larger
// logit or, for equal logits, a lower id: pairs of distinct tokens are distinct, and "the N
// largest pairs" is exactly the order logprobs.h defines. 0 is below every real pair (none).
//
// Each warp streams a contiguous range of the row in increasing id order and keeps, in its own
// shared-memory buffer, a superset of the N largest pairs it has seen: every pair >= a threshold
// `thr` that only rises, where thr is the N-th largest of N distinct pairs already seen (so at
// least N seen pairs are >= thr, and the N largest all are). Since a later logit has a larger id
// than every pair in the buffer, it belongs in the buffer iff its logit is > thr's logit: the hot
// loop compares floats only. When the buffer holds more than kCompactAbove pairs after a group of
// loads, WarpCompact raises thr to the N-th largest of the lanes' maxima in the buffer (N
// distinct buffered pairs) and drops the pairs below it; each round keeps at most N *
// ceil(count / 32) pairs (only the N lanes whose maximum reaches thr keep any), fewer than
// count whenever count > kCompactAbove, so the loop ends. A group adds at most kGroupElems pairs,
// so the buffer never holds more than kCompactAbove + kGroupElems.
#pragma once

#include <cstdint>

#include "kernels/logprobs/logprobs.h"

namespace tandem::logprobs_internal {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kGroupVecs = 4;                          // float4 loads per lane in flight
constexpr int kGroupElems = 32 * 4 * kGroupVecs;       // logits a warp reads per group
constexpr uint32_t kCompactAbove = 64;                 // >= 54: the compaction makes progress
constexpr int kWarpCap = kCompactAbove + kGroupElems;  // 576 pairs
static_assert(kMaxTopLogprobs <= 32 && kWarps * kMaxTopLogprobs <= kThreads);

__device__ __forceinline__ uint32_t FloatKey(float x) {
  uint32_t b = __float_as_uint(x);
  if (b == 0x80000000u) b = 0;  // -0 == +0
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float KeyFloat(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k ^ 0x80000000u) : ~k);
}
__device__ __forceinline__ uint64_t PairOf(float x, int64_t id) {
  return (uint64_t{FloatKey(x)} << 32) | (~static_cast<uint32_t>(id));
}
__device__ __forceinline__ int32_t PairId(uint64_t p) {
  return static_cast<int32_t>(~static_cast<uint32_t>(p));
}
__device__ __forceinline__ float PairLogit(uint64_t p) {
  return KeyFloat(static_cast<uint32_t>(p >> 32));
}

// The largest pair of the warp's lanes, in every lane.
__device__ __forceinline__ uint64_t WarpMaxPair(uint64_t p) {
  const uint32_t hi = __reduce_max_sync(0xffffffffu, static_cast<uint32_t>(p >> 32));
  const uint32_t lo = static_cast<uint32_t>(p >> 32) == hi ? static_cast<uint32_t>(p) : 0u;
  return (uint64_t{hi} << 32) | __reduce_max_sync(0xffffffffu, lo);
}

// The j-th largest (j in [1, 32]) of the lanes' pairs, or 0 when fewer than j lanes hold one.
__device__ __forceinline__ uint64_t WarpJthLargest(uint64_t p, int j) {
  uint64_t m = 0;
  for (int i = 0; i < j; ++i) {
    m = WarpMaxPair(p);
    if (m == 0) return 0;
    if (p == m) p = 0;  // distinct pairs: exactly one lane held it
  }
  return m;
}

// A warp's candidate buffer (see the top of the file); every member is warp-uniform.
struct WarpTop {
  uint64_t* buf;          // kWarpCap pairs in shared memory
  uint32_t count = 0;     // pairs in buf
  uint64_t thr = 0;       // buf holds every pair seen that is >= thr
  float thr_logit = NAN;  // thr's logit; NaN until thr is set: every logit is then a candidate

  // Appends the pairs of the group's logits v[e] (ids id0 + offset(e)) flagged in `want`
  // (bit e); all lanes call it when any lane has a flag.
  __device__ __forceinline__ void Append(const float (&v)[kGroupVecs][4], uint32_t want,
                                         int64_t id0) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int i = 0; i < kGroupVecs; ++i) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const bool w = (want >> (4 * i + k)) & 1u;
        const uint32_t mask = __ballot_sync(0xffffffffu, w);
        if (w) {
          const uint32_t slot = count + __popc(mask & ((1u << lane) - 1));
          if (slot < kWarpCap) buf[slot] = PairOf(v[i][k], id0 + i * 128 + 4 * lane + k);
        }
        count += __popc(mask);
      }
    }
    count = min(count, static_cast<uint32_t>(kWarpCap));  // never reached (see above)
  }

  // Raises thr until at most kCompactAbove pairs remain (n in [1, kMaxTopLogprobs]).
  __device__ __forceinline__ void Compact(int n) {
    const int lane = threadIdx.x % 32;
    while (count > kCompactAbove) {
      __syncwarp();  // the appends (or the previous round's writes) before the reads
      uint64_t lane_max = 0;
      for (uint32_t i = lane; i < count; i += 32) lane_max = max(lane_max, buf[i]);
      const uint64_t t = WarpJthLargest(lane_max, n);  // count > 64: every lane holds pairs
      uint32_t kept = 0;
      for (uint32_t base = 0; base < count; base += 32) {
        const uint32_t i = base + lane;
        const uint64_t p = i < count ? buf[i] : 0;
        const bool keep = i < count && p >= t;
        const uint32_t mask = __ballot_sync(0xffffffffu, keep);
        __syncwarp();  // this chunk's reads before any write into it
        if (keep) buf[kept + __popc(mask & ((1u << lane) - 1))] = p;
        kept += __popc(mask);
      }
      count = kept;
      thr = t;
      thr_logit = PairLogit(t);
    }
  }

  // The warp's min(n, count) largest pairs, in descending order, into out; returns how many.
  __device__ __forceinline__ uint32_t Finish(int n, uint64_t* out) {
    Compact(n);
    __syncwarp();
    for (uint32_t i = threadIdx.x % 32; i < count; i += 32) {
      const uint64_t p = buf[i];
      uint32_t rank = 0;
      for (uint32_t j = 0; j < count; ++j) rank += buf[j] > p ? 1u : 0u;
      if (rank < static_cast<uint32_t>(n)) out[rank] = p;
    }
    return min(count, static_cast<uint32_t>(n));
  }
};

// Block-wide (kThreads threads): the n largest pairs of kRegions regions, each sorted in
// descending order, region g holding len[g] <= kMaxTopLogprobs pairs, into out[0 .. min(n,
// sum len)) in descending order (out may be another CTA's shared memory). Each candidate's rank
// is the number of larger pairs in every region; distinct pairs have distinct ranks.
template <int kRegions>
__device__ void MergeRegions(const uint64_t (*regions)[kMaxTopLogprobs], const uint32_t* len, int n,
                             uint64_t* out) {
  static_assert(kRegions * kMaxTopLogprobs <= kThreads);
  const int g = threadIdx.x / kMaxTopLogprobs, e = threadIdx.x % kMaxTopLogprobs;
  if (g >= kRegions || static_cast<uint32_t>(e) >= len[g]) return;
  const uint64_t p = regions[g][e];
  uint32_t rank = 0;
#pragma unroll
  for (int h = 0; h < kRegions; ++h) {
    for (uint32_t j = 0; j < len[h]; ++j) rank += regions[h][j] > p ? 1u : 0u;
  }
  if (rank < static_cast<uint32_t>(n)) out[rank] = p;
}

}  // namespace tandem::logprobs_internal
