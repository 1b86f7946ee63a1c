// The CUDA backend's switch for the RMSNorm fused with the FP8 activation quantization
// (kernels/rmsnorm/rmsnorm_quant.h), and the one place that decides when a step uses it. Plain
// C++ (no CUDA): the CPU build carries it too, so its logic is tested without a device.
//
// With it on, a step of more than kQuantSkinnyMaxM tokens on a model with FP8 W8A8 weights the
// cuBLASLt FP8 path serves has the norms before QKV and gate-up run inside those GEMMs
// (Ops::FusesNormIntoGemm, GemmArgs::a_norm_weight): the GEMM call runs one kernel that
// normalises the residual stream and writes the e4m3 codes and scales straight into the FP8
// GEMM's scratch, then the cuBLASLt matmul. The codes are produced and consumed inside that one
// Gemm() call, so no GEMM can see codes of other (or older) activations; the bf16 normed copy is
// never written. Codes and scales are bit-exact with the unfused RmsNorm + quantizer, so logits
// are bitwise the same either way. A GEMM given the norm that the fused kernel cannot take (a
// weight without the cuBLASLt FP8 path, a refusal, a shape RmsNormQuantCovers refuses) runs the
// norm into the activation scratch first and then its usual path: the same numbers, one launch
// more.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/quant_gemm/quant_gemm.h"

namespace tandem {

enum class FusedActQuant : uint8_t {
  kOff,      // the norm is its own kernel, the FP8 GEMM quantizes its input (two launches)
  kOn,       // fused where it applies, the unfused path where it does not
  kRequire,  // fused, and a GEMM given the norm that cannot take the fused kernel is an error
             // (tests: proves the fused kernel ran)
};

// The default while it has not been measured faster end to end (kernels/rmsnorm/WORKLOG.md).
inline constexpr FusedActQuant kFusedActQuantDefault = FusedActQuant::kOff;

// TANDEM_FUSED_ACT_QUANT's value (null: unset): "0" off, "1" on, "require"; anything else is
// InvalidArgument (a typo must not silently measure the other side of an A/B).
inline absl::StatusOr<FusedActQuant> ParseFusedActQuant(const char* value) {
  if (value == nullptr) return kFusedActQuantDefault;
  const std::string_view v(value);
  if (v == "0") return FusedActQuant::kOff;
  if (v == "1") return FusedActQuant::kOn;
  if (v == "require") return FusedActQuant::kRequire;
  return absl::InvalidArgumentError(
      absl::StrCat("TANDEM_FUSED_ACT_QUANT=", value, ": expected 0, 1 or require"));
}

// Whether a step of `rows` tokens runs the norms inside the GEMMs for the FP8 fusion: on, the
// backend has weights on the cuBLASLt FP8 path and the activation scratch a fallback norm needs,
// and the step is larger than the skinny kernel's (which runs on pre-rounded bf16 activations
// and keeps its own norm).
inline bool FusesNormForFp8Activations(FusedActQuant mode, bool has_fp8_lt_weights,
                                       bool has_act_scratch, int64_t rows) {
  return mode != FusedActQuant::kOff && has_fp8_lt_weights && has_act_scratch &&
         rows > kQuantSkinnyMaxM;
}

}  // namespace tandem
