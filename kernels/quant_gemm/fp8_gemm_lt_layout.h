// The scratch layout shared by the two halves of the cuBLASLt FP8 path (fp8_gemm_lt.h):
// fp8_gemm_lt.cu writes the activations' codes and scales and reads the tail's fp32 output,
// fp8_gemm_lt_cuda.cc points cuBLASLt at them. Internal to kernels/quant_gemm.
#pragma once

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/common/dtype.h"
#include "kernels/common/stream.h"

namespace tandem {

struct Fp8LtScratchLayout {
  bool block = false;      // 128-element block scales (kFp8PerTokenGroup), else outer vectors
  int64_t rows = 0;        // rows of codes: round_up(m, 4), the pad rows zero
  int64_t main_rows = 0;   // rows of the GEMM straight into c: m - m % 4 in block mode, else m
  int64_t tail_start = 0;  // m - m % 4: the first row the 4-row tail GEMM covers
  bool tail = false;       // block mode with m % 4 != 0: rows [tail_start, m) via the tail GEMM
  int64_t groups = 1;      // L = ceil(k / 128) in block mode
  // Byte offsets into the scratch, each region 256-byte aligned:
  int64_t codes = 0;        // [rows, k] e4m3
  int64_t scales = 0;       // outer: [rows] fp32 (pad rows 1); block: [groups][main_rows]
  int64_t tail_scales = 0;  // [groups][4]: rows tail_start .. tail_start + 3 (pad rows 1)
  int64_t tail_out = 0;     // [4, n] fp32 (the tail GEMM's D)
  int64_t bytes = 0;
};

inline constexpr int64_t kFp8LtTailRows = 4;

// The outer-vector layout fills the tail's scales too, so that a call can take the tail split
// when cuBLASLt refuses m % 4 != 0 there as well (the rows' vector prefix serves the main GEMM).
inline Fp8LtScratchLayout Fp8LtLayout(bool block, int64_t m, int64_t k, int64_t n) {
  auto align = [](int64_t x) { return (x + 255) / 256 * 256; };
  Fp8LtScratchLayout l;
  l.block = block;
  l.rows = (m + kFp8LtTailRows - 1) / kFp8LtTailRows * kFp8LtTailRows;
  l.tail_start = m - m % kFp8LtTailRows;
  l.main_rows = block ? l.tail_start : m;
  l.tail = block && m % kFp8LtTailRows != 0;
  l.groups = block ? (k + 127) / 128 : 1;
  l.codes = 0;
  l.scales = align(l.codes + l.rows * k);
  l.tail_scales =
      align(l.scales + 4 * std::max<int64_t>(block ? l.groups * l.main_rows : l.rows, 1));
  l.tail_out = align(l.tail_scales + 4 * l.groups * kFp8LtTailRows);
  l.bytes = align(l.tail_out + 4 * kFp8LtTailRows * n);
  return l;
}

// fp8_gemm_lt.cu: the tail rows' fp32 GEMM output [4, n] (rows [tail_start, m) are its first
// m - tail_start rows) plus bias, plus c when accumulating, rounded once into c (bf16).
absl::Status Fp8LtAddTail(const float* tail, const void* bias, void* c, int64_t n,
                          int64_t tail_start, int64_t m, bool accumulate, cudaStream_t stream);

}  // namespace tandem
