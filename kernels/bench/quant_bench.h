// kb_bench's "quant" section (quant_bench.cc): QuantGemmSkinny, W8A16 and W4A16, on the 8B layer
// shapes at decode batch sizes, as TB/s of quantized weight bytes (codes + scales + zeros).
#pragma once

#include "kernels/bench/bench_util.h"

namespace tandem::bench {

void BenchQuantGemm(const Ceilings& c);

}  // namespace tandem::bench
