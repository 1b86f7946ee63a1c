// Units of engine/spec: n-gram lookup, the acceptance rule on hand-made inputs, and the host
// distribution of a sampling row against the sampler it stands for (kernels/sampling).
#include <cmath>
#include <vector>

#include "engine/spec/ngram_proposer.h"
#include "engine/spec/token_distribution.h"
#include "engine/spec/verify.h"
#include "gtest/gtest.h"
#include "kernels/sampling/sampling.h"

namespace tandem {
namespace {

using V = std::vector<int32_t>;

TEST(NgramLookupTest, ProposesWhatFollowedTheLatestLongestMatch) {
  // Last 3 tokens (1 2 3) occur at 0 and 5; the latest earlier one (5) is followed by 9 9 1.
  const V tokens = {1, 2, 3, 4, 4, 1, 2, 3, 9, 9, 1, 2, 3};
  EXPECT_EQ(NgramLookup(tokens, 1, 3, 2), (V{9, 9}));
  // Past the end the loop (period 5: 9 9 1 2 3) continues.
  EXPECT_EQ(NgramLookup(tokens, 1, 3, 5), (V{9, 9, 1, 2, 3}));
  EXPECT_EQ(NgramLookup(tokens, 1, 3, 8), (V{9, 9, 1, 2, 3, 9, 9, 1}));
  // A longer n wins over a later shorter match: (7 5) matches at 0, (5) alone later at 3.
  EXPECT_EQ(NgramLookup({7, 5, 8, 5, 6, 7, 5}, 1, 2, 1), (V{8}));
  EXPECT_EQ(NgramLookup({7, 5, 8, 5, 6, 7, 5}, 1, 1, 1), (V{6}));
  EXPECT_TRUE(NgramLookup({1, 2, 3, 4}, 1, 3, 4).empty());     // no repeat
  EXPECT_TRUE(NgramLookup({5}, 1, 3, 4).empty());              // nothing before
  EXPECT_TRUE(NgramLookup({1, 2, 9, 1, 2}, 3, 3, 4).empty());  // only a 2-gram repeats
  EXPECT_EQ(NgramLookup({4, 4, 4}, 1, 2, 3), (V{4, 4, 4}));    // a run continues (period 1)
  EXPECT_EQ(NgramLookup({5, 1, 2, 1, 2}, 2, 2, 5), (V{1, 2, 1, 2, 1}));  // period 2
  EXPECT_TRUE(NgramLookup({1, 1}, 1, 1, 0).empty());
}

TEST(VerifyTest, PointMassesAcceptWhileTheTargetAgrees) {
  const V d = {5, 6, 7};
  VerifyInput in;
  in.proposals = d;
  const V all = {5, 6, 7, 8};
  in.target_tokens = all;
  VerifyResult r = Verify(in);
  EXPECT_EQ(r.num_accepted, 3);
  EXPECT_EQ(r.tokens, (V{5, 6, 7, 8}));
  const V second_wrong = {5, 1, 7, 8};
  in.target_tokens = second_wrong;
  r = Verify(in);
  EXPECT_EQ(r.num_accepted, 1);
  EXPECT_EQ(r.tokens, (V{5, 1}));
  const V first_wrong = {2, 6, 7, 8};
  in.target_tokens = first_wrong;
  r = Verify(in);
  EXPECT_EQ(r.num_accepted, 0);
  EXPECT_EQ(r.tokens, (V{2}));
  in.rule = SpecAcceptance::kAcceptAllForTesting;
  EXPECT_EQ(Verify(in).tokens, (V{5, 6, 7, 8}));
}

TEST(VerifyTest, DrawnProposalsFollowTheRule) {
  const V d = {1, 2};
  const V t = {3, 3, 0};
  const std::vector<std::vector<float>> q = {{0.f, 1.f, 0.f, 0.f}, {0.f, 0.f, 1.f, 0.f}};
  VerifyInput in;
  in.proposals = d;
  in.target_tokens = t;
  in.q = q;
  // p == q: always accepted, then the bonus.
  in.p = q;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    in.seed = seed;
    const VerifyResult r = Verify(in);
    EXPECT_EQ(r.num_accepted, 2);
    EXPECT_EQ(r.tokens, (V{1, 2, 0}));
  }
  // p(d_0) = 0: always rejected at 0, the residual max(0, p - q) = p is drawn.
  const std::vector<std::vector<float>> p = {{0.5f, 0.f, 0.f, 0.5f}, {0.f, 0.f, 1.f, 0.f}};
  in.p = p;
  int zeros = 0;
  for (uint64_t seed = 0; seed < 400; ++seed) {
    in.seed = seed;
    const VerifyResult r = Verify(in);
    ASSERT_EQ(r.num_accepted, 0);
    ASSERT_EQ(r.tokens.size(), 1u);
    ASSERT_TRUE(r.tokens[0] == 0 || r.tokens[0] == 3);
    zeros += r.tokens[0] == 0;
  }
  EXPECT_NEAR(zeros / 400.0, 0.5, 0.1);
  // p(d_0) = q(d_0) / 2: accepted about half the time.
  const std::vector<std::vector<float>> half = {{0.f, 0.5f, 0.5f, 0.f}, {0.f, 0.f, 1.f, 0.f}};
  in.p = half;
  int accepted = 0;
  for (uint64_t seed = 0; seed < 400; ++seed) {
    in.seed = seed;
    const VerifyResult r = Verify(in);
    accepted += r.num_accepted > 0;
    if (r.num_accepted == 0) {
      EXPECT_EQ(r.tokens, (V{2})) << "the residual is all on token 2";
    }
  }
  EXPECT_NEAR(accepted / 400.0, 0.5, 0.1);
}

// TokenDistribution is the sampler's distribution: for rows with temperature, top-k, top-p,
// min_p and a frequency penalty, SamplingRef's draws over 40000 steps match it within 4 sigma
// per token; greedy rows are a point mass on the argmax.
TEST(TokenDistributionTest, MatchesTheSampler) {
  constexpr int kVocab = 8;
  const std::vector<float> logits = {0.3f, 1.2f, -0.5f, 0.9f, 1.1f, 0.0f, -2.0f, 0.7f};
  struct Row {
    float temperature, top_p, min_p, frequency;
    int top_k;
  };
  for (const Row& row : {Row{1.0f, 1.0f, 0.0f, 0.0f, -1}, Row{0.7f, 1.0f, 0.0f, 0.0f, 3},
                         Row{1.3f, 0.8f, 0.0f, 0.0f, -1}, Row{0.9f, 1.0f, 0.3f, 0.0f, -1},
                         Row{1.0f, 0.9f, 0.0f, 0.5f, 5}}) {
    StepInputs in;
    SamplingRow s;
    s.temperature = row.temperature;
    s.top_k = row.top_k;
    s.top_p = row.top_p;
    s.min_p = row.min_p;
    s.frequency_penalty = row.frequency;
    in.sampling.push_back(s);
    in.history_tokens = {1, 1, 4};  // output tokens: the penalty hits 1 twice and 4 once
    in.history_start = {0, 3};
    in.num_prompt_history = {0};
    in.logits_rows = {0};
    std::vector<float> processed;
    const std::vector<float> p = TokenDistribution(logits.data(), kVocab, in, 0, &processed);
    EXPECT_FLOAT_EQ(processed[1], logits[1] - 2 * row.frequency);

    constexpr int kDraws = 40000;
    std::vector<float> rows(static_cast<size_t>(kDraws) * kVocab);
    for (int i = 0; i < kDraws; ++i) {
      std::copy(processed.begin(), processed.end(), rows.begin() + i * kVocab);
    }
    std::vector<float> temperature(kDraws, row.temperature), top_p(kDraws, row.top_p),
        min_p(kDraws, row.min_p);
    std::vector<int32_t> top_k(kDraws, row.top_k), out(kDraws);
    std::vector<uint64_t> seeds(kDraws, 11), steps(kDraws);
    for (int i = 0; i < kDraws; ++i) steps[i] = i;
    SamplingRef(SamplingArgs{rows.data(), temperature.data(), top_k.data(), top_p.data(),
                             min_p.data(), seeds.data(), steps.data(), out.data(), kDraws, kVocab});
    std::vector<int> counts(kVocab);
    for (int32_t t : out) ++counts[t];
    for (int v = 0; v < kVocab; ++v) {
      const double sigma = std::sqrt(kDraws * p[v] * (1 - p[v])) + 1e-9;
      EXPECT_LE(std::abs(counts[v] - kDraws * p[v]), 4 * sigma + 0.5)
          << "token " << v << " temperature " << row.temperature << " top_k " << row.top_k
          << " top_p " << row.top_p << " min_p " << row.min_p;
    }
  }
  StepInputs greedy;
  SamplingRow g;
  g.temperature = 0.0f;
  greedy.sampling.push_back(g);
  const std::vector<float> p = TokenDistribution(logits.data(), kVocab, greedy, 0);
  EXPECT_EQ(p[1], 1.0f);
  EXPECT_EQ(DrawToken(p, 0.999), 1);
  EXPECT_EQ(DrawToken({0.25f, 0.0f, 0.75f}, 0.2), 0);
  EXPECT_EQ(DrawToken({0.25f, 0.0f, 0.75f}, 0.3), 2);
}

}  // namespace
}  // namespace tandem
