// kb_bench's "quant" section (quant_bench.cc): QuantGemmSkinny, W8A16 and W4A16, on the 8B layer
// shapes at decode batch sizes, as TB/s of quantized weight bytes (codes + scales + zeros).
#pragma once

#include <cstdint>
#include <string>

#include "kernels/bench/bench_util.h"

namespace tandem::bench {

void BenchQuantGemm(const Ceilings& c);
// "quantone CODE KERNEL M K N [DEPTH]": 40 launches of one quantized GEMM (CODE int8 | int4,
// KERNEL skinny | tc | gemv | gemv_tc16) on random codes, for ncu (-k regex:...).
void BenchQuantOne(const std::string& code, const std::string& kernel, int64_t m, int64_t k,
                   int64_t n, int depth);

}  // namespace tandem::bench
