// The attention benchmark's pieces shared by its files (attention_bench.cc: the modes, prefill
// and RoPE; attention_bench_decode.cc: decode; attention_bench_util.cc: timing, inputs and the
// ceilings). Internal to kernels/bench.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>

#include "base/check.h"
#include "kernels/common/dtype.h"
#include "kernels/paged_attention/paged_attention.h"

#define CK(expr) CHECK((expr) == cudaSuccess) << cudaGetErrorString(cudaGetLastError())

namespace tandem {
#ifdef TANDEM_DECODE_TRACE
void DecodeTraceClear();  // paged_attention.cu, diagnostic builds only
void DecodeTracePrint(const char* label);
#endif
}  // namespace tandem

namespace tandem::attention_bench {

constexpr int kNq = 32, kNkv = 8, kD = 128;  // Llama-3-8B / Qwen3-8B attention shape
constexpr int64_t kRotateBytes = int64_t{256} << 20;

// Median over `reps` of (time of `inner` calls of fn) / inner, in microseconds.
double MedianUs(const std::function<void(int)>& fn, int inner, int reps,
                cudaStream_t stream = nullptr);
// Fills n bf16 with random values in [-1, 1).
void FillRandomBf16(void* dev, int64_t n, uint32_t seed);
double CopyTbs();     // device-to-device copy, TB/s (read + write)
double GemmTflops();  // cuBLAS bf16 GEMM 8192^3, TFLOP/s

// Decode: batch of `batch` sequences of `len` keys, one new token each. kv_dtype kF8E4M3: an fp8
// cache (codes + per-token scales) read by the fp8 decode kernel `fp8_kernel`; TBps then counts
// the fp8 page bytes read (codes + scales). num_q_heads: kNq (GQA group 4) or 64 (group 8), over
// kNkv KV heads.
void BenchDecode(int batch, int len, int page_size, double copy_tbs, AttentionPlan& plan,
                 DType kv_dtype = DType::kBF16,
                 Fp8DecodeKernel fp8_kernel = Fp8DecodeKernel::kDefault, int num_q_heads = kNq);
// Decode through the prefill kernel (input for [decode-tc]); attention_bench_decode.cc.
void BenchDecodeAsPrefill(int batch, int len, int page_size, AttentionPlan& plan);

}  // namespace tandem::attention_bench
