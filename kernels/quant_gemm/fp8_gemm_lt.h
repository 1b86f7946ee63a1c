// FP8 W8A8 linear layer for large m through cuBLASLt's scaled FP8 GEMM (Hopper, cuBLAS 12.9+):
// the activations are quantized to real e4m3 bytes with dynamic scales, then one cuBLASLt
// matmul multiplies them with the e4m3 weight codes as stored (quant_gemm.h's [n, k] layout) on
// FP8 tensor cores and applies both sides' scales in its epilogue, writing bf16:
//
//   c[i, j] = sum_b sa(i, b) * sw(j, b) * sum_{kk in block b} qa(i, kk) * qw(j, kk) (+ bias[j])
//
// which is QuantGemmRef's value (the same e4m3 rounding of a as QuantizeActivationRow, the same
// dequantized weights) up to fp32 summation order and the FP8 tensor cores' accumulation.
//
// Scale layouts (cuBLASLt's "A" is the weight, [k, n] column-major transposed; "B" the
// activations, [k, m] column-major; D = c, [n, m] column-major = c[m, n] row-major):
//   per-channel weights (group_size == k) + per-token activations (ActQuant::kFp8PerToken):
//     CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F on both: sw [n], sa [m];
//   group weights (group_size a multiple of 128, or >= k) + per-token-group activations
//   (kFp8PerTokenGroup, act_group_size 128): 128-element block scaling. The activations'
//     scales are CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, [L][m] (m-major), L = ceil(k / 128);
//     the weight's are BLK128x128_32F, [ceil(n / 128)][L4] (k-major, L4 = L rounded up to 4),
//     when every 128-row block of the weight has one scale per 128 columns (DeepSeek / Qwen3-FP8
//     128x128 blocks), else VEC128_32F per row, [L][n] (n-major; fused q/k/v rows whose blocks do
//     not line up with 128 rows, or 64-row blocks).
//   The block modes need m % 4 == 0 (cuBLASLt's rule for those scale layouts): other m run the
//   first m - m % 4 rows straight into c and the last rows as a second 4-row GEMM (padded with
//   zero rows) into an fp32 scratch, which a small kernel adds into c (bias and accumulate
//   applied there, one rounding), at the cost of reading the weight once more. The outer-vector
//   layout has no such documented rule (any m); should cuBLASLt refuse m % 4 != 0 there too,
//   the call takes the same split (the scratch always holds the tail's codes and scales).
// Requirements (FP8 tensor cores' 16-byte rule): n % 16 == 0, k % 16 == 0, w, a, c and bias
// 16-byte aligned, a kBF16 or kF32, c kBF16, bias kBF16; accumulate (beta = 1, c read as the C
// matrix) without a bias. Anything else is InvalidArgument or Unimplemented before any launch
// (Fp8LtCovers checks the format and shape without a device), and a configuration cuBLASLt has
// no algorithm for is Unimplemented too: the caller then takes the dequantize + bf16 GEMM path.
//
// Thread-safe: the per-device cuBLASLt handle, workspace and plan cache (descriptors and the
// algorithm per shape and scale mode, or the refusal) are guarded by one mutex per device. A
// plan's algorithm is the heuristic's first, or with TANDEM_LT_AUTOTUNE=1 the fastest of its
// candidates and of the extra configurations cuBLASLt accepts (split-k, tiles, stages, swizzle;
// TANDEM_LT_AUTOTUNE_EXTRA=0 leaves them out), timed on the plan's first call into scratch outputs
// (kernels/common/cublaslt_autotune.h): that call allocates and synchronises, outside graph
// capture (under capture the plan takes the heuristic's first untimed). A steady-state call
// allocates nothing and does not synchronise, so it can be captured into a CUDA graph once
// Fp8LtInitDevice() has run for the device. With TANDEM_FP8_SPLITK=S, qualifying per-channel
// calls (decode batches above 64 rows, n <= 8192) take our own split-k instead
// (fp8_gemm_lt_split.h), capturable once the stream has made one such call eagerly.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/common/stream.h"
#include "kernels/quant_gemm/quant_gemm.h"

namespace tandem {

// The block modes' granularity along k (and along n for the 128x128 weight blocks).
inline constexpr int64_t kFp8LtBlock = 128;
// The cuBLASLt workspace allocated per device (as kernels/gemm's cuBLASLt path: 32 MiB).
inline constexpr int64_t kFp8LtWorkspaceBytes = int64_t{32} << 20;

enum class Fp8LtWeightScales : uint8_t {
  kPerChannel,    // OUTER_VEC_32F: [n]
  kBlock128x128,  // BLK128x128_32F: [ceil(n / 128)][L4], k-major, padding 0
  kRow128,        // VEC128_32F: [L][n], n-major
};

// A weight as the cuBLASLt FP8 path reads it (device pointers).
struct Fp8LtWeight {
  const uint8_t* w = nullptr;     // [n, k] e4m3 codes (QuantGemmArgs::w), 16-byte aligned
  const float* scales = nullptr;  // in `mode`'s layout (Fp8LtPackWeightScales), 16-byte aligned
  int64_t n = 0;
  int64_t k = 0;
  Fp8LtWeightScales mode = Fp8LtWeightScales::kPerChannel;
};

// Whether this path covers a quantized GEMM's format and shape (code, groups, activation
// quantization, n, k, dtypes, bias with accumulate); pointers are not looked at. OK, or
// InvalidArgument (not FP8 W8A8, or a shape / dtype it cannot take) or Unimplemented (an FP8
// scale layout it does not map: per-token activations with group weights, act_group_size other
// than 128, weight groups that split a 128-column block).
absl::Status Fp8LtCovers(const QuantGemmArgs& args);

struct Fp8LtPackedScales {
  Fp8LtWeightScales mode = Fp8LtWeightScales::kPerChannel;
  std::vector<float> scales;  // upload as Fp8LtWeight::scales
};
// Host: the weight's scales (args.scales on the host, quant_gemm.h's [n, num_groups]) in the
// layout cuBLASLt reads, and which one: kBlock128x128 when the scales are bitwise equal across
// each 128-row block, kRow128 otherwise. Fp8LtCovers' refusals for the weight's fields.
absl::StatusOr<Fp8LtPackedScales> Fp8LtPackWeightScales(const QuantGemmArgs& args);

// Device scratch for one call of m rows (e4m3 codes [round_up(m, 4), k], the activation scales,
// and for the block modes the 4-row tail's scales and fp32 output [4, n]); a scratch sized for
// (max_m, max_k, max_n) serves every smaller call. 256-byte aligned regions.
int64_t Fp8LtScratchBytes(int64_t m, int64_t k, int64_t n);

// Creates the current device's cuBLASLt handle and workspace. Fp8GemmLt does this lazily; call
// it before capturing a CUDA graph (allocation is not allowed during capture).
absl::Status Fp8LtInitDevice();

// The two stages of Fp8GemmLt, exposed for the benchmark (which times them apart):
//   Fp8LtQuantizeActivations: args.a [m, k] (a_dtype) -> e4m3 codes and scales in `scratch`,
//     at QuantizeActivationRow's scales (args.act_quant, act_group_size); pad rows zero;
//   Fp8LtMatmul: the cuBLASLt GEMM(s) on them (and the tail kernel) into args.c.
absl::Status Fp8LtQuantizeActivations(const QuantGemmArgs& args, void* scratch,
                                      int64_t scratch_bytes, cudaStream_t stream);
absl::Status Fp8LtMatmul(const QuantGemmArgs& args, const Fp8LtWeight& w, void* scratch,
                         int64_t scratch_bytes, cudaStream_t stream);

// c = a · dequant(w)ᵀ (+ bias), or c += with args.accumulate: the plan is looked up first (an
// Unimplemented refusal launches nothing), then both stages. args gives a, bias, c, m, n, k,
// dtypes, accumulate and act_quant / act_group_size (and the format fields Fp8LtCovers checks);
// the codes and scales come from `w`.
absl::Status Fp8GemmLt(const QuantGemmArgs& args, const Fp8LtWeight& w, void* scratch,
                       int64_t scratch_bytes, cudaStream_t stream);
// Fp8GemmLt with the activations' quantization done by `quantize` instead of
// Fp8LtQuantizeActivations: called once the plans are found (an Unimplemented refusal calls
// nothing and launches nothing), it must enqueue on `stream` what fills the scratch's codes and
// scales for args.m rows of args.k in this call's layout (fp8_gemm_lt_layout.h), pad rows
// included; the matmuls follow. args.a is not read (but still checked for alignment): the fused
// RMSNorm + quantization of kernels/rmsnorm/rmsnorm_quant.h writes the scratch from the norm's
// input.
absl::Status Fp8GemmLtWith(const QuantGemmArgs& args, const Fp8LtWeight& w, void* scratch,
                           int64_t scratch_bytes, cudaStream_t stream,
                           absl::FunctionRef<absl::Status()> quantize);

}  // namespace tandem
