// The CUDA backend's switch for the mixed-input tensor-core GEMM of INT8 / UINT4 weights
// (QuantGemmTc, kernels/quant_gemm/quant_gemm_tc.cu), and the one place that decides when a
// quantized GEMM uses it. Plain C++ (no CUDA): the CPU build carries it too, so its logic is tested
// without a device.
//
// With it on, a step of kQuantTcMinMDefault (2) to kQuantTcMaxM tokens through an INT8 or UINT4
// weight-only weight that QuantGemmTcCovers accepts runs QuantGemmTc (codes read once, dequantized
// in registers into the mma operands) instead of the CUDA-core skinny kernel (QuantGemmSkinny, up
// to kQuantSkinnyMaxM tokens) or QuantDequantize into the bf16 scratch + the dense GEMM. The
// numbers differ only in fp32 summation order. TANDEM_QUANT_TC_MIN_M moves the lower end (1: batch
// 1 too; 5: the skinny kernel up to its maximum, as before session 31).
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/quant_gemm/quant_gemm.h"

namespace tandem {

enum class QuantTc : uint8_t {
  kOff,      // dequantize + dense GEMM for every step above the skinny kernel (the A/B's old side)
  kOn,       // QuantGemmTc where it covers the step, the dequantize path where it does not
  kRequire,  // QuantGemmTc, and an INT8 / UINT4 step in its m range that it does not cover is an
             // error (tests: proves the kernel ran)
};

// On by default: the dequantize path it replaces writes and re-reads 2 bytes per weight on every
// step (kernels/quant_gemm/WORKLOG.md step 7; its speed is a prediction until the lead's GPU run).
inline constexpr QuantTc kQuantTcDefault = QuantTc::kOn;

// TANDEM_QUANT_TC's value (null: unset): "0" off, "1" on, "require"; anything else is
// InvalidArgument (a typo must not silently measure the other side of an A/B).
inline absl::StatusOr<QuantTc> ParseQuantTc(const char* value) {
  if (value == nullptr) return kQuantTcDefault;
  const std::string_view v(value);
  if (v == "0") return QuantTc::kOff;
  if (v == "1") return QuantTc::kOn;
  if (v == "require") return QuantTc::kRequire;
  return absl::InvalidArgumentError(
      absl::StrCat("TANDEM_QUANT_TC=", value, ": expected 0, 1 or require"));
}

// The fewest tokens a step needs to take QuantGemmTc by default. At m = 1 the skinny kernel is
// faster on every 8B shape (batch-1 decode 4-12% faster, WORKLOG.md step 8); from m = 2 its m fp32
// FMAs per weight make it slower than QuantGemmTc, 1.5-2.9x at m = 4 (WORKLOG.md step 10).
inline constexpr int64_t kQuantTcMinMDefault = 2;

// TANDEM_QUANT_TC_MIN_M's value (null: unset, the default): an integer 1 .. kQuantSkinnyMaxM + 1
// (above that every step of the skinny kernel's range would fall to the dequantize path);
// anything else is InvalidArgument.
inline absl::StatusOr<int64_t> ParseQuantTcMinM(const char* value) {
  if (value == nullptr) return kQuantTcMinMDefault;
  const std::string_view v(value);
  for (int64_t m = 1; m <= kQuantSkinnyMaxM + 1; ++m) {
    if (v == absl::StrCat(m)) return m;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("TANDEM_QUANT_TC_MIN_M=", value, ": expected 1 to ", kQuantSkinnyMaxM + 1));
}

// TANDEM_QUANT_TC_SPLIT's value (null: unset): "1" (and unset) QuantGemmTc's automatic split-K
// plan (kernels/quant_gemm/quant_gemm_tc_split.h), "0" never split (the A/B of WORKLOG.md step
// 8); anything else is InvalidArgument. Returns QuantGemmArgs::tc_splits: 0 automatic, 1 unsplit.
inline absl::StatusOr<int> ParseQuantTcSplit(const char* value) {
  if (value == nullptr) return 0;
  const std::string_view v(value);
  if (v == "1") return 0;
  if (v == "0") return 1;
  return absl::InvalidArgumentError(
      absl::StrCat("TANDEM_QUANT_TC_SPLIT=", value, ": expected 0 or 1"));
}

// The tensor-core GEMV (QuantGemv, kernels/quant_gemm/quant_gemv.cu) for INT8 / UINT4 decode
// steps of 1..kQuantGemvMaxM tokens, ahead of both the skinny kernel and QuantGemmTc where it
// covers the step, with TANDEM_QUANT_GEMV=1. Off by default: measured slower than both on the
// row-major codes CudaOps holds (WORKLOG.md step 10); it does not depend on TANDEM_QUANT_TC.
inline constexpr bool kQuantGemvDefault = false;

// TANDEM_QUANT_GEMV's value (null: unset): "0" off, "1" on; anything else is InvalidArgument.
inline absl::StatusOr<bool> ParseQuantGemv(const char* value) {
  if (value == nullptr) return kQuantGemvDefault;
  const std::string_view v(value);
  if (v == "0") return false;
  if (v == "1") return true;
  return absl::InvalidArgumentError(absl::StrCat("TANDEM_QUANT_GEMV=", value, ": expected 0 or 1"));
}

// Whether an INT8 / UINT4 weight-only step of m rows is the GEMV's (with the switch on).
inline bool QuantGemvApplies(bool on, QuantCode code, int64_t m) {
  return on && (code == QuantCode::kInt8 || code == QuantCode::kUint4) && m >= 1 &&
         m <= kQuantGemvMaxM;
}

// Whether a weight-only quantized GEMM of m rows in `code` is one the switch applies to: not off,
// INT8 / UINT4 codes, and min_m <= m <= kQuantTcMaxM (min_m: TANDEM_QUANT_TC_MIN_M).
inline bool QuantTcApplies(QuantTc mode, int64_t min_m, QuantCode code, int64_t m) {
  return mode != QuantTc::kOff && (code == QuantCode::kInt8 || code == QuantCode::kUint4) &&
         m >= min_m && m <= kQuantTcMaxM;
}

}  // namespace tandem
