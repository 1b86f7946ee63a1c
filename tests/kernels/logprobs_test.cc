// CUDA Logprobs against LogprobsRef: top ids exact, logprobs within 5e-6 + 2^-22 |ref| (the
// kernel's fp32 sum; logprobs.h), NaN rows as NaN; skipped rows untouched (their poisoned outputs
// stay). Awkward batches and vocabularies, row kinds from N(0, 3^2) to ties, masks, ascending
// rows and undefined rows; the stated accuracy (1e-5 against long double at |logit| <= 30, vocab
// 152064); batch invariance and a CUDA graph replay.
#include "kernels/logprobs/logprobs.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/logits_test_util.h"

namespace tandem {
namespace {

using testing::DeviceVector;
using testing::kInf;
using testing::NaiveLogprobRow;
using testing::NaiveLogprobs;

constexpr int kTop = kMaxTopLogprobs;

struct Rows {
  int64_t batch = 0, vocab = 0;
  std::vector<float> logits;
  std::vector<int32_t> tokens, num_top;
};

struct Outputs {
  std::vector<float> token_lp, top_lp;
  std::vector<int32_t> top_id;
};

// Fills row r as kind r % 10 says; N and the token vary with r.
void FillRow(Rows& x, int64_t r, std::mt19937_64& rng) {
  float* row = &x.logits[r * x.vocab];
  const int64_t v = x.vocab;
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_real_distribution<float> uniform(-30.0f, 30.0f);
  const int kind = static_cast<int>(r % 10);
  for (int64_t i = 0; i < v; ++i) {
    switch (kind) {
      case 1:
        row[i] = uniform(rng);
        break;
      case 2:
        row[i] = static_cast<float>(rng() % 5);
        break;  // massive ties
      case 3:
        row[i] = static_cast<float>(i) * 1e-3f;
        break;  // ascending: every load a candidate
      case 4:
        row[i] = i % 3 == 0 ? normal(rng) : -kInf;
        break;  // masked two thirds
      case 5:
        row[i] = 1e4f * uniform(rng);
        break;  // large magnitudes
      case 6:
        row[i] = i == v / 2 ? 1.5f : -kInf;
        break;  // one finite logit
      case 7:
        row[i] = -static_cast<float>(i);
        break;  // descending
      default:
        row[i] = normal(rng);
    }
  }
  if (kind == 8 && r % 20 == 8) row[rng() % v] = std::nanf("");  // undefined rows
  if (kind == 8 && r % 20 == 18) row[rng() % v] = kInf;
  if (kind == 9 && r % 30 == 29) std::fill(row, row + v, -kInf);
  x.tokens[r] = static_cast<int32_t>(r % 11 == 10 ? v + r : rng() % v);  // some out of range
  const int32_t tops[] = {-1, 0, 1, 5, 20, 25, 3, 19, 20, 2, 7, -1, 20};
  x.num_top[r] = tops[(r * 5 + kind) % 13];
}

Rows MakeRows(int64_t batch, int64_t vocab, std::mt19937_64& rng) {
  Rows x{batch, vocab, std::vector<float>(batch * vocab), std::vector<int32_t>(batch),
         std::vector<int32_t>(batch)};
  for (int64_t r = 0; r < batch; ++r) FillRow(x, r, rng);
  return x;
}

Outputs RunRef(const Rows& x) {
  Outputs o{std::vector<float>(x.batch, std::nanf("")), std::vector<float>(x.batch * kTop),
            std::vector<int32_t>(x.batch * kTop, -1)};
  LogprobsRef({.logits = x.logits.data(),
               .tokens = x.tokens.data(),
               .num_top = x.num_top.data(),
               .token_logprob = o.token_lp.data(),
               .top_tokens = o.top_id.data(),
               .top_logprobs = o.top_lp.data(),
               .batch = x.batch,
               .vocab_size = x.vocab});
  return o;
}

// The kernel's outputs on device copies, poisoned first (0xff: NaN, -1), on `stream`.
Outputs RunGpu(const Rows& x, cudaStream_t stream = nullptr) {
  DeviceVector<float> logits(x.logits);
  DeviceVector<int32_t> tokens(x.tokens), num_top(x.num_top);
  testing::DeviceBuffer token_lp(x.batch * 4), top_lp(x.batch * kTop * 4),
      top_id(x.batch * kTop * 4);
  token_lp.Poison(), top_lp.Poison(), top_id.Poison();
  EXPECT_TRUE(Logprobs({.logits = logits.get(),
                        .tokens = tokens.get(),
                        .num_top = num_top.get(),
                        .token_logprob = token_lp.as<float>(),
                        .top_tokens = top_id.as<int32_t>(),
                        .top_logprobs = top_lp.as<float>(),
                        .batch = x.batch,
                        .vocab_size = x.vocab},
                       stream)
                  .ok());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  Outputs o{std::vector<float>(x.batch), std::vector<float>(x.batch * kTop),
            std::vector<int32_t>(x.batch * kTop)};
  token_lp.Download(o.token_lp.data()), top_lp.Download(o.top_lp.data());
  top_id.Download(o.top_id.data());
  return o;
}

bool Poisoned(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b == 0xffffffffu;
}

void ExpectLogprobNear(float got, float want, const char* what, int64_t r, int i) {
  if (std::isnan(want) || std::isinf(want)) {
    ASSERT_TRUE(testing::SameFloat(got, want)) << what << " row " << r << " entry " << i;
    return;
  }
  ASSERT_NEAR(got, want, 5e-6 + std::ldexp(std::abs(want), -22))
      << what << " row " << r << " entry " << i;
}

void ExpectMatchesRef(const Rows& x, const Outputs& got, const Outputs& want) {
  for (int64_t r = 0; r < x.batch; ++r) {
    if (x.num_top[r] < 0) {  // untouched: still the poison
      ASSERT_TRUE(Poisoned(got.token_lp[r])) << "row " << r;
      for (int i = 0; i < kTop; ++i) ASSERT_EQ(got.top_id[r * kTop + i], -1) << "row " << r;
      continue;
    }
    ExpectLogprobNear(got.token_lp[r], want.token_lp[r], "token", r, -1);
    const int n = std::min(x.num_top[r], kTop);
    for (int i = 0; i < kTop; ++i) {
      const int64_t at = r * kTop + i;
      if (i >= n) {
        ASSERT_TRUE(Poisoned(got.top_lp[at])) << "row " << r << " entry " << i;
        continue;
      }
      ASSERT_EQ(got.top_id[at], want.top_id[at]) << "row " << r << " entry " << i;
      ExpectLogprobNear(got.top_lp[at], want.top_lp[at], "top", r, i);
    }
  }
}

TEST(LogprobsCudaTest, MatchesReferenceOnAwkwardShapes) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(31);
  for (int64_t vocab : {1, 7, 1000, 32000, 128256, 151936}) {
    for (int64_t batch : {1, 3, 17, 256}) {
      SCOPED_TRACE(::testing::Message() << "batch " << batch << " vocab " << vocab);
      const Rows x = MakeRows(batch, vocab, rng);
      ASSERT_NO_FATAL_FAILURE(ExpectMatchesRef(x, RunGpu(x), RunRef(x)));
    }
  }
  const Rows x = MakeRows(64, 152064, rng);  // the benchmark's vocabulary
  ASSERT_NO_FATAL_FAILURE(ExpectMatchesRef(x, RunGpu(x), RunRef(x)));
}

// Every row kind on small shapes, for compute-sanitizer (kernels/bench/gpu_run_all.sh).
TEST(LogprobsCudaTest, SmallForSanitizer) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(36);
  for (int64_t vocab : {7, 1000}) {
    const Rows x = MakeRows(30, vocab, rng);
    ASSERT_NO_FATAL_FAILURE(ExpectMatchesRef(x, RunGpu(x), RunRef(x)));
  }
}

// The accuracy logprobs.h states: |kernel - exact| <= 1e-5 at |logit| <= 30, vocab 152064.
TEST(LogprobsCudaTest, AccuracyAgainstLongDouble) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(32);
  Rows x = MakeRows(16, 152064, rng);
  std::uniform_real_distribution<float> uniform(-30.0f, 30.0f);
  std::normal_distribution<float> normal(0.0f, 10.0f);
  for (int64_t r = 0; r < x.batch; ++r) {
    for (int64_t i = 0; i < x.vocab; ++i) {
      x.logits[r * x.vocab + i] = r % 2 ? uniform(rng) : std::clamp(normal(rng), -30.0f, 30.0f);
    }
    x.tokens[r] = static_cast<int32_t>(rng() % x.vocab), x.num_top[r] = kTop;
  }
  const Outputs got = RunGpu(x);
  double worst = 0.0;
  for (int64_t r = 0; r < x.batch; ++r) {
    const NaiveLogprobRow naive = NaiveLogprobs(&x.logits[r * x.vocab], x.vocab);
    ASSERT_TRUE(naive.defined);
    worst = std::max(
        worst, std::abs(got.token_lp[r] - naive.LogProb(x.logits[r * x.vocab + x.tokens[r]])));
    for (int i = 0; i < kTop; ++i) {
      ASSERT_EQ(got.top_id[r * kTop + i], naive.order[i]) << "row " << r << " entry " << i;
      const double want = naive.LogProb(x.logits[r * x.vocab + naive.order[i]]);
      worst = std::max(worst, std::abs(got.top_lp[r * kTop + i] - want));
    }
  }
  EXPECT_LE(worst, 1e-5);
  std::printf("logprobs: worst |error| against long double: %.3g\n", worst);
}

// A row's outputs do not depend on the rows around it or on the run: bit-identical alone and in
// a batch of 256, and over two runs.
TEST(LogprobsCudaTest, BatchInvariantAndDeterministic) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(33);
  const Rows all = MakeRows(256, 32000, rng);
  const Outputs batched = RunGpu(all), again = RunGpu(all);
  EXPECT_EQ(std::memcmp(batched.token_lp.data(), again.token_lp.data(), 256 * 4), 0);
  EXPECT_EQ(std::memcmp(batched.top_lp.data(), again.top_lp.data(), 256 * kTop * 4), 0);
  for (int64_t r : {0, 1, 77, 255}) {
    Rows one{1,
             all.vocab,
             std::vector<float>(all.logits.begin() + r * all.vocab,
                                all.logits.begin() + (r + 1) * all.vocab),
             {all.tokens[r]},
             {all.num_top[r]}};
    const Outputs alone = RunGpu(one);
    EXPECT_EQ(std::memcmp(&alone.token_lp[0], &batched.token_lp[r], 4), 0) << r;
    EXPECT_EQ(std::memcmp(alone.top_lp.data(), &batched.top_lp[r * kTop], kTop * 4), 0) << r;
    EXPECT_EQ(std::memcmp(alone.top_id.data(), &batched.top_id[r * kTop], kTop * 4), 0) << r;
  }
}

// Unaligned logits (the scalar-load build) give the same bits as aligned ones.
TEST(LogprobsCudaTest, UnalignedRowsMatchAligned) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(34);
  const Rows x = MakeRows(5, 1000, rng);
  std::vector<float> shifted(x.logits.size() + 1);
  std::copy(x.logits.begin(), x.logits.end(), shifted.begin() + 1);
  DeviceVector<float> d(shifted);
  DeviceVector<int32_t> tokens(x.tokens), num_top(x.num_top),
      top_id(std::vector<int32_t>(5 * kTop));
  DeviceVector<float> token_lp(std::vector<float>(5)), top_lp(std::vector<float>(5 * kTop));
  ASSERT_TRUE(Logprobs({.logits = d.get() + 1,
                        .tokens = tokens.get(),
                        .num_top = num_top.get(),
                        .token_logprob = token_lp.get(),
                        .top_tokens = top_id.get(),
                        .top_logprobs = top_lp.get(),
                        .batch = 5,
                        .vocab_size = 1000},
                       nullptr)
                  .ok());
  const Outputs aligned = RunGpu(x);
  const std::vector<float> lp = top_lp.Download(), tlp = token_lp.Download();
  const std::vector<int32_t> ids = top_id.Download();
  for (int64_t r = 0; r < 5; ++r) {
    if (x.num_top[r] < 0) continue;
    EXPECT_TRUE(testing::SameFloat(tlp[r], aligned.token_lp[r])) << r;
    for (int i = 0; i < std::min(x.num_top[r], kTop); ++i) {
      EXPECT_EQ(ids[r * kTop + i], aligned.top_id[r * kTop + i]) << r;
      EXPECT_TRUE(testing::SameFloat(lp[r * kTop + i], aligned.top_lp[r * kTop + i])) << r;
    }
  }
}

TEST(LogprobsCudaTest, GraphReplayAndBadArguments) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(35);
  const Rows x = MakeRows(17, 152064, rng);
  const Outputs want = RunRef(x);
  DeviceVector<float> logits(x.logits);
  DeviceVector<int32_t> tokens(x.tokens), num_top(x.num_top);
  testing::DeviceBuffer token_lp(17 * 4), top_lp(17 * kTop * 4), top_id(17 * kTop * 4);
  const LogprobsArgs args{.logits = logits.get(),
                          .tokens = tokens.get(),
                          .num_top = num_top.get(),
                          .token_logprob = token_lp.as<float>(),
                          .top_tokens = top_id.as<int32_t>(),
                          .top_logprobs = top_lp.as<float>(),
                          .batch = 17,
                          .vocab_size = 152064};
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  testing::RunInStreamAndGraph(
      stream, [&] { token_lp.Poison(), top_lp.Poison(), top_id.Poison(); },
      [&](cudaStream_t s) { ASSERT_TRUE(Logprobs(args, s).ok()); },
      [&](const char* label) {
        SCOPED_TRACE(label);
        Outputs got{std::vector<float>(17), std::vector<float>(17 * kTop),
                    std::vector<int32_t>(17 * kTop)};
        token_lp.Download(got.token_lp.data()), top_lp.Download(got.top_lp.data());
        top_id.Download(got.top_id.data());
        ExpectMatchesRef(x, got, want);
      });
  cudaStreamDestroy(stream);
  LogprobsArgs bad = args;
  bad.batch = 0;
  EXPECT_TRUE(Logprobs(bad, nullptr).ok());
  bad = args, bad.vocab_size = 0;
  EXPECT_EQ(Logprobs(bad, nullptr).code(), absl::StatusCode::kInvalidArgument);
  bad = args, bad.top_tokens = nullptr;
  EXPECT_EQ(Logprobs(bad, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
