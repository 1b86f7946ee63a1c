// The sampling rows a step gets from its sequences: seed and step, parameters, penalty history,
// logit biases and the min_tokens bans; and a ban reaching the sampled token.
#include "engine/runner/sampling_rows.h"

#include <cmath>
#include <vector>

#include "engine/model/model.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

Sequence MakeSeq(std::vector<int32_t> prompt, std::vector<int32_t> output) {
  Sequence seq;
  seq.num_prompt_tokens = static_cast<int>(prompt.size());
  seq.tokens = prompt;
  seq.tokens.insert(seq.tokens.end(), output.begin(), output.end());
  seq.seed = 9;
  return seq;
}

StepInputs StartedInputs() {
  StepInputs in;
  in.history_start = {0};
  in.bias_start = {0};
  return in;
}

TEST(SamplingRowsTest, RowCarriesSeedStepAndParameters) {
  Sequence seq = MakeSeq({5, 6, 7}, {8, 9});
  seq.sampling.temperature = 0.5f;
  seq.sampling.top_k = 7;
  seq.sampling.min_p = 0.1f;
  seq.sampling.logprobs = 3;
  StepInputs in = StartedInputs();
  AppendSamplingRow(seq, {}, &in);
  ASSERT_EQ(in.sampling.size(), 1u);
  const SamplingRow& r = in.sampling[0];
  EXPECT_EQ(r.seed, 9u);
  EXPECT_EQ(r.step, 2u);  // two tokens sampled before this one
  EXPECT_EQ(r.temperature, 0.5f);
  EXPECT_EQ(r.top_k, 7);
  EXPECT_EQ(r.min_p, 0.1f);
  EXPECT_EQ(r.num_logprobs, 3);
  EXPECT_TRUE(in.history_tokens.empty());  // no penalties: no history travels
  EXPECT_EQ(in.history_start, (std::vector<int32_t>{0, 0}));
}

TEST(SamplingRowsTest, PenaltyHistoryHoldsThePromptOnlyForTheRepetitionPenalty) {
  Sequence seq = MakeSeq({5, 6}, {8});
  seq.sampling.frequency_penalty = 0.5f;
  StepInputs in = StartedInputs();
  AppendSamplingRow(seq, {}, &in);
  EXPECT_EQ(in.history_tokens, (std::vector<int32_t>{8}));
  EXPECT_EQ(in.num_prompt_history, (std::vector<int32_t>{0}));
  seq.sampling.repetition_penalty = 1.3f;
  AppendSamplingRow(seq, {}, &in);
  EXPECT_EQ(in.history_tokens, (std::vector<int32_t>{8, 5, 6, 8}));
  EXPECT_EQ(in.num_prompt_history, (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(in.history_start, (std::vector<int32_t>{0, 1, 4}));
}

TEST(SamplingRowsTest, MinTokensBansEosAndStopIdsUntilReached) {
  Sequence seq = MakeSeq({5}, {8});
  seq.sampling.min_tokens = 2;
  seq.sampling.stop_token_ids = {11};
  seq.sampling.logit_bias = {{3, 1.5f}};
  StepInputs in = StartedInputs();
  AppendSamplingRow(seq, /*eos_token_ids=*/{2}, &in);
  EXPECT_EQ(in.bias_tokens, (std::vector<int32_t>{3, 2, 11}));
  EXPECT_EQ(in.bias_values[0], 1.5f);
  EXPECT_EQ(in.bias_values[1], -INFINITY);
  EXPECT_EQ(in.bias_values[2], -INFINITY);
  // With two output tokens the minimum is reached: only the user's bias remains.
  seq.tokens.push_back(9);
  AppendSamplingRow(seq, {2}, &in);
  EXPECT_EQ(in.bias_start, (std::vector<int32_t>{0, 3, 4}));
  // ignore_eos: EOS is not a stop, so it is not banned either.
  seq.tokens.pop_back();
  seq.sampling.ignore_eos = true;
  AppendSamplingRow(seq, {2}, &in);
  EXPECT_EQ(std::vector<int32_t>(in.bias_tokens.begin() + 4, in.bias_tokens.end()),
            (std::vector<int32_t>{3, 11}));
}

TEST(SamplingRowsTest, MinTokensBanReachesTheSampledToken) {
  // EOS (id 1) is the argmax; min_tokens forbids it, so greedy takes the runner-up.
  Sequence seq = MakeSeq({0}, {});
  seq.sampling.temperature = 0.0f;
  seq.sampling.min_tokens = 1;
  StepInputs in = StartedInputs();
  in.num_seqs = in.num_tokens = 1;
  in.logits_rows = {0};
  AppendSamplingRow(seq, {1}, &in);
  std::vector<float> logits = {0.5f, 9.0f, 2.0f};
  EXPECT_EQ(SampleOnHost(in, 3, logits.data())->tokens[0], 2);
}

}  // namespace
}  // namespace tandem
