// Shared by the GPU tests of paged attention and RoPE/KV-store: device buffers, skip-if-no-GPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::testing {

inline bool HasCudaDevice() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define SKIP_WITHOUT_GPU()                                             \
  do {                                                                 \
    if (!::tandem::testing::HasCudaDevice()) GTEST_SKIP() << "no GPU"; \
  } while (0)

// A device copy of a host vector (RAII); Download() copies it back.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::vector<T>& host) : n_(host.size()) {
    EXPECT_EQ(cudaMalloc(&ptr_, bytes()), cudaSuccess);
    if (n_ > 0) {
      EXPECT_EQ(cudaMemcpy(ptr_, host.data(), bytes(), cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return ptr_; }
  size_t bytes() const { return std::max<size_t>(n_, 1) * sizeof(T); }
  std::vector<T> Download() const {
    std::vector<T> host(n_);
    if (n_ > 0) {
      EXPECT_EQ(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return host;
  }

 private:
  size_t n_;
  T* ptr_ = nullptr;
};

}  // namespace tandem::testing
