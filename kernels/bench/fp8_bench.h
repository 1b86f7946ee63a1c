// kb_bench's "fp8" section (fp8_bench.cc): the large-m FP8 W8A8 GEMM paths on the Llama-3-8B
// layer shapes (QKV 4096 -> 6144, O 4096 -> 4096, gate-up 4096 -> 28672, down 14336 -> 4096) at
// M = 1 .. 8192, both FP8 checkpoint layouts: the cuBLASLt FP8 GEMM (Fp8LtMatmul), its
// activation quantization (Fp8LtQuantizeActivations) and the two together (Fp8GemmLt), beside
// the dequantize + bf16 path the CUDA backend took before (QuantizeActivations, QuantDequantize,
// Gemm) and cuBLASLt bf16 on a bf16 weight of the shape. TFLOP/s of 2 m n k against the bf16
// ceiling measured in the same run. peer_fp8.py times torch._scaled_mm under the same names.
#pragma once

#include "kernels/bench/bench_util.h"

namespace tandem::bench {

void BenchFp8Gemm(const Ceilings& c);

// kb_bench's "fp8norm" section (not in "all"): the norm in front of QKV (4096 -> 6144) and
// gate-up (4096 -> 28672) at M = 8 .. 8192, both layouts: RmsNorm then Fp8GemmLt (the norm's bf16
// output quantized by the GEMM: fp8norm.<layout>.unfused_gemm) against RmsNormQuant writing the
// codes straight into the GEMM's scratch, then the matmul (Fp8GemmLtWith: .fused_gemm); and the
// activation side alone (.norm_then_quant, .norm_quant_fused) in TB/s of the bytes each moves.
void BenchFp8NormGemm(const Ceilings& c);

}  // namespace tandem::bench
