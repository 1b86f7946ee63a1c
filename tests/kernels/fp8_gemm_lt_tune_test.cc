// The cuBLASLt plan tuner (kernels/common/cublaslt_autotune.h) on the FP8 GEMM: plans made with
// tuning forced on (whatever TANDEM_LT_AUTOTUNE says) on decode-like shapes (m = 1, 7, 33, 256;
// n = 4096, 6144; m % 4 != 0 takes the block modes' tail plan) give the reference's result —
// whichever candidate wins — and accumulate plans add exactly one product to c (the timing runs
// wrote scratch outputs, never c); each new plan was timed or had a single candidate (cuBLASLt
// offers one FP8 algorithm for these scale modes on CUDA 13: run 36) and nothing fell back. A
// plan made under graph capture times nothing and still computes the reference, and a plan made
// with tuning switched off times nothing. With the extra candidates (configurations beyond the
// heuristic's, cublaslt_configs.h) the tuned plans still match, and every accepted extra
// configuration, forced in turn, matches on its own. The switches and the buckets need no
// device.
#include <cuda_runtime.h>

#include <cstdint>
#include <iostream>
#include <string>
#include <tuple>
#include <utility>

#include "gtest/gtest.h"
#include "kernels/common/cublaslt_autotune.h"
#include "kernels/quant_gemm/fp8_gemm_lt.h"
#include "kernels/quant_gemm/fp8_gemm_lt_split.h"
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
  ScopedLtExtraCandidates heuristic_only(false);  // the extras: the next two tests
  ScopedFp8LtSplitK unsplit(0);                   // one plan per call, whatever the environment
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

TEST(LtAutotuneTest, TheModeEncodesTheSwitchesAndTheForcedCandidate) {
  ScopedLtForcedCandidate none(-1);
  {
    ScopedLtAutotune off(false);
    EXPECT_EQ(LtTuneMode(), 0);
  }
  ScopedLtAutotune on(true);
  {
    ScopedLtExtraCandidates extras(false);
    EXPECT_EQ(LtTuneMode(), 1);
    EXPECT_TRUE(LtModeTunes(1));
    EXPECT_FALSE(LtModeWantsExtras(1));
  }
  ScopedLtExtraCandidates extras(true);
  EXPECT_EQ(LtTuneMode(), 2);
  EXPECT_TRUE(LtModeTunes(2) && LtModeWantsExtras(2));
  {
    ScopedLtForcedCandidate forced(5);
    EXPECT_EQ(LtTuneMode(), 8);
    EXPECT_EQ(LtModeForced(8), 5);
    EXPECT_FALSE(LtModeTunes(8));
    EXPECT_TRUE(LtModeWantsExtras(8));
  }
  EXPECT_EQ(LtForcedCandidate(), -1);
  EXPECT_EQ(LtModeForced(2), -1);
}

// Tuning with the extra candidates (cublaslt_configs.h): whatever wins, heuristic or extra
// configuration (split-k included), the result is the reference's, and an accumulating plan adds
// exactly one product to c. Shapes: the decode GEMMs' n at a k cut for the CPU reference's time.
TEST(LtAutotuneTest, TunedFp8PlansWithExtraCandidatesMatchTheReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  ScopedLtAutotune on(true);
  ScopedLtExtraCandidates extras(true);
  ScopedLtForcedCandidate none(-1);
  ScopedFp8LtSplitK unsplit(0);
  const LtTuneStats before = GetLtTuneStats();
  for (Layout layout : {Layout::kChannel, Layout::kBlock}) {
    for (int64_t m : {1, 7, 33, 256}) {
      for (auto [n, k] : {std::pair<int64_t, int64_t>{4096, 2048}, {6144, 1024}}) {
        for (bool accumulate : {false, true}) {
          CheckFp8Lt({layout, m, n, k, /*bias=*/!accumulate && m == 7, accumulate, false});
        }
      }
    }
  }
  const LtTuneStats after = GetLtTuneStats();
  EXPECT_EQ(after.plans_untimed, before.plans_untimed) << "a plan fell back untimed";
  EXPECT_GE(after.plans_timed - before.plans_timed + after.plans_single_candidate -
                before.plans_single_candidate,
            1)
      << "no plan was considered for tuning";
  std::cout << "with extras: " << after.plans_timed - before.plans_timed << " plans timed, "
            << after.extra_checked - before.extra_checked << " extra configurations checked, "
            << after.extra_accepted - before.extra_accepted << " accepted, "
            << after.extra_timed - before.extra_timed << " timed; an extra won "
            << after.plans_extra_won - before.plans_extra_won << " plans; "
            << after.plans_single_candidate - before.plans_single_candidate
            << " plans had a single candidate\n";
}

// Every candidate of a plan's list, the heuristic's and each accepted extra configuration, forced
// in turn (the test hook) on one set of inputs: each must match the reference on its own, so a
// split-k configuration that drops the beta = 1 accumulation (c0 missing) or counts a part twice
// fails here even when it never wins a tuning. Shapes: O / down at a decode batch (n = 4096,
// m = 256, accumulating, and plain), and m = 33 in the block layout (its 4-row tail plan).
TEST(LtAutotuneTest, EveryAcceptedExtraConfigurationMatchesTheReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  constexpr int kMaxRuns = 1 + kLtTuneMaxCandidates + kLtExtraMaxTimed;
  ScopedFp8LtSplitK unsplit(0);  // the plans of the call itself, not of its split parts
  int64_t extras_seen = 0;
  for (Layout layout : {Layout::kChannel, Layout::kBlock}) {
    for (auto [m, k, accumulate] : {std::tuple<int64_t, int64_t, bool>{256, 2048, true},
                                    {256, 1024, false},
                                    {33, 1024, true}}) {
      ScopedLtForcedCandidate restore(-1);  // back to none however the check ends
      int64_t applied = 0;
      int runs = 0, failed = 0;
      CheckFp8LtRuns(
          {layout, m, 4096, k, false, accumulate, false},
          [&](int run) {
            const LtTuneStats now = GetLtTuneStats();
            // Past the end of every plan's list: the previous run's plans were all missing.
            if (run > 0 && now.forced_applied == applied) return false;
            if (run >= kMaxRuns) return false;
            applied = now.forced_applied;
            SetLtForcedCandidate(run);
            runs = run + 1;
            return true;
          },
          nullptr, false, &failed);
      const LtPlanCandidates last = LastLtPlanCandidates();
      extras_seen += static_cast<int64_t>(last.names.size()) - last.heuristic;
      std::cout << "layout " << static_cast<int>(layout) << " m " << m << " k " << k
                << (accumulate ? " accumulate" : "") << ": " << runs - 1 << " candidates forced ("
                << failed << " calls refused at launch); last plan " << last.label << ": "
                << last.heuristic << " heuristic + " << last.names.size() - last.heuristic
                << " extra (" << last.extra_checked << " checked)\n";
      for (const std::string& c : last.caps) std::cout << "  caps " << c << "\n";
      for (size_t i = 0; i < last.names.size(); ++i) {
        std::cout << "  candidate " << i << ": " << last.names[i] << "\n";
      }
      // Index 0 (the heuristic's first) exists for every plan, so at least one run applied it.
      EXPECT_GE(runs, 2) << "the forced candidate hook never applied";
    }
  }
  std::cout << "extra candidates forced and checked: " << extras_seen << "\n";
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
