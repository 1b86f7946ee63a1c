// The FP8 W8A8 path's host-side format checks and weight-scale packing (fp8_gemm_lt.h:
// Fp8LtCovers, Fp8LtPackWeightScales); the cuBLASLt plans and matmuls are fp8_gemm_lt_cuda.cc.
#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/quant_gemm/fp8_gemm_lt.h"

namespace tandem {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Whether each 128-column block of k lies inside one weight group (so one scale per row and
// block exists): groups of a multiple of 128 columns, or one group for the whole row.
bool GroupsAlignWithBlocks(const QuantGemmArgs& a) {
  return a.group_size >= a.k || a.group_size % kFp8LtBlock == 0;
}

// The weight's scale for row j and 128-column block b (args.scales on the host).
float ScaleAt(const QuantGemmArgs& a, int64_t j, int64_t b) {
  const int64_t groups = QuantNumGroups(a.k, a.group_size);
  return a.scales[j * groups + b * kFp8LtBlock / a.group_size];
}

}  // namespace

absl::Status Fp8LtCovers(const QuantGemmArgs& a) {
  if (a.code != QuantCode::kFp8E4M3 || a.zeros != nullptr) {
    return absl::InvalidArgumentError("Fp8GemmLt: FP8 e4m3 weights only (no zero points)");
  }
  if (a.act_quant == ActQuant::kNone) {
    return absl::InvalidArgumentError("Fp8GemmLt: W8A8 only (act_quant kNone is weight-only)");
  }
  if (a.n < 1 || a.k < 1 || a.n % 16 != 0 || a.k % 16 != 0 || a.m < 0 || a.group_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("Fp8GemmLt: needs n % 16 == 0 and k % 16 == 0 (FP8 tensor cores); got m=", a.m,
                     " n=", a.n, " k=", a.k, " group_size=", a.group_size));
  }
  if ((a.a_dtype != DType::kBF16 && a.a_dtype != DType::kF32) || a.c_dtype != DType::kBF16) {
    return absl::InvalidArgumentError("Fp8GemmLt: a must be bf16 or f32, c (and bias) bf16");
  }
  // beta = 1 with the bias epilogue would round a · wᵀ + bias before adding c
  // (kernels/gemm/gemm_lt_cuda.cc measured that for bf16): GemmArgs::accumulate's contract.
  if (a.accumulate && a.bias != nullptr) {
    return absl::InvalidArgumentError("Fp8GemmLt: accumulate with a bias is not supported");
  }
  if (a.act_quant == ActQuant::kFp8PerToken) {
    if (a.group_size < a.k) {
      return absl::UnimplementedError(absl::StrCat(
          "Fp8GemmLt: per-token activations need per-channel weight scales; group_size ",
          a.group_size, " < k ", a.k));
    }
    return absl::OkStatus();
  }
  if (a.act_group_size != kFp8LtBlock) {
    return absl::UnimplementedError(absl::StrCat(
        "Fp8GemmLt: per-token-group activations need act_group_size 128 (cuBLASLt's VEC128); got ",
        a.act_group_size));
  }
  if (!GroupsAlignWithBlocks(a)) {
    return absl::UnimplementedError(
        absl::StrCat("Fp8GemmLt: weight groups of ", a.group_size, " split the 128-column blocks"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Fp8LtPackedScales> Fp8LtPackWeightScales(const QuantGemmArgs& args) {
  QuantGemmArgs a = args;
  a.m = 0;
  a.a = nullptr;
  a.c = nullptr;
  a.bias = nullptr;
  a.accumulate = false;
  a.a_dtype = DType::kBF16;
  a.c_dtype = DType::kBF16;
  RETURN_IF_ERROR(Fp8LtCovers(a));
  if (a.scales == nullptr) return absl::InvalidArgumentError("Fp8LtPackWeightScales: no scales");
  Fp8LtPackedScales out;
  if (a.act_quant == ActQuant::kFp8PerToken) {
    out.mode = Fp8LtWeightScales::kPerChannel;
    out.scales.assign(a.scales, a.scales + a.n);  // one group per row
    return out;
  }
  const int64_t blocks = CeilDiv(a.k, kFp8LtBlock);
  const int64_t row_blocks = CeilDiv(a.n, kFp8LtBlock);
  bool uniform = true;
  for (int64_t j = 0; j < a.n && uniform; ++j) {
    const int64_t j0 = j / kFp8LtBlock * kFp8LtBlock;
    for (int64_t b = 0; b < blocks && uniform; ++b) {
      const float s = ScaleAt(a, j, b), s0 = ScaleAt(a, j0, b);
      uniform = std::memcmp(&s, &s0, sizeof(float)) == 0;
    }
  }
  if (uniform) {
    out.mode = Fp8LtWeightScales::kBlock128x128;
    const int64_t ld = CeilDiv(blocks, 4) * 4;  // L4: columns 16-byte apart
    out.scales.assign(row_blocks * ld, 0.0f);
    for (int64_t p = 0; p < row_blocks; ++p) {
      for (int64_t b = 0; b < blocks; ++b) out.scales[p * ld + b] = ScaleAt(a, p * kFp8LtBlock, b);
    }
    return out;
  }
  out.mode = Fp8LtWeightScales::kRow128;
  out.scales.resize(blocks * a.n);
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t j = 0; j < a.n; ++j) out.scales[b * a.n + j] = ScaleAt(a, j, b);
  }
  return out;
}

}  // namespace tandem
