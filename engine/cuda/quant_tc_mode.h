// The CUDA backend's switch for the mixed-input tensor-core GEMM of INT8 / UINT4 weights
// (QuantGemmTc, kernels/quant_gemm/quant_gemm_tc.cu), and the one place that decides when a
// quantized GEMM uses it. Plain C++ (no CUDA): the CPU build carries it too, so its logic is tested
// without a device.
//
// With it on, a step of kQuantSkinnyMaxM < m <= kQuantTcMaxM tokens through an INT8 or UINT4
// weight-only weight that QuantGemmTcCovers accepts runs QuantGemmTc (codes read once, dequantized
// in registers into the mma operands) instead of QuantDequantize into the bf16 scratch + the
// dense GEMM. The numbers differ only in fp32 summation order.
//
// TANDEM_QUANT_TC_SMALL_M=1 extends it to steps of 1..kQuantSkinnyMaxM tokens (batch-1 decode),
// instead of the CUDA-core skinny kernel (QuantGemmSkinny; WORKLOG.md step 8). Off by default:
// measured slower at batch 1.
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

// Off by default: at m = 1 the tensor-core kernel is slower than the skinny kernel on every 8B
// shape, and batch-1 decode with it is 4-12% slower (H100, WORKLOG.md step 8).
inline constexpr bool kQuantTcSmallMDefault = false;

// TANDEM_QUANT_TC_SMALL_M's value (null: unset): "0" off, "1" on; anything else is
// InvalidArgument.
inline absl::StatusOr<bool> ParseQuantTcSmallM(const char* value) {
  if (value == nullptr) return kQuantTcSmallMDefault;
  const std::string_view v(value);
  if (v == "0") return false;
  if (v == "1") return true;
  return absl::InvalidArgumentError(
      absl::StrCat("TANDEM_QUANT_TC_SMALL_M=", value, ": expected 0 or 1"));
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

// Whether a weight-only quantized GEMM of m rows in `code` is one the switch applies to: not off,
// INT8 / UINT4 codes, and m within the tensor-core kernel's range: above the skinny kernel's, or
// from 1 with small_m (TANDEM_QUANT_TC_SMALL_M).
inline bool QuantTcApplies(QuantTc mode, bool small_m, QuantCode code, int64_t m) {
  return mode != QuantTc::kOff && (code == QuantCode::kInt8 || code == QuantCode::kUint4) &&
         m >= (small_m ? 1 : kQuantSkinnyMaxM + 1) && m <= kQuantTcMaxM;
}

}  // namespace tandem
