// Block-wide reductions for the sampling kernels (blockDim.x == 32 * kWarps: kSampleWarps for the
// one-block-per-row kernel, the default). Each call ends with a barrier, so results are valid in
// every thread and scratch may be reused.
// Integer sums make the results independent of thread order (deterministic).
#pragma once

#include <cstdint>

namespace tandem::sampling_internal {

constexpr int kSampleThreads = 1024;
constexpr int kSampleWarps = kSampleThreads / 32;

// Max of (value, id) pairs; ties go to the lower id. NaN must be mapped to -inf by the caller.
struct ArgMaxPair {
  float value;
  int32_t id;
};

__device__ __forceinline__ ArgMaxPair Better(ArgMaxPair a, ArgMaxPair b) {
  if (b.value > a.value || (b.value == a.value && b.id < a.id)) return b;
  return a;
}

template <int kWarps = kSampleWarps>
__device__ __forceinline__ ArgMaxPair BlockArgMax(ArgMaxPair p, ArgMaxPair* scratch) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    ArgMaxPair o{__shfl_xor_sync(0xffffffffu, p.value, off),
                 __shfl_xor_sync(0xffffffffu, p.id, off)};
    p = Better(p, o);
  }
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = p;
  __syncthreads();
  ArgMaxPair r = scratch[0];
  for (int i = 1; i < kWarps; ++i) r = Better(r, scratch[i]);
  __syncthreads();
  return r;
}

__device__ __forceinline__ uint64_t WarpSum(uint64_t x) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

template <int kWarps = kSampleWarps>
__device__ __forceinline__ uint64_t BlockSum(uint64_t x, uint64_t* scratch) {
  x = WarpSum(x);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  uint64_t r = 0;
  for (int i = 0; i < kWarps; ++i) r += scratch[i];
  __syncthreads();
  return r;
}

// Inclusive prefix sum over the lanes of a warp, in lane order (uint64_t or uint32_t).
template <typename T>
__device__ __forceinline__ T WarpInclusiveScan(T x) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const T y = __shfl_up_sync(0xffffffffu, x, off);
    if (lane >= off) x += y;
  }
  return x;
}

// Warp-wide inverse CDF over 32 * kPerLane counts or masses in lane-major order (lane l holds
// elements kPerLane * l .. kPerLane * l + kPerLane - 1 in v): the first element whose inclusive
// prefix sum reaches target (>= 1), and target minus the sum before it (1 .. its value). In every
// lane; index -1 when the total falls short.
struct WarpPick {
  int index;
  uint64_t rest;
};
template <int kPerLane>
__device__ __forceinline__ WarpPick WarpFirstReaching(const uint64_t (&v)[kPerLane],
                                                      uint64_t target) {
  uint64_t mine = 0;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) mine += v[j];
  const uint64_t incl = WarpInclusiveScan(mine);
  const uint32_t hits = __ballot_sync(0xffffffffu, incl >= target);
  if (hits == 0) return WarpPick{-1, 0};
  const int owner = __ffs(hits) - 1;
  int index = 0;
  uint64_t rest = 0;
  if (static_cast<int>(threadIdx.x % 32) == owner) {
    rest = target - (incl - mine);
    for (int j = 0; j < kPerLane; ++j) {
      if (v[j] >= rest) {
        index = kPerLane * owner + j;
        break;
      }
      rest -= v[j];
    }
  }
  return WarpPick{__shfl_sync(0xffffffffu, index, owner), __shfl_sync(0xffffffffu, rest, owner)};
}

// Warp: of the 32 * kPerLane intervals [before_i, before_i + v_i) laid end to end (v in shared
// memory, lane-major as above), the one holding rest, and rest - before_i; index -1 when rest is
// at or past the total.
template <int kPerLane>
__device__ __forceinline__ WarpPick WarpFindInterval(const uint64_t* v, uint64_t rest) {
  uint64_t mine[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) mine[j] = v[kPerLane * (threadIdx.x % 32) + j];
  WarpPick pick = WarpFirstReaching(mine, rest + 1);  // the first prefix that exceeds rest
  pick.rest -= 1;
  return pick;
}

// Exclusive prefix sum over threads in thread order; *total gets the block total.
template <int kWarps = kSampleWarps>
__device__ __forceinline__ uint64_t BlockExclusiveScan(uint64_t x, uint64_t* scratch,
                                                       uint64_t* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const uint64_t incl = WarpInclusiveScan(x);
  if (lane == 31) scratch[warp] = incl;
  __syncthreads();
  uint64_t warp_offset = 0, sum = 0;
  for (int i = 0; i < kWarps; ++i) {
    if (i < warp) warp_offset += scratch[i];
    sum += scratch[i];
  }
  __syncthreads();
  *total = sum;
  return warp_offset + incl - x;
}

}  // namespace tandem::sampling_internal
