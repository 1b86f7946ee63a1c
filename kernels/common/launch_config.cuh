// Launch configuration cached per device, for kernels whose grid depends on the device (persistent
// grids sized by occupancy, grids of a few blocks per SM): the occupancy queries and attribute
// calls cost microseconds of host time, too much on every decode launch, and their answers only
// change with the device. CUDA only.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>

#include "absl/status/statusor.h"
#include "base/cuda_check.h"

namespace tandem {

constexpr int kMaxDevices = 64;  // devices with a cache slot; others compute on every call

// compute() (returning absl::StatusOr<int>, a positive value) on the first call on the current
// device, the cached value after. One cache per quantity (a function-local static array).
template <typename F>
absl::StatusOr<int> CachedPerDevice(std::atomic<int> (&cache)[kMaxDevices], F&& compute) {
  int device = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  if (device < kMaxDevices) {
    const int cached = cache[device].load(std::memory_order_relaxed);
    if (cached > 0) return cached;
  }
  const absl::StatusOr<int> value = compute();
  if (value.ok() && device < kMaxDevices) cache[device].store(*value, std::memory_order_relaxed);
  return value;
}

// Streaming multiprocessors of the current device (132 if the query fails).
inline int NumSms() {
  static std::atomic<int> cache[kMaxDevices];
  const absl::StatusOr<int> sms = CachedPerDevice(cache, []() -> absl::StatusOr<int> {
    int device = 0, n = 0;
    CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
    CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    return n > 0 ? n : 132;
  });
  return sms.ok() ? *sms : 132;
}

// L2 cache bytes of the current device (50 MiB if the query fails).
inline int L2Bytes() {
  static std::atomic<int> cache[kMaxDevices];
  const absl::StatusOr<int> bytes = CachedPerDevice(cache, []() -> absl::StatusOr<int> {
    int device = 0, n = 0;
    CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
    CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&n, cudaDevAttrL2CacheSize, device));
    return n > 0 ? n : 50 << 20;
  });
  return bytes.ok() ? *bytes : 50 << 20;
}

// Resident CTAs per SM of `kernel` with `smem` bytes of dynamic shared memory, after setting its
// shared-memory limit to `smem` (once per device: the limit is per device). One cache per
// (kernel instantiation, smem); a kernel launched with two sizes queries the larger one last, so
// that the limit it keeps allows both.
template <typename Kernel>
absl::StatusOr<int> BlocksPerSm(Kernel kernel, int threads, int smem,
                                std::atomic<int> (&cache)[kMaxDevices]) {
  return CachedPerDevice(cache, [&]() -> absl::StatusOr<int> {
    CUDA_RETURN_IF_ERROR(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int per_sm = 0;
    CUDA_RETURN_IF_ERROR(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
    return std::max(per_sm, 1);
  });
}

}  // namespace tandem
