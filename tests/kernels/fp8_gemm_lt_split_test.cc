// The FP8 GEMM's own split-k (kernels/quant_gemm/fp8_gemm_lt_split.h) against QuantGemmRef: every
// split (2, 3, 4) on O / down-like shapes (n = 4096, and QKV's 6144) at decode batches above 64,
// plain (c starts NaN, so a part or a row left out fails), with a bias, and accumulating (c
// starts random: the sum must add c exactly once and each part once, so dropping the residual
// or adding a part twice fails); a split call captured into a CUDA graph after an eager one on
// its stream; and calls that must not split (block scales, m = 64, gate-up's n) still match and
// leave the split counter alone. The counter proves each qualifying call took the split path.
#include "kernels/quant_gemm/fp8_gemm_lt_split.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <tuple>

#include "gtest/gtest.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/fp8_gemm_lt_check.h"

namespace tandem {
namespace {

TEST(Fp8LtSplitTest, EverySplitMatchesTheReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  for (int splits : {2, 3, 4}) {
    ScopedFp8LtSplitK on(splits);
    for (auto [m, n, k, bias, accumulate] :
         {std::tuple<int64_t, int64_t, int64_t, bool, bool>{256, 4096, 2048, false, true},
          {128, 4096, 2048, true, false},
          {68, 6144, 2048, false, false},
          {512, 4096, 2048, false, true},
          {256, 4096, 4096 + 144, false, true}}) {  // k not a multiple of 128: the last part
      SCOPED_TRACE(::testing::Message() << "splits " << splits);
      const int64_t before = Fp8LtSplitCalls();
      CheckFp8Lt({Layout::kChannel, m, n, k, bias, accumulate, false});
      EXPECT_EQ(Fp8LtSplitCalls(), before + 1) << "m " << m << " n " << n << " k " << k;
    }
  }
}

// As the engine does: an eager call on the stream first (side streams, events, workspaces and
// the parts' buffer are made then), then the same shape's call captured into a graph.
TEST(Fp8LtSplitTest, SplitCallsAreCapturable) {
  TANDEM_SKIP_WITHOUT_GPU();
  ScopedFp8LtSplitK on(2);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const Fp8LtCase c{Layout::kChannel, 256, 4096, 2048, false, true, false};
  CheckFp8Lt(c, stream);
  const int64_t before = Fp8LtSplitCalls();
  CheckFp8Lt(c, stream, /*capture=*/true);
  EXPECT_EQ(Fp8LtSplitCalls(), before + 1);
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

TEST(Fp8LtSplitTest, CallsThatDoNotQualifyRunUnsplit) {
  TANDEM_SKIP_WITHOUT_GPU();
  ScopedFp8LtSplitK on(2);
  const int64_t before = Fp8LtSplitCalls();
  CheckFp8Lt({Layout::kBlock, 256, 4096, 2048, false, true, false});
  CheckFp8Lt({Layout::kChannel, 64, 4096, 2048, false, true, false});
  CheckFp8Lt({Layout::kChannel, 256, 8192 + 16, 1024, false, false, false});
  EXPECT_EQ(Fp8LtSplitCalls(), before);
  ScopedFp8LtSplitK off(0);
  CheckFp8Lt({Layout::kChannel, 256, 4096, 2048, false, true, false});
  EXPECT_EQ(Fp8LtSplitCalls(), before);
}

}  // namespace
}  // namespace tandem
