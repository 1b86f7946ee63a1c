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

#include <cstdint>
#include <string>

#include "kernels/bench/bench_util.h"

namespace tandem::bench {

void BenchLtTune(const Ceilings& c);

// kb_bench's "lttune_extra" section: the extra cuBLASLt candidates (kernels/common/
// cublaslt_configs.h, kernels/quant_gemm/WORKLOG.md step 6) on the served decode step's FP8 GEMMs
// (QKV, O and down accumulating, gate-up) at M = 128, 256, 512, both checkpoint layouts, weights
// rotated beyond L2: the heuristic's first, the tuner's choice with extras (plan tuned on one
// L2-warm weight, then timed rotated), and every candidate forced in turn (the best extra one
// reported with its configuration). One line per case, rows lttune_extra.fp8.<layout>.*.
void BenchLtExtra(const Ceilings& c);

// kb_bench's "fp8split" section: the FP8 GEMM's own split-k (kernels/quant_gemm/
// fp8_gemm_lt_split.h) on the decode shapes it covers (QKV, O and down accumulating; per-channel
// weights) at M = 128, 256, 512, rotated weights, the heuristic's algorithm, each call replayed
// from a CUDA graph as in the served step: unsplit against S = 2, 3, 4 (a split whose part plan
// cuBLASLt refuses says so). Rows fp8split.channel.*.
void BenchFp8Split(const Ceilings& c);

// kb_bench's "lttune_dump SHAPE M LAYOUT" section: for one FP8 shape (qkv, o, gate_up, down,
// lm_head), M (a multiple of 4) and layout (channel, block), the algorithm ids' capabilities and
// every candidate cuBLASLt accepts (up to 2048 configurations checked, 512 accepted), each with
// its configuration and its time on rotated weights: the whole landscape in one call.
void BenchLtDump(const Ceilings& c, const std::string& shape, int64_t m, const std::string& layout);

}  // namespace tandem::bench
