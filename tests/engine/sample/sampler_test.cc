// The engine's side of a request's sampling: parameter validation and the seed of a request.
#include "engine/sample/sampler.h"

#include <cmath>
#include <functional>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/logprobs/logprobs.h"

namespace tandem {
namespace {

TEST(SamplerTest, ValidatesParams) {
  SamplingParams p;
  EXPECT_TRUE(ValidateSamplingParams(p).ok());
  const std::vector<std::function<void(SamplingParams&)>> breakers = {
      [](SamplingParams& s) { s.temperature = -1; },
      [](SamplingParams& s) { s.temperature = NAN; },
      [](SamplingParams& s) { s.top_p = 0; },
      [](SamplingParams& s) { s.top_p = 1.5f; },
      [](SamplingParams& s) { s.min_p = -0.1f; },
      [](SamplingParams& s) { s.min_p = 1.1f; },
      [](SamplingParams& s) { s.repetition_penalty = 0; },
      [](SamplingParams& s) { s.frequency_penalty = 2.5f; },
      [](SamplingParams& s) { s.presence_penalty = -3; },
      [](SamplingParams& s) { s.max_tokens = 0; },
      [](SamplingParams& s) { s.min_tokens = 17; },  // > max_tokens (16)
      [](SamplingParams& s) { s.min_tokens = -1; },
      [](SamplingParams& s) { s.logprobs = kMaxTopLogprobs + 1; },
      [](SamplingParams& s) { s.logprobs = -2; },
      [](SamplingParams& s) {
        s.logit_bias = {{1, 101.0f}};
      },
      [](SamplingParams& s) {
        s.logit_bias.assign(kMaxLogitBias + 1, {1, 1.0f});
      },
  };
  for (size_t i = 0; i < breakers.size(); ++i) {
    SamplingParams bad;
    breakers[i](bad);
    EXPECT_EQ(ValidateSamplingParams(bad).code(), absl::StatusCode::kInvalidArgument) << i;
  }
}

TEST(SamplerTest, SeedFromIdIsStableAndDistinct) {
  EXPECT_EQ(SeedFromRequestId("req-1"), SeedFromRequestId("req-1"));
  EXPECT_NE(SeedFromRequestId("req-1"), SeedFromRequestId("req-2"));
}

}  // namespace
}  // namespace tandem
