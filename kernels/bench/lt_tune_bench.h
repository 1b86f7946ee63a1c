// kb_bench's "lttune" section (lt_tune_bench.cc; not in "all"): what tuning the cuBLASLt plans
// gains (kernels/common/cublaslt_autotune.h). For the Llama-3-8B shapes (QKV 4096 -> 6144, O
// 4096 -> 4096, gate-up 4096 -> 28672, down 14336 -> 4096, lm_head 4096 -> 128256) at M = 1, 8,
// 32, 128, 256, 512, 2048, 8192, each GEMM is timed twice in one process, with the plan made
// untuned (the heuristic's first algorithm: SetLtAutotune(false)) and tuned: the FP8 matmul
// (Fp8LtMatmul, both checkpoint layouts; O and down accumulate into c, as the served step does)
// and the bf16 cuBLASLt GEMM (GemmCublasLt). Rows lttune.<path>.heuristic and .tuned in TFLOP/s
// of 2 m n k, and one line per shape with the difference. Weights rotate beyond L2 as in the
// other GEMM rows (the tuner itself times on one weight).
#pragma once

#include "kernels/bench/bench_util.h"

namespace tandem::bench {

void BenchLtTune(const Ceilings& c);

}  // namespace tandem::bench
