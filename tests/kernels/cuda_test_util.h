// Helpers for the GPU kernel tests: device detection (tests skip cleanly without a GPU), RAII
// device buffers (DeviceBuffer: bytes, for host tensors; DeviceVector<T>: a typed copy of a host
// vector), and a stream-then-graph runner.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::testing {

inline bool HasCudaDevice() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define TANDEM_SKIP_WITHOUT_GPU() \
  if (!::tandem::testing::HasCudaDevice()) GTEST_SKIP() << "no CUDA device"

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    EXPECT_EQ(cudaMalloc(&ptr_, bytes_ > 0 ? bytes_ : 1), cudaSuccess);
  }
  template <typename T>
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size() * sizeof(T)) {
    Upload(host.data());
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  void Upload(const void* host) {
    EXPECT_EQ(cudaMemcpy(ptr_, host, bytes_, cudaMemcpyHostToDevice), cudaSuccess);
  }
  void Download(void* host) const {
    EXPECT_EQ(cudaMemcpy(host, ptr_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
  }
  // Fills with 0xff bytes: NaN for f32 and bf16, -1 for ints; unwritten outputs fail the checks.
  void Poison() { EXPECT_EQ(cudaMemset(ptr_, 0xff, bytes_), cudaSuccess); }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A device copy of a host vector (RAII); Download() copies it back.
template <typename T>
class DeviceVector {
 public:
  explicit DeviceVector(const std::vector<T>& host) : n_(host.size()) {
    EXPECT_EQ(cudaMalloc(&ptr_, bytes()), cudaSuccess);
    if (n_ > 0) {
      EXPECT_EQ(cudaMemcpy(ptr_, host.data(), bytes(), cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~DeviceVector() { cudaFree(ptr_); }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;

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

// Runs `enqueue(stream)` in stream order, then captured into a CUDA graph and replayed `replays`
// times; `reset()` before and `check(label)` after every run. For kernels whose ordering (e.g.
// programmatic dependent launch) differs between plain launches and graph edges.
template <typename Reset, typename Enqueue, typename Check>
void RunInStreamAndGraph(cudaStream_t stream, const Reset& reset, const Enqueue& enqueue,
                         const Check& check, int replays = 2) {
  ASSERT_NO_FATAL_FAILURE(reset());
  ASSERT_NO_FATAL_FAILURE(enqueue(stream));
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_NO_FATAL_FAILURE(check("stream"));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_NO_FATAL_FAILURE(enqueue(stream));
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < replays; ++replay) {
    ASSERT_NO_FATAL_FAILURE(reset());
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    ASSERT_NO_FATAL_FAILURE(check("graph replay"));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

}  // namespace tandem::testing
