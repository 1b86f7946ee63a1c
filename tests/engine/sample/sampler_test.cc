#include "engine/sample/sampler.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(SamplerTest, GreedyPicksTheArgmax) {
  Sampler sampler(Backend::kCpu);
  const std::vector<float> logits = {0.1f, 0.9f, 0.3f, 5.0f, -1.0f, 2.0f};
  std::vector<SampleRow> rows(2);
  rows[0].temperature = rows[1].temperature = 0.0f;
  absl::StatusOr<std::vector<int32_t>> tokens = sampler.Sample(logits.data(), 3, rows);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ((*tokens)[0], 1);
  EXPECT_EQ((*tokens)[1], 0);
}

TEST(SamplerTest, RandomDrawDependsOnSeedAndStepNotOnTheBatch) {
  constexpr int kVocab = 50;
  std::mt19937 rng(7);
  std::normal_distribution<float> dist;
  std::vector<float> row(kVocab);
  for (float& x : row) x = dist(rng);
  Sampler sampler(Backend::kCpu);
  SampleRow r{1.0f, -1, 1.0f, /*seed=*/42, /*step=*/3};
  const int32_t alone = (*sampler.Sample(row.data(), kVocab, {r}))[0];
  // The same row in the middle of a batch of others.
  std::vector<float> batch;
  std::vector<SampleRow> rows;
  for (int i = 0; i < 5; ++i) {
    for (float x : row) batch.push_back(i == 2 ? x : dist(rng));
    rows.push_back(i == 2 ? r : SampleRow{0.7f, 5, 0.9f, static_cast<uint64_t>(i), 0});
  }
  EXPECT_EQ((*sampler.Sample(batch.data(), kVocab, rows))[2], alone);
  // Different steps give different draws (most of the time: over 20 steps, not all equal).
  int same = 0;
  for (uint64_t step = 0; step < 20; ++step) {
    r.step = step;
    same += (*sampler.Sample(row.data(), kVocab, {r}))[0] == alone;
  }
  EXPECT_LT(same, 20);
}

TEST(SamplerTest, ValidatesParams) {
  SamplingParams p;
  EXPECT_TRUE(ValidateSamplingParams(p).ok());
  p.temperature = -1;
  EXPECT_EQ(ValidateSamplingParams(p).code(), absl::StatusCode::kInvalidArgument);
  p = SamplingParams();
  p.top_p = 0;
  EXPECT_EQ(ValidateSamplingParams(p).code(), absl::StatusCode::kInvalidArgument);
  p = SamplingParams();
  p.max_tokens = 0;
  EXPECT_EQ(ValidateSamplingParams(p).code(), absl::StatusCode::kInvalidArgument);
}

TEST(SamplerTest, SeedFromIdIsStableAndDistinct) {
  EXPECT_EQ(SeedFromRequestId("req-1"), SeedFromRequestId("req-1"));
  EXPECT_NE(SeedFromRequestId("req-1"), SeedFromRequestId("req-2"));
}

}  // namespace
}  // namespace tandem
