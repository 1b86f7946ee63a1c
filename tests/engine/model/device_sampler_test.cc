// The backend-neutral sampler over host logits (SampleOnHost: the CPU reference kernels through
// the same RunSampler the CUDA backend runs): greedy, the per-request seed and step, logprobs.
#include <cmath>
#include <random>
#include <vector>

#include "engine/model/model.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

// A step of `rows` logits rows (one per sequence), sampling rows as given.
StepInputs RowsStep(const std::vector<SamplingRow>& sampling) {
  StepInputs in;
  in.num_seqs = in.num_tokens = static_cast<int>(sampling.size());
  for (size_t i = 0; i < sampling.size(); ++i) in.logits_rows.push_back(static_cast<int32_t>(i));
  in.sampling = sampling;
  return in;
}

TEST(DeviceSamplerTest, GreedyPicksTheArgmax) {
  std::vector<float> logits = {0.1f, 0.9f, 0.3f, 5.0f, -1.0f, 2.0f};
  SamplingRow greedy;
  greedy.temperature = 0.0f;
  absl::StatusOr<StepOutput> out = SampleOnHost(RowsStep({greedy, greedy}), 3, logits.data());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->tokens, (std::vector<int32_t>{1, 0}));
  EXPECT_TRUE(out->token_logprobs.empty());  // nobody asked
}

TEST(DeviceSamplerTest, RandomDrawDependsOnSeedAndStepNotOnTheBatch) {
  constexpr int kVocab = 50;
  std::mt19937 rng(7);
  std::normal_distribution<float> dist;
  std::vector<float> row(kVocab);
  for (float& x : row) x = dist(rng);
  SamplingRow r;
  r.seed = 42;
  r.step = 3;
  std::vector<float> copy = row;
  const int32_t alone = SampleOnHost(RowsStep({r}), kVocab, copy.data())->tokens[0];
  // The same row in the middle of a batch of others.
  std::vector<float> batch;
  std::vector<SamplingRow> rows;
  for (int i = 0; i < 5; ++i) {
    for (float x : row) batch.push_back(i == 2 ? x : dist(rng));
    SamplingRow other;
    other.temperature = 0.7f;
    other.top_k = 5;
    other.top_p = 0.9f;
    other.seed = static_cast<uint64_t>(i);
    rows.push_back(i == 2 ? r : other);
  }
  EXPECT_EQ(SampleOnHost(RowsStep(rows), kVocab, batch.data())->tokens[2], alone);
  // Different steps give different draws (most of the time: over 20 steps, not all equal).
  int same = 0;
  for (uint64_t step = 0; step < 20; ++step) {
    r.step = step;
    copy = row;
    same += SampleOnHost(RowsStep({r}), kVocab, copy.data())->tokens[0] == alone;
  }
  EXPECT_LT(same, 20);
}

TEST(DeviceSamplerTest, LogprobsAreTheLogSoftmaxOfTheProcessedLogits) {
  std::vector<float> logits = {1.0f, 3.0f, 2.0f, -1.0f};
  SamplingRow r;
  r.temperature = 0.0f;
  r.num_logprobs = 2;
  absl::StatusOr<StepOutput> out = SampleOnHost(RowsStep({r}), 4, logits.data());
  ASSERT_TRUE(out.ok()) << out.status();
  double z = 0;
  for (float x : {1.0f, 3.0f, 2.0f, -1.0f}) z += std::exp(x);
  ASSERT_EQ(out->tokens[0], 1);
  EXPECT_NEAR(out->token_logprobs[0], 3.0 - std::log(z), 1e-5);
  ASSERT_EQ(out->top_tokens.size(), static_cast<size_t>(kMaxTopLogprobs));
  EXPECT_EQ(out->top_tokens[0], 1);
  EXPECT_EQ(out->top_tokens[1], 2);
  EXPECT_NEAR(out->top_logprobs[1], 2.0 - std::log(z), 1e-5);
}

}  // namespace
}  // namespace tandem
