// Verify-graph padding (engine/model/step_padding.h): which steps qualify, the padded layout, and
// on the CPU backend that a padded step computes exactly the unpadded step's logits rows and
// leaves the KV pool byte for byte as the unpadded step does (dummy tokens store nothing).
#include "engine/model/step_padding.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "base/check.h"
#include "engine/model/make_model.h"
#include "engine/model/model.h"
#include "tests/engine/model/model_test_util.h"

namespace tandem {
namespace {

constexpr int kPage = 4;

// Sequence s of a step: `tokens` new tokens ending at position seq_len - 1 on pages `pages`;
// rows: every new token samples (verify) or only the last (a prefill chunk).
struct SeqSpec {
  std::vector<int32_t> tokens;
  int seq_len;
  std::vector<int32_t> pages;
  bool every_row;
};

StepInputs MakeStep(const std::vector<SeqSpec>& seqs) {
  StepInputs in;
  in.num_seqs = static_cast<int>(seqs.size());
  for (const SeqSpec& s : seqs) {
    in.max_pages_per_seq = std::max(in.max_pages_per_seq, static_cast<int>(s.pages.size()));
  }
  in.block_tables.assign(static_cast<size_t>(in.num_seqs) * in.max_pages_per_seq, 0);
  in.query_start.push_back(0);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SeqSpec& s = seqs[i];
    const int first = s.seq_len - static_cast<int>(s.tokens.size());
    for (size_t j = 0; j < s.tokens.size(); ++j) {
      const int pos = first + static_cast<int>(j);
      if (s.every_row || j + 1 == s.tokens.size()) {
        in.logits_rows.push_back(static_cast<int32_t>(in.token_ids.size()));
        // Penalties and a bias on real rows, so the padded rows' empty lists are exercised.
        in.sampling.push_back(SamplingRow{.temperature = 0.0f, .repetition_penalty = 1.3f});
      }
      in.token_ids.push_back(s.tokens[j]);
      in.positions.push_back(pos);
      in.slot_mapping.push_back(s.pages[pos / kPage] * kPage + pos % kPage);
    }
    in.query_start.push_back(static_cast<int32_t>(in.token_ids.size()));
    in.seq_lens.push_back(s.seq_len);
    std::copy(s.pages.begin(), s.pages.end(), in.block_tables.begin() + i * in.max_pages_per_seq);
  }
  in.num_tokens = static_cast<int64_t>(in.token_ids.size());
  in.history_start.push_back(0);
  in.bias_start.push_back(0);
  for (size_t r = 0; r < in.logits_rows.size(); ++r) {
    in.history_tokens.push_back(static_cast<int32_t>(3 + r));
    in.history_start.push_back(static_cast<int32_t>(in.history_tokens.size()));
    in.num_prompt_history.push_back(0);
    in.bias_tokens.push_back(static_cast<int32_t>(r));
    in.bias_values.push_back(0.5f);
    in.bias_start.push_back(static_cast<int32_t>(in.bias_tokens.size()));
  }
  return in;
}

TEST(StepPaddingTest, OnlyStepsWhoseEveryTokenSamplesAreVerifyShaped) {
  const StepInputs verify = MakeStep({{{5, 6, 7}, 9, {3, 1, 4}, true}, {{8}, 2, {2}, true}});
  EXPECT_TRUE(IsVerifyShaped(verify, 3));
  EXPECT_FALSE(IsVerifyShaped(verify, 2));  // a chunk longer than the graph's 1 + k
  const StepInputs prefill = MakeStep({{{5, 6, 7}, 3, {3}, false}, {{8}, 2, {2}, true}});
  EXPECT_FALSE(IsVerifyShaped(prefill, 8));
  EXPECT_FALSE(IsVerifyShaped(StepInputs{}, 8));
}

TEST(StepPaddingTest, DummySequencesFollowTheRealOnesAndStoreNothing) {
  const StepInputs in = MakeStep({{{5, 6, 7}, 9, {3, 1, 4}, true}, {{8}, 2, {2}, true}});
  // 2 real sequences, 4 real tokens -> 4 sequences, 15 tokens: dummies of 10 and 1 tokens.
  const StepInputs p = PadWithDummySequences(in, 4, 15, kPage);
  EXPECT_TRUE(p.attention_by_prefill_kernel);
  EXPECT_EQ(p.num_seqs, 4);
  EXPECT_EQ(p.num_tokens, 15);
  EXPECT_EQ(p.query_start, (std::vector<int32_t>{0, 3, 4, 14, 15}));
  EXPECT_EQ(p.seq_lens, (std::vector<int32_t>{9, 2, 10, 1}));
  // The longest dummy needs 3 pages of 4 tokens: the stride grows from 3 to 3 (10 tokens).
  EXPECT_EQ(p.max_pages_per_seq, 3);
  for (int64_t t = 0; t < 4; ++t) {
    EXPECT_EQ(p.token_ids[t], in.token_ids[t]);
    EXPECT_EQ(p.positions[t], in.positions[t]);
    EXPECT_EQ(p.slot_mapping[t], in.slot_mapping[t]);
  }
  for (int64_t t = 4; t < 15; ++t) EXPECT_EQ(p.slot_mapping[t], -1) << t;
  ASSERT_EQ(p.logits_rows.size(), 15u);
  for (int64_t r = 0; r < 15; ++r) EXPECT_EQ(p.logits_rows[r], r);
  ASSERT_EQ(p.sampling.size(), 15u);
  EXPECT_EQ(p.sampling[3].repetition_penalty, 1.3f);
  EXPECT_EQ(p.sampling[4].repetition_penalty, 1.0f);
  EXPECT_EQ(p.sampling[4].temperature, 0.0f);
  // Real rows keep their lists; dummy rows have empty ones at the end.
  EXPECT_EQ(p.history_tokens, in.history_tokens);
  ASSERT_EQ(p.history_start.size(), 16u);
  for (int r = 0; r <= 4; ++r) EXPECT_EQ(p.history_start[r], in.history_start[r]);
  for (int r = 5; r <= 15; ++r) EXPECT_EQ(p.history_start[r], 4);
  for (int r = 5; r <= 15; ++r) EXPECT_EQ(p.bias_start[r], 4);
  // Block tables: the real rows at the new stride, dummies on page 0.
  EXPECT_EQ(std::vector<int32_t>(p.block_tables.begin(), p.block_tables.begin() + 6),
            (std::vector<int32_t>{3, 1, 4, 2, 0, 0}));
  // A longer dummy widens the stride.
  EXPECT_EQ(PadWithDummySequences(in, 3, 30, kPage).max_pages_per_seq, 7);
  EXPECT_EQ(PaddedPagesPerSeq(in, 3, 30, kPage), 7);
}

// The real rows of a padded step are the unpadded step's, bit for bit, and the pool is the same.
TEST(StepPaddingTest, PaddedStepComputesTheSameRowsAndPool) {
  const std::string dir = testing_util::NewTempDir("padding");
  CHECK_OK(MakeModel({.preset = "tiny", .out_dir = dir, .seed = 3}).status());
  absl::StatusOr<std::unique_ptr<Model>> model = LoadModel(dir, Backend::kCpu);
  ASSERT_TRUE(model.ok()) << model.status();
  const int vocab = (*model)->config().vocab_size;
  KvLayout layout = (*model)->KvPoolLayout(kPage);
  layout.num_pages = 8;
  std::vector<uint8_t> pool(layout.PoolBytes(), 0);
  // Prefill: sequence 0 has 6 prompt tokens on pages 3, 1; sequence 1 has 1 on page 2.
  std::vector<float> logits(8 * static_cast<size_t>(vocab));
  ASSERT_TRUE((*model)
                  ->ComputeLogits(MakeStep({{{11, 12, 13, 14, 15, 16}, 6, {3, 1}, false},
                                            {{17}, 1, {2}, false}}),
                                  layout, pool.data(), logits.data())
                  .ok());
  // Verify: sequence 0 the next token + 2 proposals (positions 6-8, the third page 4), sequence 1
  // a plain decode.
  const StepInputs in = MakeStep({{{18, 19, 20}, 9, {3, 1, 4}, true}, {{21}, 2, {2}, true}});
  const std::vector<uint8_t> before = pool;
  std::vector<float> plain(4 * static_cast<size_t>(vocab));
  ASSERT_TRUE((*model)->ComputeLogits(in, layout, pool.data(), plain.data()).ok());
  const std::vector<uint8_t> after_plain = pool;
  pool = before;
  const StepInputs padded = PadWithDummySequences(in, 4, 11, kPage);
  std::vector<float> pad(11 * static_cast<size_t>(vocab));
  ASSERT_TRUE((*model)->ComputeLogits(padded, layout, pool.data(), pad.data()).ok());
  EXPECT_EQ(0, std::memcmp(plain.data(), pad.data(), plain.size() * sizeof(float)));
  EXPECT_TRUE(pool == after_plain) << "a dummy token wrote KV";
  EXPECT_FALSE(after_plain == before);  // the real tokens did write
  // And the sampled tokens of the real rows agree (Step samples on the backend).
  pool = before;
  absl::StatusOr<StepOutput> a = (*model)->Step(in, layout, pool.data());
  ASSERT_TRUE(a.ok()) << a.status();
  pool = before;
  absl::StatusOr<StepOutput> b = (*model)->Step(padded, layout, pool.data());
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->tokens.size(), 11u);
  EXPECT_EQ(a->tokens, std::vector<int32_t>(b->tokens.begin(), b->tokens.begin() + 4));
}

}  // namespace
}  // namespace tandem
