#include "engine/runner/model_runner.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;

Sequence MakeSeq(int num_tokens, int num_computed, std::vector<int32_t> pages) {
  Sequence seq;
  for (int i = 0; i < num_tokens; ++i) seq.tokens.push_back(100 + i);
  seq.num_prompt_tokens = num_tokens;
  seq.num_computed_tokens = num_computed;
  seq.block_table = std::move(pages);
  return seq;
}

TEST(BuildStepInputsTest, RaggedBatchOfDecodeAndPrefillChunks) {
  // page_size 4. A decodes token 5 (positions 0-4 in pages 7, 2); B runs a mid-prompt chunk
  // (tokens 2..4 of 9: no sample); C runs its final chunk (tokens 4..5 of 6, pages 5, 0).
  Sequence a = MakeSeq(6, 5, {7, 2});
  Sequence b = MakeSeq(9, 2, {3, 9});
  Sequence c = MakeSeq(6, 4, {5, 0});
  ScheduleDecision d;
  d.chunks = {{&a, 1, 0}, {&b, 3, 0}, {&c, 2, 0}};
  std::vector<int> sampling;
  StepInputs in = BuildStepInputs(d, /*page_size=*/4, /*eos_token_ids=*/{}, &sampling);
  EXPECT_EQ(in.num_seqs, 3);
  EXPECT_EQ(in.num_tokens, 6);
  EXPECT_THAT(in.token_ids, ElementsAre(105, 102, 103, 104, 104, 105));
  EXPECT_THAT(in.positions, ElementsAre(5, 2, 3, 4, 4, 5));
  EXPECT_THAT(in.slot_mapping,
              ElementsAre(2 * 4 + 1, 3 * 4 + 2, 3 * 4 + 3, 9 * 4 + 0, 0 * 4 + 0, 0 * 4 + 1));
  EXPECT_THAT(in.query_start, ElementsAre(0, 1, 4, 6));
  EXPECT_THAT(in.seq_lens, ElementsAre(6, 5, 6));
  EXPECT_EQ(in.max_pages_per_seq, 2);
  EXPECT_THAT(in.block_tables, ElementsAre(7, 2, 3, 9, 5, 0));
  EXPECT_THAT(in.logits_rows, ElementsAre(0, 5));
  EXPECT_THAT(sampling, ElementsAre(0, 2));
  // One sampling row per logits row, with its sequence's step (tokens sampled before).
  ASSERT_EQ(in.sampling.size(), 2u);
  EXPECT_EQ(in.sampling[0].step, static_cast<uint64_t>(a.num_output_tokens()));
  EXPECT_EQ(in.sampling[1].step, static_cast<uint64_t>(c.num_output_tokens()));
  EXPECT_THAT(in.history_start, ElementsAre(0, 0, 0));
  EXPECT_THAT(in.bias_start, ElementsAre(0, 0, 0));
}

TEST(BuildStepInputsTest, BlockTablesArePaddedToTheLongest) {
  Sequence a = MakeSeq(1, 0, {4});
  Sequence b = MakeSeq(9, 8, {1, 2, 3});
  ScheduleDecision d;
  d.chunks = {{&a, 1, 0}, {&b, 1, 0}};
  std::vector<int> sampling;
  StepInputs in = BuildStepInputs(d, /*page_size=*/4, /*eos_token_ids=*/{}, &sampling);
  EXPECT_EQ(in.max_pages_per_seq, 3);
  EXPECT_THAT(in.block_tables, ElementsAre(4, 0, 0, 1, 2, 3));
  EXPECT_THAT(in.slot_mapping, ElementsAre(16, 12));
  EXPECT_THAT(in.logits_rows, ElementsAre(0, 1));
}

}  // namespace
}  // namespace tandem
