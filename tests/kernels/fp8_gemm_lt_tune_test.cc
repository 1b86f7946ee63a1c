// The cuBLASLt plan tuner (kernels/common/cublaslt_autotune.h) on the FP8 GEMM: plans made with
// tuning forced on (whatever TANDEM_LT_AUTOTUNE says) on decode-like shapes (m = 1, 7, 33, 256;
// n = 4096, 6144; m % 4 != 0 takes the block modes' tail plan) give the reference's result —
// whichever candidate wins — and accumulate plans add exactly one product to c (the timing runs
// wrote scratch outputs, never c); each new plan was timed or had a single candidate (cuBLASLt
// offers one FP8 algorithm for these scale modes on CUDA 13: run 36) and nothing fell back. A
// plan made under graph capture times nothing and still computes the reference, and a plan made
// with tuning switched off times nothing. The switch and the buckets need no device.
#include <cuda_runtime.h>

#include <cstdint>
#include <iostream>
#include <utility>

#include "gtest/gtest.h"
#include "kernels/common/cublaslt_autotune.h"
#include "kernels/quant_gemm/fp8_gemm_lt.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/fp8_gemm_lt_check.h"

namespace tandem {
namespace {

TEST(LtAutotuneTest, BucketsRows) {
  for (int64_t rows = 1; rows <= 8; ++rows) EXPECT_EQ(LtTuneBucket(rows), rows);
  EXPECT_EQ(LtTuneBucket(9), 16);
  EXPECT_EQ(LtTuneBucket(16), 16);
  EXPECT_EQ(LtTuneBucket(17), 24);
  EXPECT_EQ(LtTuneBucket(250), 256);
  EXPECT_EQ(LtTuneBucket(256), 256);
  EXPECT_EQ(LtTuneBucket(512), 512);
  EXPECT_EQ(LtTuneBucket(513), 1024);
  EXPECT_EQ(LtTuneBucket(1024), 1024);
  EXPECT_EQ(LtTuneBucket(1025), 2048);
  EXPECT_EQ(LtTuneBucket(8192), 8192);
  EXPECT_EQ(LtTuneBucket(8193), 16384);
}

TEST(LtAutotuneTest, OverrideSwitchesAndRestores) {
  const bool before = LtAutotuneEnabled();
  {
    ScopedLtAutotune off(false);
    EXPECT_FALSE(LtAutotuneEnabled());
    SetLtAutotune(true);
    EXPECT_TRUE(LtAutotuneEnabled());
  }
  EXPECT_EQ(LtAutotuneEnabled(), before);
}

TEST(LtAutotuneTest, TunedFp8PlansMatchTheReferenceAndWriteOnce) {
  TANDEM_SKIP_WITHOUT_GPU();
  ScopedLtAutotune on(true);
  const LtTuneStats before = GetLtTuneStats();
  for (Layout layout : {Layout::kChannel, Layout::kBlock}) {
    for (int64_t m : {1, 7, 33, 256}) {
      for (auto [n, k] : {std::pair<int64_t, int64_t>{4096, 1024}, {6144, 512}}) {
        for (bool accumulate : {false, true}) {
          CheckFp8Lt({layout, m, n, k, /*bias=*/!accumulate && m == 7, accumulate, false});
        }
      }
    }
  }
  const LtTuneStats after = GetLtTuneStats();
  const int64_t timed = after.plans_timed - before.plans_timed;
  const int64_t single = after.plans_single_candidate - before.plans_single_candidate;
  // Every new plan was either timed or had nothing to choose from: on an H200 (run 36, CUDA 13)
  // cuBLASLt's heuristic offers one algorithm for each of these FP8 scale modes, so the plans
  // are single-candidate there; the results are checked against the reference either way.
  EXPECT_GE(timed + single, 1) << "no plan was considered for tuning";
  EXPECT_EQ(after.plans_untimed, before.plans_untimed) << "a plan fell back untimed";
  std::cout << "tuned " << timed << " FP8 plans over "
            << after.candidates_timed - before.candidates_timed << " candidates; " << single
            << " plans had a single candidate\n";
}

// Switched off, a new plan takes the heuristic's first without timing anything.
TEST(LtAutotuneTest, SwitchedOffPlansAreNotTimed) {
  TANDEM_SKIP_WITHOUT_GPU();
  ScopedLtAutotune off(false);
  const LtTuneStats before = GetLtTuneStats();
  CheckFp8Lt({Layout::kBlock, 72, 4096, 512, false, true, false});
  const LtTuneStats after = GetLtTuneStats();
  EXPECT_EQ(after.plans_timed, before.plans_timed);
  EXPECT_EQ(after.plans_untimed, before.plans_untimed);
  EXPECT_EQ(after.bucket_reuses, before.bucket_reuses);
  EXPECT_EQ(after.plans_single_candidate, before.plans_single_candidate);
}

// The engine plans outside capture (its eager step before each capture); a plan first made
// under capture must not time (no synchronisation or allocation in a capture) and still work.
TEST(LtAutotuneTest, PlanMadeUnderCaptureTakesTheHeuristicsFirst) {
  TANDEM_SKIP_WITHOUT_GPU();
  ScopedLtAutotune on(true);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  // An eager call first: the stream's cuBLASLt workspace is allocated outside the capture.
  CheckFp8Lt({Layout::kChannel, 16, 256, 512, false, false, false}, stream);
  const LtTuneStats before = GetLtTuneStats();
  CheckFp8Lt({Layout::kChannel, 48, 4096, 512, false, true, false}, stream, /*capture=*/true);
  const LtTuneStats after = GetLtTuneStats();
  EXPECT_EQ(after.plans_timed, before.plans_timed);
  // Untimed for the capture, or nothing to choose from (a single candidate: see above).
  EXPECT_GE(after.plans_untimed + after.plans_single_candidate,
            before.plans_untimed + before.plans_single_candidate + 1);
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

}  // namespace
}  // namespace tandem
