// StopChecker: stop token ids and EOS end a request with kStop (unless ignore_eos, which stop
// token ids override), max_tokens and max_model_len with kLength, whichever comes first. The
// text side of stopping (stop strings, what is emitted) is tests/tokenizer/
// text_stream_test.cc.
#include "engine/sample/stop_checker.h"

#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

constexpr int kEos = 30;

// Feeds `tokens` as the output of a request with a `prompt_len`-token prompt; returns the
// finish reason and how many tokens were fed before the request finished.
struct Fed {
  FinishReason reason = FinishReason::kNone;
  int consumed = 0;
};
Fed Feed(const StopChecker& checker, const SamplingParams& p, const std::vector<int32_t>& tokens,
         int prompt_len = 3, int max_model_len = 1000) {
  Fed run;
  for (int32_t t : tokens) {
    ++run.consumed;
    run.reason = checker.Check(p, t, run.consumed, prompt_len + run.consumed, max_model_len);
    if (run.reason != FinishReason::kNone) break;
  }
  return run;
}

TEST(StopCheckerTest, MaxTokensEndsWithLength) {
  SamplingParams p;
  p.max_tokens = 3;
  Fed run = Feed(StopChecker({kEos}), p, {0, 1, 2, 3});
  EXPECT_EQ(run.reason, FinishReason::kLength);
  EXPECT_EQ(run.consumed, 3);

  p.max_tokens = 1;  // the prefill worker's single token
  EXPECT_EQ(Feed(StopChecker({kEos}), p, {5, 6}).consumed, 1);
}

TEST(StopCheckerTest, StopTokenIdsAndEos) {
  SamplingParams p;
  p.max_tokens = 100;
  p.stop_token_ids = {3};
  const StopChecker checker({kEos});
  Fed run = Feed(checker, p, {0, 1, 2, 3, 4, 5});
  EXPECT_EQ(run.reason, FinishReason::kStop);
  EXPECT_EQ(run.consumed, 4);

  run = Feed(checker, p, {0, 1, kEos, 2});
  EXPECT_EQ(run.reason, FinishReason::kStop);
  EXPECT_EQ(run.consumed, 3);

  // A stop token that is also the max_tokens-th: kStop wins.
  p.max_tokens = 4;
  EXPECT_EQ(Feed(checker, p, {0, 1, 2, 3}).reason, FinishReason::kStop);
}

TEST(StopCheckerTest, IgnoreEosRunsToMaxTokensButStopIdsStillApply) {
  SamplingParams p;
  p.max_tokens = 4;
  p.ignore_eos = true;
  const StopChecker checker({kEos});
  Fed run = Feed(checker, p, {0, kEos, 1, 2, 3});
  EXPECT_EQ(run.reason, FinishReason::kLength);
  EXPECT_EQ(run.consumed, 4);

  p.stop_token_ids = {kEos};
  EXPECT_EQ(Feed(checker, p, {0, kEos, 1}).reason, FinishReason::kStop);
}

TEST(StopCheckerTest, SeveralEosIds) {
  SamplingParams p;
  p.max_tokens = 100;
  const StopChecker checker({kEos, kEos + 1});
  EXPECT_EQ(Feed(checker, p, {0, kEos + 1, 1}).consumed, 2);
  EXPECT_EQ(Feed(StopChecker({}), p, {0, kEos, 1}).reason, FinishReason::kNone);  // no EOS known
}

TEST(StopCheckerTest, MaxModelLenEndsTheRequest) {
  SamplingParams p;
  p.max_tokens = 100;
  Fed run = Feed(StopChecker({}), p, {0, 1, 2, 3, 4, 5, 6, 7}, /*prompt_len=*/3,
                 /*max_model_len=*/6);
  EXPECT_EQ(run.reason, FinishReason::kLength);
  EXPECT_EQ(run.consumed, 3);
}

}  // namespace
}  // namespace tandem
