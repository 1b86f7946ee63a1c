// The FP8 cuBLASLt GEMM's reference check (fp8_gemm_lt_test.cc), shared with the tuning tests
// (fp8_gemm_lt_tune_test.cc): one call of Fp8GemmLt on fresh random inputs against
// QuantGemmRef, at the tolerance fp8_gemm_lt_test.cc derives.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>

namespace tandem {

enum class Layout {
  kChannel,      // group_size k, activations per token: outer vectors
  kBlock,        // group 128, one scale per 128x128 block: BLK128x128 + VEC128
  kBlockRows,    // group 128, scales differing per row: VEC128 on both sides
  kChannelRows,  // group_size k with per-token-group activations: VEC128 on both sides
};

struct Fp8LtCase {
  Layout layout;
  int64_t m, n, k;
  bool bias, accumulate, a_f32;
};

// Runs the case on `stream` (eagerly; or, with `capture`, captured into a CUDA graph that is
// then launched, so plans are made under capture) and checks c against the reference: every
// element finite and within tolerance, c starting as NaN (or, for accumulate, as random values
// the result must add exactly one product to). gtest failures on mismatch.
void CheckFp8Lt(const Fp8LtCase& c, cudaStream_t stream = nullptr, bool capture = false);

// CheckFp8Lt with the device call repeated against one reference (computed once: the CPU
// reference dominates a check at decode shapes): before run r = 0, 1, ... `before_run(r)` sets
// up that run (a forced candidate, say) or returns false to stop. Every run starts from the same
// inputs (c NaN, or c0 for accumulate) and must match on its own. With `failed_calls` (eager
// runs only), a run whose Fp8GemmLt call returns an error is counted there and skipped rather
// than failed: a forced configuration that cuBLASLt accepted but refuses to launch is one the
// tuner skips too (it never wins), not a wrong result.
void CheckFp8LtRuns(const Fp8LtCase& c, const std::function<bool(int)>& before_run,
                    cudaStream_t stream = nullptr, bool capture = false,
                    int* failed_calls = nullptr);

}  // namespace tandem
