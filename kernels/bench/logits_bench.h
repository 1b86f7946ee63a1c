// kb_bench's "logits" section (logits_bench.cc): LogitsProcess and Logprobs timed beside one
// read of the logits.
#pragma once

#include "kernels/bench/bench_util.h"

namespace tandem::bench {

void BenchLogits(const Ceilings& c);

}  // namespace tandem::bench
