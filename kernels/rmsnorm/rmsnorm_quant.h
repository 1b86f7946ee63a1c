// RMSNorm fused with the FP8 W8A8 activation quantization of the GEMM that reads its output
// (kernels/quant_gemm/fp8_gemm_lt.h): one kernel that normalises each row (rmsnorm.h, with the
// optional residual add) and writes the row's e4m3 codes and fp32 scales straight into the
// cuBLASLt FP8 path's scratch (fp8_gemm_lt_layout.h: codes [round_up(m, 4), k], the scales per
// token or per token and 128-column group, the block modes' 4-row tail scales, pad rows zero
// codes with scale 1), where Fp8LtQuantizeActivations would otherwise have put them after
// reading the norm's bf16 output back. The bf16 output is written too when norm.out is set, and
// skipped when it is null (the GEMM is its only reader).
//
// What is quantized is the norm's bf16 output value, bf16(weight * bf16(x * inv_rms)), exactly
// as RmsNorm's fast kernel computes it (the same kernel body, the same sum-of-squares order), at
// Fp8LtQuantizeActivations' arithmetic (scale = amax / 448 by IEEE division, code = e4m3 of
// y / scale, round to nearest even, saturating; an all-zero row or group: scale 1, zero codes).
// So the codes and scales are bit-exact with RmsNorm followed by Fp8LtQuantizeActivations, and
// the FP8 GEMM after it gives the same bits with the fusion on and off.
//
// Covered (RmsNormQuantCovers, no device needed): bf16, hidden % 8 == 0 and hidden <= 8192 (the
// fast RMSNorm kernel's rows held in registers), contiguous rows (no strides), 16-byte aligned
// input / out / residual / weight, a 256-byte aligned scratch of at least Fp8LtLayout(...).bytes (n
// = 0: the codes and scales only), act_quant kFp8PerToken or kFp8PerTokenGroup with act_group_size
// 128. Anything else is InvalidArgument before any launch: the caller then runs RmsNorm and the FP8
// GEMM's own quantizer.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/common/stream.h"
#include "kernels/quant_gemm/quant_gemm.h"
#include "kernels/rmsnorm/rmsnorm.h"

namespace tandem {

struct RmsNormQuantArgs {
  RmsNormArgs norm;  // dtype kBF16; norm.out may be null (no bf16 output)
  ActQuant act_quant = ActQuant::kFp8PerToken;  // kFp8PerToken or kFp8PerTokenGroup
  int64_t act_group_size = 128;                 // kFp8PerTokenGroup: must be 128
  void* scratch = nullptr;                      // the FP8 GEMM's scratch (Fp8LtScratchBytes)
  int64_t scratch_bytes = 0;
};

// The scratch bytes the codes and scales of `rows` x `hidden` activations need.
int64_t RmsNormQuantScratchBytes(ActQuant act_quant, int64_t rows, int64_t hidden);

// OK when RmsNormQuant takes these args (host checks only: shapes, dtypes, alignment, scratch
// size), else InvalidArgument saying why.
absl::Status RmsNormQuantCovers(const RmsNormQuantArgs& args);

// CPU reference: RmsNormRef (norm.out, when set, gets the bf16 output; the quantizer reads the
// bf16 values either way), then the quantization into the scratch layout. The quantization half
// on its own: Fp8LtQuantizeRef (bf16 rows [m, k] -> codes and scales, pad rows included).
void RmsNormQuantRef(const RmsNormQuantArgs& args);
void Fp8LtQuantizeRef(ActQuant act_quant, const uint16_t* bf16, int64_t m, int64_t k,
                      void* scratch);

// CUDA (rmsnorm.cu): the fused kernel; RmsNormQuantCovers' refusals first, launching nothing.
absl::Status RmsNormQuant(const RmsNormQuantArgs& args, cudaStream_t stream);

}  // namespace tandem
