// Timing harness for the kernel benchmarks (shared by every kernel's benchmark program):
// CUDA-event medians after warm-up, input rotation beyond L2, and the two ceilings measured in
// the same run — device-to-device copy bandwidth and cuBLAS bf16 GEMM throughput.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace tandem::bench {

// Aborts the benchmark with file:line on a CUDA error (a benchmark has no caller to report to).
#define BENCH_CUDA(expr)                                                                          \
  do {                                                                                            \
    const cudaError_t _e = (expr);                                                                \
    if (_e != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(_e)); \
      std::abort();                                                                               \
    }                                                                                             \
  } while (0)

// Median time in microseconds of fn(iteration) over `iters` runs after `warmup` runs, each run
// bracketed by its own pair of events on `stream`. fn should rotate its inputs by iteration.
double MedianMicros(const std::function<void(int)>& fn, cudaStream_t stream, int warmup = 5,
                    int iters = 30);
// The same runs' times in microseconds, in run order.
std::vector<float> RunMicros(const std::function<void(int)>& fn, cudaStream_t stream, int warmup,
                             int iters);

// How many copies of a buffer of `bytes` to rotate through so that the working set is at least
// three times the L2 cache.
int RotationCopies(size_t bytes);

// Device buffers of random data (never zeros): uniform in [lo, hi), from a counter-based hash.
void FillUniformBf16(void* p, int64_t n, uint64_t seed, float lo, float hi);
void FillUniformF32(float* p, int64_t n, uint64_t seed, float lo, float hi);
// Approximately normal (sum of 4 uniforms), mean 0 and standard deviation `stddev`.
void FillNormalF32(float* p, int64_t n, uint64_t seed, float stddev);
// rows x vocab LLM-like logits: N(0, 2^2), and 40 logits per row raised by 8 to 16.
void FillPeakedF32(float* p, int64_t rows, int64_t vocab, uint64_t seed);

// A launch shape of the read-only stream kernel: 16-byte loads in flight per thread (1, 4 or 8)
// and the grid.
struct ReadShape {
  int unroll = 1;
  int blocks = 132 * 16;
  int threads = 512;
};
inline constexpr ReadShape kReadShapes[] = {
    {1, 132 * 16, 512}, {4, 132 * 16, 512}, {8, 132 * 8, 512}, {4, 132 * 4, 1024}};

// Reads `bytes` (a multiple of 16) at p once with the read-only stream kernel (on the default
// stream); sink: a device word per block, written only so the loads cannot be dropped.
void ReadOnce(const ReadShape& shape, const void* p, size_t bytes, uint32_t* sink);

struct Ceilings {
  double copy_tbps = 0;         // (read + write bytes) / time, 2 GiB device-to-device copy
  double read_tbps = 0;         // read-only 16-byte stream over 4 GiB, best of kReadShapes
  ReadShape read_shape;         // the shape that reached read_tbps
  double bf16_gemm_tflops = 0;  // cuBLASLt bf16 8192^3
};
Ceilings MeasureCeilings();

// One result line: printed as a table row and appended to a JSON-lines file when one is set.
void SetJsonOutput(const std::string& path);
void Report(const std::string& kernel, const std::string& shape, double micros,
            const std::string& unit, double achieved, double ceiling);

}  // namespace tandem::bench
