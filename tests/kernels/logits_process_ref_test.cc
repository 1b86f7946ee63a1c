// LogitsProcessRef: a hand-computed row, then random batches against the naive per-token
// implementation (bit for bit), rows with nothing to do, bad lists, and argument validation.
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/logits_process/logits_process.h"
#include "tests/kernels/logits_test_util.h"

namespace tandem {
namespace {

using testing::kInf;
using testing::MakeProcessBatch;
using testing::NaiveLogitsProcess;
using testing::ProcessBatch;
using testing::SameFloat;

void ExpectSameRows(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(SameFloat(got[i], want[i])) << "at " << i << ": " << got[i] << " vs " << want[i];
  }
}

// One row, every step, values exact in fp32 (so the expected row is written out by hand).
TEST(LogitsProcessRefTest, HandComputedRow) {
  std::vector<float> logits = {0.5f, 2.0f, -1.0f, 3.0f, 4.0f, -2.0f, 1.0f, 6.0f};
  const float rp = 2.0f, freq = 0.5f, pres = 0.25f;
  // Prompt {1, 2}, output {2, 3, 3, 5}: token 2 is in both parts, token 3 twice in the output.
  const std::vector<int32_t> history = {1, 2, 2, 3, 3, 5}, start = {0, 6}, prompt = {2};
  // Token 3 biased twice (both added, in order), token 7 forbidden.
  const std::vector<int32_t> bias_tokens = {3, 7, 3}, bias_start = {0, 3};
  const std::vector<float> bias_values = {1.0f, -kInf, 0.5f};
  LogitsProcessRef({.logits = logits.data(),
                    .batch = 1,
                    .vocab_size = 8,
                    .repetition_penalty = &rp,
                    .frequency_penalty = &freq,
                    .presence_penalty = &pres,
                    .history_tokens = history.data(),
                    .history_start = start.data(),
                    .num_prompt_history = prompt.data(),
                    .bias_tokens = bias_tokens.data(),
                    .bias_values = bias_values.data(),
                    .bias_start = bias_start.data()});
  // 1: 2 / 2. 2: -1 * 2 - (0.5 + 0.25). 3: 3 / 2 - (0.5 * 2 + 0.25) + 1 + 0.5. 5: -2 * 2 - 0.75.
  const std::vector<float> want = {0.5f, 1.0f, -2.75f, 1.75f, 4.0f, -4.75f, 1.0f, -kInf};
  ExpectSameRows(logits, want);
}

TEST(LogitsProcessRefTest, MatchesNaiveOnRandomBatches) {
  std::mt19937_64 rng(7);
  for (int64_t vocab : {1, 7, 1000, 32000}) {
    for (int64_t batch : {1, 3, 17, 40}) {
      SCOPED_TRACE(::testing::Message() << "batch " << batch << " vocab " << vocab);
      ProcessBatch b = MakeProcessBatch(batch, vocab, rng);
      const std::vector<float> want = NaiveLogitsProcess(b);
      LogitsProcessRef(b.Args());
      ExpectSameRows(b.logits, want);
    }
  }
}

TEST(LogitsProcessRefTest, OffValuesAndNullArraysLeaveRowsUntouched) {
  std::mt19937_64 rng(8);
  ProcessBatch b = MakeProcessBatch(9, 100, rng);
  const std::vector<float> before = b.logits;
  std::fill(b.rp.begin(), b.rp.end(), 1.0f);
  std::fill(b.freq.begin(), b.freq.end(), 0.0f);
  std::fill(b.pres.begin(), b.pres.end(), 0.0f);
  LogitsProcessArgs args = b.Args();
  args.bias_start = nullptr;  // histories kept, penalties off, no bias
  LogitsProcessRef(args);
  ExpectSameRows(b.logits, before);
  LogitsProcessRef({.logits = b.logits.data(), .batch = 9, .vocab_size = 100});
  ExpectSameRows(b.logits, before);
}

// Null penalty arrays are "off"; a null num_prompt_history makes every history token an output
// token (so frequency counts all of them).
TEST(LogitsProcessRefTest, NullPenaltiesAndPromptCount) {
  std::vector<float> logits = {1.0f, 1.0f, 1.0f, 1.0f};
  const float freq = 1.0f;
  const std::vector<int32_t> history = {0, 0, 2}, start = {0, 3};
  LogitsProcessRef({.logits = logits.data(),
                    .batch = 1,
                    .vocab_size = 4,
                    .frequency_penalty = &freq,
                    .history_tokens = history.data(),
                    .history_start = start.data()});
  ExpectSameRows(logits, {-1.0f, 1.0f, 0.0f, 1.0f});
}

// Offsets that go backwards or start below 0 give empty lists; ids outside the vocabulary and
// prompt counts outside [0, length] are skipped or clamped, never read or written out of bounds.
TEST(LogitsProcessRefTest, BadListsAreSkipped) {
  std::vector<float> logits(3 * 5, 2.0f);
  const float rp[] = {2.0f, 2.0f, 2.0f}, pres[] = {1.0f, 1.0f, 1.0f};
  const std::vector<int32_t> history = {4, -1, 5, INT32_MAX, 1, 1};
  const std::vector<int32_t> start = {2, 0, 6, -5};  // row 0: [2, 0); row 1: [0, 6); row 2: bad
  const std::vector<int32_t> prompt = {0, -4, 99};
  const std::vector<int32_t> bias_tokens = {-7, 5, 3}, bias_start = {0, 3, 2, 3};
  const std::vector<float> bias_values = {1.0f, 1.0f, 1.0f};
  LogitsProcessRef({.logits = logits.data(),
                    .batch = 3,
                    .vocab_size = 5,
                    .repetition_penalty = rp,
                    .presence_penalty = pres,
                    .history_tokens = history.data(),
                    .history_start = start.data(),
                    .num_prompt_history = prompt.data(),
                    .bias_tokens = bias_tokens.data(),
                    .bias_values = bias_values.data(),
                    .bias_start = bias_start.data()});
  // Row 0: no history; bias [0, 3): ids -7 and 5 skipped, 3 gets +1.
  // Row 1: history {4, 1, 1} (prompt count -4 -> 0: all output): 2 / 2 - 1 = 0; bias [3, 2): none.
  // Row 2: history [6, -5): none; bias [2, 3): token 3 +1.
  const std::vector<float> want = {2, 2, 2, 3, 2, 2, 0, 2, 2, 0, 2, 2, 2, 3, 2};
  ExpectSameRows(logits, want);
}

TEST(LogitsProcessRefTest, ValidationRejectsBadArguments) {
  float x = 0.0f;
  const int32_t start[] = {0, 0};
  EXPECT_TRUE(ValidateLogitsProcessArgs({}).ok());  // batch 0
  EXPECT_EQ(ValidateLogitsProcessArgs({.batch = -1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateLogitsProcessArgs({.logits = &x, .batch = 1, .vocab_size = 0}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      ValidateLogitsProcessArgs({.logits = &x, .batch = 1, .vocab_size = int64_t{1} << 31}).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateLogitsProcessArgs({.batch = 1, .vocab_size = 1}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      ValidateLogitsProcessArgs({.logits = &x, .batch = 1, .vocab_size = 1, .history_start = start})
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      ValidateLogitsProcessArgs(
          {.logits = &x, .batch = 1, .vocab_size = 1, .bias_tokens = start, .bias_start = start})
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ValidateLogitsProcessArgs({.logits = &x, .batch = 1, .vocab_size = 1}).ok());
}

}  // namespace
}  // namespace tandem
