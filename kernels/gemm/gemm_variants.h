// Benchmark-only access to the skinny GEMM's kernel variants (see kernels/gemm/WORKLOG.md), so
// one GPU run can time them side by side. Not for production callers: use Gemm().
#pragma once

#include "absl/status/status.h"
#include "kernels/gemm/gemm.h"

namespace tandem {

// Variants (m <= 4, bf16 a/w/c, k % 8 == 0): rows of w per 256-thread block x loads in flight
// per row and thread:  0: 4 x 2   1: 2 x 4   2: 8 x 1   3: 4 x 4; then the continuous-stream
// kernels of gemm_stream.h: 4: register double-buffered (4 rows), 5: bulk-copy ring (8 rows).
// (A warp-per-row kernel was measured slower and removed: WORKLOG.md step 2.)
inline constexpr int kNumSkinnyVariants = 6;
absl::Status GemmSkinnyVariant(const GemmArgs& args, int variant, cudaStream_t stream);

}  // namespace tandem
