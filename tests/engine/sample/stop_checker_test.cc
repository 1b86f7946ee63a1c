#include "engine/sample/stop_checker.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/engine/fake_tokenizer.h"

namespace tandem {
namespace {

using testing::FakeTokenizer;

constexpr int kEos = 30;  // decodes to "<s30>", a special token

// Feeds `tokens` (ids; id i reads as 'a' + i % 26) and returns the emitted text and the finish
// reason; *consumed gets how many tokens were fed before the request finished.
struct Fed {
  std::string text;
  FinishReason reason = FinishReason::kNone;
  int consumed = 0;
};
Fed Feed(StopChecker& checker, const std::vector<int32_t>& tokens, int prompt_len = 3,
         int max_model_len = 1000) {
  Fed run;
  for (int32_t t : tokens) {
    ++run.consumed;
    StopChecker::Result r = checker.Add(t, run.consumed, prompt_len + run.consumed, max_model_len);
    run.text += r.text;
    if (r.finish_reason != FinishReason::kNone) {
      run.reason = r.finish_reason;
      break;
    }
  }
  return run;
}

std::vector<int32_t> Ids(const std::string& letters) {
  std::vector<int32_t> ids;
  for (char c : letters) ids.push_back(c - 'a');
  return ids;
}

class StopCheckerTest : public ::testing::Test {
 protected:
  FakeTokenizer tokenizer_{40, {kEos}};
};

TEST_F(StopCheckerTest, StopStringAndWhatFollowsAreNotEmitted) {
  SamplingParams p;
  p.max_tokens = 100;
  p.stop = {"cde"};
  StopChecker checker(p, {kEos}, &tokenizer_);
  Fed run = Feed(checker, Ids("abcdefg"));
  EXPECT_EQ(run.text, "ab");
  EXPECT_EQ(run.reason, FinishReason::kStop);
  EXPECT_EQ(run.consumed, 5);
}

TEST_F(StopCheckerTest, TextThatMayStartAStopStringIsHeldBackThenReleased) {
  SamplingParams p;
  p.max_tokens = 100;
  p.stop = {"xyz"};
  StopChecker checker(p, {kEos}, &tokenizer_);
  EXPECT_EQ(checker.Add(Ids("a")[0], 1, 4, 1000).text, "a");
  EXPECT_EQ(checker.Add(Ids("x")[0], 2, 5, 1000).text, "");     // could be "xyz"
  EXPECT_EQ(checker.Add(Ids("y")[0], 3, 6, 1000).text, "");     // still could
  EXPECT_EQ(checker.Add(Ids("b")[0], 4, 7, 1000).text, "xyb");  // no longer
}

TEST_F(StopCheckerTest, ReleaseHeldTextHandsOverWhatWasHeld) {
  SamplingParams p;
  p.max_tokens = 100;
  p.stop = {"bq"};
  StopChecker checker(p, {kEos}, &tokenizer_);
  EXPECT_EQ(checker.Add(Ids("a")[0], 1, 4, 1000).text, "a");
  EXPECT_EQ(checker.Add(Ids("b")[0], 2, 5, 1000).text, "");
  EXPECT_EQ(checker.ReleaseHeldText(), "b");
  EXPECT_EQ(checker.Add(Ids("c")[0], 3, 6, 1000).text, "c");
}

TEST_F(StopCheckerTest, HeldTextIsFlushedWhenMaxTokensEnds) {
  SamplingParams p;
  p.max_tokens = 3;
  p.stop = {"cz"};
  StopChecker checker(p, {kEos}, &tokenizer_);
  Fed run = Feed(checker, Ids("abcd"));
  EXPECT_EQ(run.text, "abc");
  EXPECT_EQ(run.reason, FinishReason::kLength);
  EXPECT_EQ(run.consumed, 3);
}

TEST_F(StopCheckerTest, StopTokenIdsAndEos) {
  SamplingParams p;
  p.max_tokens = 100;
  p.stop_token_ids = {Ids("d")[0]};
  StopChecker checker(p, {kEos}, &tokenizer_);
  Fed run = Feed(checker, Ids("abcdef"));
  EXPECT_EQ(run.text, "abc");  // the stop token's own text is not emitted
  EXPECT_EQ(run.reason, FinishReason::kStop);
  EXPECT_EQ(run.consumed, 4);

  StopChecker eos_checker(p, {kEos}, &tokenizer_);
  run = Feed(eos_checker, {0, 1, kEos, 2});
  EXPECT_EQ(run.text, "ab");
  EXPECT_EQ(run.reason, FinishReason::kStop);
  EXPECT_EQ(run.consumed, 3);
}

TEST_F(StopCheckerTest, IgnoreEosRunsToMaxTokensButStopIdsStillApply) {
  SamplingParams p;
  p.max_tokens = 4;
  p.ignore_eos = true;
  StopChecker checker(p, {kEos}, &tokenizer_);
  Fed run = Feed(checker, {0, kEos, 1, 2, 3});
  EXPECT_EQ(run.reason, FinishReason::kLength);
  EXPECT_EQ(run.consumed, 4);
  EXPECT_EQ(run.text, "abc");  // special tokens are skipped in text

  p.stop_token_ids = {kEos};
  StopChecker with_ids(p, {kEos}, &tokenizer_);
  EXPECT_EQ(Feed(with_ids, {0, kEos, 1}).reason, FinishReason::kStop);
}

TEST_F(StopCheckerTest, MaxModelLenEndsTheRequest) {
  SamplingParams p;
  p.max_tokens = 100;
  StopChecker checker(p, {}, nullptr);  // no tokenizer: no text at all
  Fed run = Feed(checker, Ids("abcdefgh"), /*prompt_len=*/3, /*max_model_len=*/6);
  EXPECT_EQ(run.reason, FinishReason::kLength);
  EXPECT_EQ(run.consumed, 3);
  EXPECT_EQ(run.text, "");
}

TEST_F(StopCheckerTest, EarliestOfSeveralStopStringsWins) {
  SamplingParams p;
  p.max_tokens = 100;
  p.stop = {"fg", "bcd", "c"};
  StopChecker checker(p, {}, &tokenizer_);
  Fed run = Feed(checker, Ids("abcdefg"));
  EXPECT_EQ(run.text, "ab");  // "c" completes at token 3, before "bcd" could
  EXPECT_EQ(run.consumed, 3);
}

}  // namespace
}  // namespace tandem
