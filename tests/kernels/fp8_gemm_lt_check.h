// The FP8 cuBLASLt GEMM's reference check (fp8_gemm_lt_test.cc), shared with the tuning tests
// (cublaslt_autotune_test.cc): one call of Fp8GemmLt on fresh random inputs against
// QuantGemmRef, at the tolerance fp8_gemm_lt_test.cc derives.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

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

}  // namespace tandem
