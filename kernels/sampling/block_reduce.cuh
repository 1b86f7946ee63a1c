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

// Float sum in a fixed tree order (deterministic for a given thread assignment).
__device__ __forceinline__ float BlockSumF(float x, float* scratch) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  float r = 0.0f;
  for (int i = 0; i < kSampleWarps; ++i) r += scratch[i];
  __syncthreads();
  return r;
}

__device__ __forceinline__ int32_t BlockMaxInt(int32_t x, uint64_t* scratch) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) x = max(x, __shfl_xor_sync(0xffffffffu, x, off));
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = static_cast<uint64_t>(x + 1);
  __syncthreads();
  int32_t r = -1;
  for (int i = 0; i < kSampleWarps; ++i) r = max(r, static_cast<int32_t>(scratch[i]) - 1);
  __syncthreads();
  return r;
}

// Exclusive prefix sum over threads in thread order; *total gets the block total.
template <int kWarps = kSampleWarps>
__device__ __forceinline__ uint64_t BlockExclusiveScan(uint64_t x, uint64_t* scratch,
                                                       uint64_t* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  uint64_t incl = x;
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const uint64_t y = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += y;
  }
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
