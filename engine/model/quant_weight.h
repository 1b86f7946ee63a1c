// QuantizedWeight: a linear layer's weight in the canonical quantized layout of
// kernels/quant_gemm/quant_gemm.h (codes [n, row bytes], fp32 scales and uint4 zero points
// [n, num_groups]), with the activation quantization its GEMM applies. Every checkpoint format
// is converted to it (quant_checkpoint.h), and load-time quantization produces it from float
// weights (QuantizeWeight). Thread-compatible value type.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/quant_gemm/quant_gemm.h"

namespace tandem {

struct QuantizedWeight {
  QuantCode code = QuantCode::kInt8;
  int64_t n = 0;
  int64_t k = 0;
  int64_t group_size = 0;
  std::vector<uint8_t> codes;  // [n, QuantRowBytes(code, k)]
  std::vector<float> scales;   // [n, num_groups]
  std::vector<uint8_t> zeros;  // kUint4: [n, num_groups]; empty: symmetric (8)
  ActQuant act_quant = ActQuant::kNone;
  int64_t act_group_size = 128;

  int64_t num_groups() const { return QuantNumGroups(k, group_size); }
  // The GEMM arguments for this weight (a, c, m, bias, dtypes and accumulate left to the caller).
  QuantGemmArgs Args() const;
  std::vector<float> Dequantize() const;  // [n, k] fp32
};

// Load-time quantization (--quantization), from fp32 weights w [n, k]:
//   kFp8E4M3: per-output-channel scale max|w_j| / 448, e4m3 codes; activations per token;
//   kInt8:    per-output-channel symmetric, scale max|w_j| / 127, codes round(w / s) (W8A16);
//   kUint4:   asymmetric groups of group_size along k (the last one may be partial):
//             s = (max - min) / 15, zero = round(-min / s) in 0..15, codes round(w / s) + zero
//             clamped to 0..15 (AWQ's quantizer; W4A16).
// `row_amax` (8-bit codes; null: each row's own): max |w_j| of row j of a wider weight that w
// is a column slice of, so the slice is quantized exactly as the same columns of the whole
// weight (a row-parallel rank's part, quant_shard.h). uint4 groups need none: a slice starting
// on a group boundary has the whole weight's groups.
QuantizedWeight QuantizeWeight(const float* w, int64_t n, int64_t k, QuantCode code,
                               int64_t group_size, const float* row_amax = nullptr);

// Rows of `parts` one after the other (q, k, v -> qkv_proj). InvalidArgument when they differ
// in code, k, group size or activation quantization (naming `what`).
absl::StatusOr<QuantizedWeight> ConcatRows(std::vector<QuantizedWeight> parts,
                                           const std::string& what);

}  // namespace tandem
