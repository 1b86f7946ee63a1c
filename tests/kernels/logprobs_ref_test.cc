// LogprobsRef: a hand-computed row, random rows against the naive long-double implementation,
// masked / undefined / tied rows, skipped rows, and argument validation.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/logprobs/logprobs.h"
#include "tests/kernels/logits_test_util.h"

namespace tandem {
namespace {

using testing::kInf;
using testing::NaiveLogprobRow;
using testing::NaiveLogprobs;

constexpr int kTop = kMaxTopLogprobs;

// Outputs of LogprobsRef on host rows, pre-filled with sentinels (untouched entries keep them).
struct Result {
  std::vector<float> token_lp, top_lp;
  std::vector<int32_t> top_id;
};
constexpr float kUntouched = 12345.0f;
constexpr int32_t kUntouchedId = -777;

Result RunRef(const std::vector<float>& logits, int64_t vocab, const std::vector<int32_t>& tokens,
              const std::vector<int32_t>& num_top) {
  const int64_t batch = tokens.size();
  Result out{std::vector<float>(batch, kUntouched), std::vector<float>(batch * kTop, kUntouched),
             std::vector<int32_t>(batch * kTop, kUntouchedId)};
  LogprobsRef({.logits = logits.data(),
               .tokens = tokens.data(),
               .num_top = num_top.data(),
               .token_logprob = out.token_lp.data(),
               .top_tokens = out.top_id.data(),
               .top_logprobs = out.top_lp.data(),
               .batch = batch,
               .vocab_size = vocab});
  return out;
}

TEST(LogprobsRefTest, HandComputedRow) {
  // exp: 1, 2, 0, 1 -> logsumexp = log 4; ids 0 and 3 tie (lower id first); 2 is masked.
  const std::vector<float> logits = {0.0f, std::log(2.0f), -kInf, -0.0f};
  const Result r = RunRef(logits, 4, {2}, {5});
  EXPECT_EQ(r.token_lp[0], -kInf);
  const std::vector<int32_t> ids = {1, 0, 3, 2, -1};
  const double l4 = std::log(4.0), l2 = std::log(2.0);
  const std::vector<double> lps = {std::log(2.0f) - l4, -l4, -l4, -kInf, -kInf};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(r.top_id[i], ids[i]) << i;
    if (i < 3) {
      EXPECT_NEAR(r.top_lp[i], lps[i], 1e-7) << i;
    } else {
      EXPECT_EQ(r.top_lp[i], -kInf) << i;
    }
  }
  EXPECT_NEAR(r.top_lp[0], -l2, 1e-7);
  EXPECT_EQ(r.top_id[5], kUntouchedId);  // entries past N are not written
  EXPECT_EQ(r.top_lp[5], kUntouched);
}

// Every output of row `row` against the naive row, ids exact and logprobs within tol(x).
void ExpectRowMatchesNaive(const Result& got, int64_t row, const float* x, int64_t vocab,
                           int32_t token, int32_t want_top) {
  const NaiveLogprobRow naive = NaiveLogprobs(x, vocab);
  ASSERT_TRUE(naive.defined);
  auto tol = [](double v) { return 2e-6 + std::ldexp(std::abs(v), -23); };
  const double tv = naive.LogProb(x[token]);
  ASSERT_NEAR(got.token_lp[row], tv, tol(tv)) << "token logprob, row " << row;
  const int n = std::min(want_top, kTop);
  for (int i = 0; i < n; ++i) {
    const int64_t at = row * kTop + i;
    if (i >= vocab) {
      ASSERT_EQ(got.top_id[at], -1);
      ASSERT_EQ(got.top_lp[at], -kInf);
      continue;
    }
    ASSERT_EQ(got.top_id[at], naive.order[i]) << "row " << row << " entry " << i;
    const double v = naive.LogProb(x[naive.order[i]]);
    ASSERT_NEAR(got.top_lp[at], v, tol(v)) << "row " << row << " entry " << i;
  }
}

TEST(LogprobsRefTest, MatchesNaiveOnRandomRows) {
  std::mt19937_64 rng(11);
  for (int64_t vocab : {1, 7, 1000, 32000, 152064}) {
    const int64_t batch = vocab > 100000 ? 3 : 9;
    std::vector<float> logits(batch * vocab);
    std::vector<int32_t> tokens(batch), num_top(batch);
    for (int64_t r = 0; r < batch; ++r) {
      // Rows alternate N(0, 3^2), uniform [-30, 30] and logits of magnitude up to 1e4.
      const float spread = r % 3 == 0 ? 3.0f : (r % 3 == 1 ? 30.0f : 1e4f);
      std::normal_distribution<float> normal(0.0f, spread);
      std::uniform_real_distribution<float> uniform(-spread, spread);
      for (int64_t i = 0; i < vocab; ++i) {
        logits[r * vocab + i] = r % 3 == 0 ? normal(rng) : uniform(rng);
      }
      tokens[r] = static_cast<int32_t>(rng() % vocab);
      num_top[r] = static_cast<int32_t>(r * 7 % (kTop + 1));
    }
    const Result got = RunRef(logits, vocab, tokens, num_top);
    for (int64_t r = 0; r < batch; ++r) {
      SCOPED_TRACE(::testing::Message() << "vocab " << vocab << " row " << r);
      ExpectRowMatchesNaive(got, r, &logits[r * vocab], vocab, tokens[r], num_top[r]);
    }
  }
}

TEST(LogprobsRefTest, MaskedRowsAndTies) {
  const int64_t vocab = 6;
  // Row 0: one finite logit -> 0, the rest -inf (in id order). Row 1: every logit equal.
  const std::vector<float> logits = {-kInf, -kInf, -kInf, 3.5f, -kInf, -kInf,
                                     2.0f,  2.0f,  2.0f,  2.0f, 2.0f,  2.0f};
  const Result r = RunRef(logits, vocab, {3, 5}, {3, 20});
  EXPECT_EQ(r.token_lp[0], 0.0f);
  EXPECT_EQ(r.top_id[0], 3);
  EXPECT_EQ(r.top_lp[0], 0.0f);
  EXPECT_EQ(r.top_id[1], 0);
  EXPECT_EQ(r.top_lp[1], -kInf);
  EXPECT_EQ(r.top_id[2], 1);
  const float uniform = static_cast<float>(-std::log(6.0));
  EXPECT_FLOAT_EQ(r.token_lp[1], uniform);
  for (int i = 0; i < kTop; ++i) {
    EXPECT_EQ(r.top_id[kTop + i], i < 6 ? i : -1) << i;
    if (i < 6) {
      EXPECT_FLOAT_EQ(r.top_lp[kTop + i], uniform) << i;
    } else {
      EXPECT_EQ(r.top_lp[kTop + i], -kInf) << i;
    }
  }
}

// NaN, +inf and all -inf rows: NaN logprobs and (-1, NaN) top entries; a row wanting nothing
// (-1) is untouched; N > kMaxTopLogprobs is clamped; a token outside the vocabulary gets NaN.
TEST(LogprobsRefTest, UndefinedSkippedAndClampedRows) {
  const int64_t vocab = 4;
  const float nan = std::nanf("");
  const std::vector<float> logits = {0, 1, nan, 2, 0, kInf, 1, 2, -kInf, -kInf, -kInf, -kInf,
                                     0, 1, 2,   3, 0, 1,    2, 3, 0,     1,     2,     3};
  const Result r = RunRef(logits, vocab, {0, 1, 2, 3, 9, -1}, {2, 2, 2, -1, 30, 0});
  for (int row = 0; row < 3; ++row) {
    EXPECT_TRUE(std::isnan(r.token_lp[row])) << row;
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(r.top_id[row * kTop + i], -1) << row;
      EXPECT_TRUE(std::isnan(r.top_lp[row * kTop + i])) << row;
    }
    EXPECT_EQ(r.top_id[row * kTop + 2], kUntouchedId);
  }
  EXPECT_EQ(r.token_lp[3], kUntouched);
  EXPECT_EQ(r.top_id[3 * kTop], kUntouchedId);
  EXPECT_TRUE(std::isnan(r.token_lp[4]));  // token 9 >= vocab
  for (int i = 0; i < kTop; ++i) EXPECT_EQ(r.top_id[4 * kTop + i], i < 4 ? 3 - i : -1) << i;
  EXPECT_TRUE(std::isnan(r.token_lp[5]));       // token -1
  EXPECT_EQ(r.top_id[5 * kTop], kUntouchedId);  // N = 0: no top entries
}

TEST(LogprobsRefTest, ValidationRejectsBadArguments) {
  float f = 0;
  int32_t i = 0;
  const LogprobsArgs ok{.logits = &f,
                        .tokens = &i,
                        .num_top = &i,
                        .token_logprob = &f,
                        .top_tokens = &i,
                        .top_logprobs = &f,
                        .batch = 1,
                        .vocab_size = 1};
  EXPECT_TRUE(ValidateLogprobsArgs(ok).ok());
  EXPECT_TRUE(ValidateLogprobsArgs({}).ok());
  LogprobsArgs bad = ok;
  bad.batch = -1;
  EXPECT_EQ(ValidateLogprobsArgs(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = ok, bad.vocab_size = 0;
  EXPECT_EQ(ValidateLogprobsArgs(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = ok, bad.top_logprobs = nullptr;
  EXPECT_EQ(ValidateLogprobsArgs(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = ok, bad.tokens = nullptr;
  EXPECT_EQ(ValidateLogprobsArgs(bad).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
