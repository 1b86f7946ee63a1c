#include <algorithm>
#include <vector>

#include "kernels/bench/bench_util.h"
#include "kernels/common/vec_util.cuh"
#include "kernels/gemm/gemm.h"
#include "kernels/sampling/sampling_rng.h"

namespace tandem::bench {
namespace {

FILE* g_json = nullptr;

#define CHECK_GEMM(expr)                                               \
  do {                                                                 \
    const absl::Status _s = (expr);                                    \
    if (!_s.ok()) {                                                    \
      std::fprintf(stderr, "%s\n", std::string(_s.message()).c_str()); \
      std::abort();                                                    \
    }                                                                  \
  } while (0)

__device__ float HashUniform(uint64_t seed, int64_t i) {
  return static_cast<float>(SamplingUniformImpl(seed, static_cast<uint64_t>(i)));
}

__global__ void FillBf16Kernel(__nv_bfloat16* p, int64_t n, uint64_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    p[i] = __float2bfloat16_rn(lo + (hi - lo) * HashUniform(seed, i));
  }
}

__global__ void FillF32Kernel(float* p, int64_t n, uint64_t seed, float lo, float hi, bool normal) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    if (normal) {  // Irwin-Hall(4): variance 4/12
      float s = 0;
      for (int j = 0; j < 4; ++j) s += HashUniform(seed + j, i);
      p[i] = (s - 2.0f) * 1.7320508f * hi;
    } else {
      p[i] = lo + (hi - lo) * HashUniform(seed, i);
    }
  }
}

// LLM-like rows (at top-p 0.95 a nucleus of a few tokens; kernels/sampling/WORKLOG.md, session
// 10): per row, `strong` logits at hashed positions raised by 8 to 16 (a collision raises one
// twice).
__global__ void AddPeaksKernel(float* p, int64_t rows, int64_t vocab, int strong, uint64_t seed) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= rows * strong) return;
  const int64_t row = i / strong;
  const auto at = static_cast<int64_t>(HashUniform(seed, 2 * i) * static_cast<float>(vocab));
  atomicAdd(&p[row * vocab + min(at, vocab - 1)], 8.0f + 8.0f * HashUniform(seed, 2 * i + 1));
}

// Reads n 16-byte vectors, kUnroll independent loads in flight per thread; writes one word per
// block so the loads cannot be dropped.
template <int kUnroll>
__global__ void ReadKernel(const uint4* p, int64_t n, uint32_t* sink) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  uint32_t acc = 0;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) v[j] = LoadStreaming16(p + i + j * stride);
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = LoadStreaming16(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) sink[blockIdx.x] = acc;
}

}  // namespace

std::vector<float> RunMicros(const std::function<void(int)>& fn, cudaStream_t stream, int warmup,
                             int iters) {
  for (int i = 0; i < warmup; ++i) fn(i);
  std::vector<cudaEvent_t> ev(2 * iters);
  for (auto& e : ev) BENCH_CUDA(cudaEventCreate(&e));
  for (int i = 0; i < iters; ++i) {
    BENCH_CUDA(cudaEventRecord(ev[2 * i], stream));
    fn(warmup + i);
    BENCH_CUDA(cudaEventRecord(ev[2 * i + 1], stream));
  }
  BENCH_CUDA(cudaStreamSynchronize(stream));
  BENCH_CUDA(cudaGetLastError());
  std::vector<float> us(iters);
  for (int i = 0; i < iters; ++i) {
    BENCH_CUDA(cudaEventElapsedTime(&us[i], ev[2 * i], ev[2 * i + 1]));
    us[i] *= 1e3f;
  }
  for (auto& e : ev) cudaEventDestroy(e);
  return us;
}

double MedianMicros(const std::function<void(int)>& fn, cudaStream_t stream, int warmup,
                    int iters) {
  std::vector<float> us = RunMicros(fn, stream, warmup, iters);
  std::nth_element(us.begin(), us.begin() + iters / 2, us.end());
  return us[iters / 2];
}

int RotationCopies(size_t bytes) {
  int device = 0, l2 = 0;
  BENCH_CUDA(cudaGetDevice(&device));
  BENCH_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  return static_cast<int>(std::max<size_t>(1, (3 * static_cast<size_t>(l2) + bytes - 1) / bytes));
}

void FillUniformBf16(void* p, int64_t n, uint64_t seed, float lo, float hi) {
  FillBf16Kernel<<<1024, 256>>>(static_cast<__nv_bfloat16*>(p), n, seed, lo, hi);
  BENCH_CUDA(cudaGetLastError());
}
void FillUniformF32(float* p, int64_t n, uint64_t seed, float lo, float hi) {
  FillF32Kernel<<<1024, 256>>>(p, n, seed, lo, hi, false);
  BENCH_CUDA(cudaGetLastError());
}
void FillNormalF32(float* p, int64_t n, uint64_t seed, float stddev) {
  FillF32Kernel<<<1024, 256>>>(p, n, seed, 0, stddev, true);
  BENCH_CUDA(cudaGetLastError());
}

void FillPeakedF32(float* p, int64_t rows, int64_t vocab, uint64_t seed) {
  constexpr int kStrong = 40;
  FillNormalF32(p, rows * vocab, seed, 2.0f);
  AddPeaksKernel<<<(rows * kStrong + 255) / 256, 256>>>(p, rows, vocab, kStrong, seed + 7);
  BENCH_CUDA(cudaGetLastError());
}

void ReadOnce(const ReadShape& shape, const void* p, size_t bytes, uint32_t* sink) {
  const auto* v = static_cast<const uint4*>(p);
  const int64_t n = static_cast<int64_t>(bytes / 16);
  switch (shape.unroll) {
    case 1:
      ReadKernel<1><<<shape.blocks, shape.threads>>>(v, n, sink);
      break;
    case 4:
      ReadKernel<4><<<shape.blocks, shape.threads>>>(v, n, sink);
      break;
    default:
      ReadKernel<8><<<shape.blocks, shape.threads>>>(v, n, sink);
      break;
  }
  BENCH_CUDA(cudaGetLastError());
}

Ceilings MeasureCeilings() {
  Ceilings c;
  const size_t copy_bytes = size_t{2} << 30, read_bytes = size_t{4} << 30;
  void *src = nullptr, *dst = nullptr;
  uint32_t* sink = nullptr;
  BENCH_CUDA(cudaMalloc(&src, read_bytes));
  BENCH_CUDA(cudaMalloc(&dst, copy_bytes));
  BENCH_CUDA(cudaMalloc(&sink, 4096 * sizeof(uint32_t)));
  FillUniformF32(static_cast<float*>(src), read_bytes / 4, 1, -1, 1);
  double us = MedianMicros(
      [&](int) { BENCH_CUDA(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice)); },
      nullptr, 3, 10);
  c.copy_tbps = 2.0 * copy_bytes / us * 1e-6;
  // The read ceiling is the best of a few launch shapes (loads in flight per thread x blocks per
  // SM), each printed, so that no kernel is compared with a read kernel that leaves bandwidth
  // unused.
  for (const ReadShape shape : kReadShapes) {
    us = MedianMicros([&](int) { ReadOnce(shape, src, read_bytes, sink); }, nullptr, 3, 10);
    const double tbps = read_bytes / us * 1e-6;
    std::printf("ceiling.read candidate: %d loads in flight x %d blocks of %d: %.3f TB/s\n",
                shape.unroll, shape.blocks, shape.threads, tbps);
    if (tbps > c.read_tbps) c.read_tbps = tbps, c.read_shape = shape;
  }
  const int64_t n = 8192;
  BENCH_CUDA(cudaFree(dst));
  void *a = nullptr, *w = nullptr, *out = nullptr;
  BENCH_CUDA(cudaMalloc(&a, n * n * 2));
  BENCH_CUDA(cudaMalloc(&w, n * n * 2));
  BENCH_CUDA(cudaMalloc(&out, n * n * 2));
  FillUniformBf16(a, n * n, 2, -1, 1);
  FillUniformBf16(w, n * n, 3, -1, 1);
  GemmArgs args{.a = a, .w = w, .c = out, .m = n, .n = n, .k = n};
  us = MedianMicros([&](int) { CHECK_GEMM(GemmCublasLt(args, nullptr)); }, nullptr, 3, 10);
  c.bf16_gemm_tflops = 2.0 * n * n * n / us * 1e-6;
  cudaFree(a), cudaFree(w), cudaFree(out), cudaFree(src), cudaFree(sink);
  return c;
}

void SetJsonOutput(const std::string& path) { g_json = std::fopen(path.c_str(), "w"); }

void Report(const std::string& kernel, const std::string& shape, double micros,
            const std::string& unit, double achieved, double ceiling) {
  std::printf("%-28s %-34s %10.2f us %8.3f %-7s %6.1f%%\n", kernel.c_str(), shape.c_str(), micros,
              achieved, unit.c_str(), 100.0 * achieved / ceiling);
  if (g_json != nullptr) {
    std::fprintf(g_json,
                 "{\"kernel\":\"%s\",\"shape\":\"%s\",\"us\":%.3f,\"unit\":\"%s\","
                 "\"achieved\":%.4f,\"ceiling\":%.4f}\n",
                 kernel.c_str(), shape.c_str(), micros, unit.c_str(), achieved, ceiling);
    std::fflush(g_json);
  }
}

}  // namespace tandem::bench
