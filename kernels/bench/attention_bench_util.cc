// attention_bench's timing, random inputs and the ceilings measured in the same run
// (attention_bench.h).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string_view>
#include <vector>

#include "base/check.h"
#include "kernels/bench/attention_bench.h"
#include "kernels/common/kv_layout.h"
#include "kernels/paged_attention/paged_attention.h"

namespace tandem::attention_bench {

// Median over `reps` of (time of `inner` calls of fn) / inner, in microseconds.
double MedianUs(const std::function<void(int)>& fn, int inner, int reps, cudaStream_t stream) {
  cudaEvent_t start, stop;
  CK(cudaEventCreate(&start));
  CK(cudaEventCreate(&stop));
  for (int i = 0; i < inner; ++i) fn(i);  // warm-up
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    CK(cudaEventRecord(start, stream));
    for (int i = 0; i < inner; ++i) fn(i);
    CK(cudaEventRecord(stop, stream));
    CK(cudaEventSynchronize(stop));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(1e3 * ms / inner);
  }
  CK(cudaEventDestroy(start));
  CK(cudaEventDestroy(stop));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Fills n bf16 with random values: a 32 MB random block, replicated on the device.
void FillRandomBf16(void* dev, int64_t n, uint32_t seed) {
  const int64_t block = std::min<int64_t>(n, int64_t{16} << 20);
  std::vector<uint16_t> host(block);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  for (auto& x : host) x = F32ToBf16(uni(rng));
  auto* d = static_cast<uint16_t*>(dev);
  CK(cudaMemcpy(d, host.data(), block * 2, cudaMemcpyHostToDevice));
  for (int64_t done = block; done < n; done += block) {
    CK(cudaMemcpy(d + done, d, std::min(block, n - done) * 2, cudaMemcpyDeviceToDevice));
  }
}

double CopyTbs() {
  const int64_t bytes = int64_t{2} << 30;
  void *a, *b;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  FillRandomBf16(a, bytes / 2, 1);
  const double us =
      MedianUs([&](int) { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); }, 3, 7);
  CK(cudaFree(a));
  CK(cudaFree(b));
  return 2.0 * bytes / us * 1e-6;
}

double GemmTflops() {
  const int n = 8192;
  void *a, *b, *c;
  CK(cudaMalloc(&a, int64_t{n} * n * 2));
  CK(cudaMalloc(&b, int64_t{n} * n * 2));
  CK(cudaMalloc(&c, int64_t{n} * n * 2));
  FillRandomBf16(a, int64_t{n} * n, 2);
  FillRandomBf16(b, int64_t{n} * n, 3);
  cublasHandle_t h;
  CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  const float one = 1.0f, zero = 0.0f;
  const double us = MedianUs(
      [&](int) {
        CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, CUDA_R_16BF, n, b,
                           CUDA_R_16BF, n, &zero, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
      },
      5, 7);
  cublasDestroy(h);
  CK(cudaFree(a));
  CK(cudaFree(b));
  CK(cudaFree(c));
  return 2.0 * n * n * double{n} / us * 1e-6;
}

}  // namespace tandem::attention_bench
