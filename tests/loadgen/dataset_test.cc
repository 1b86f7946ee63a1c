#include "loadgen/dataset.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "gtest/gtest.h"
#include "loadgen/tokenizer_prompt_source.h"
#include "tokenizer/tokenizer.h"

namespace tandem::loadgen {
namespace {

std::string TempFile(const std::string& name, const std::string& text) {
  std::string path = testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(DatasetTest, RandomPromptsHaveTheRequestedTokenLengthsAndAreDeterministic) {
  auto source = MakeWordPromptSource();
  RandomDatasetOptions o;
  o.num_prompts = 50;
  o.input_len = 100;
  o.output_len = 20;
  o.seed = 3;
  auto a = RandomDataset(o, *source);
  auto b = RandomDataset(o, *source);
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ((*a)[i].prompt, (*b)[i].prompt);
    EXPECT_EQ((*a)[i].prompt_len, 100);
    EXPECT_EQ(source->Count((*a)[i].prompt), 100);  // one word = one token
    EXPECT_EQ((*a)[i].output_len, 20);
  }
  EXPECT_NE((*a)[0].prompt, (*a)[1].prompt);
}

// Multi-turn: turn t + 1 of a conversation resends turn t's prompt, an answer of output_len and
// a new user turn; conversations share their system prompt; requests come round by round.
TEST(DatasetTest, MultiTurnConversationsGrowAndShareSystemPrompts) {
  auto source = MakeWordPromptSource();
  MultiTurnOptions o;
  o.num_prompts = 11;  // 4 conversations of 3 turns, the last round one short
  o.turns = 3;
  o.system_len = 30;
  o.num_system_prompts = 2;
  o.user_len = 5;
  o.output_len = 7;
  o.seed = 4;
  absl::StatusOr<std::vector<RequestSpec>> specs = MultiTurnDataset(o, *source);
  ASSERT_TRUE(specs.ok()) << specs.status();
  ASSERT_EQ(specs->size(), 11u);
  const int conversations = 4;
  for (int i = 0; i < 11; ++i) {
    const RequestSpec& r = (*specs)[i];
    const int turn = i / conversations;
    EXPECT_EQ(r.prompt_len, 30 + 5 + turn * (7 + 5)) << i;
    EXPECT_EQ(source->Count(r.prompt), r.prompt_len) << i;
    EXPECT_EQ(r.output_len, 7);
    if (turn > 0) {
      const std::string& before = (*specs)[i - conversations].prompt;
      EXPECT_EQ(r.prompt.substr(0, before.size()), before) << i;  // the whole conversation
    }
  }
  // Conversations 0 and 2 share system prompt 0; 0 and 1 do not share one.
  auto words = [](const std::string& s, int n) {
    size_t at = 0;
    for (int k = 0; k < n && at != std::string::npos; ++k) at = s.find(' ', at + 1);
    return s.substr(0, at);
  };
  EXPECT_EQ(words((*specs)[0].prompt, 30), words((*specs)[2].prompt, 30));
  EXPECT_NE(words((*specs)[0].prompt, 30), words((*specs)[1].prompt, 30));
  EXPECT_NE((*specs)[0].prompt, (*specs)[2].prompt);  // their user turns differ
  o.turns = 0;
  EXPECT_EQ(MultiTurnDataset(o, *source).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DatasetTest, RangeRatioBoundsLengthsAndNormalIsClipped) {
  auto source = MakeWordPromptSource();
  RandomDatasetOptions o;
  o.num_prompts = 400;
  o.input_len = 100;
  o.output_len = 50;
  o.range_ratio = 0.5;
  auto uniform = RandomDataset(o, *source);
  ASSERT_TRUE(uniform.ok());
  std::set<int> seen;
  for (const RequestSpec& s : *uniform) {
    ASSERT_GE(s.prompt_len, 50);
    ASSERT_LE(s.prompt_len, 150);
    ASSERT_GE(s.output_len, 25);
    ASSERT_LE(s.output_len, 75);
    seen.insert(s.prompt_len);
  }
  EXPECT_GT(seen.size(), 50u);  // actually spread, not fixed
  o.normal = true;
  auto normal = RandomDataset(o, *source);
  ASSERT_TRUE(normal.ok());
  for (const RequestSpec& s : *normal) {
    ASSERT_GE(s.prompt_len, 1);
    ASSERT_LE(s.prompt_len, 200);
  }
  o.range_ratio = 1.0;
  EXPECT_FALSE(RandomDataset(o, *source).ok());
}

TEST(DatasetTest, PrefixesAreSharedExactlyAsAsked) {
  auto source = MakeWordPromptSource();
  RandomDatasetOptions o;
  o.num_prompts = 6;
  o.input_len = 40;
  o.output_len = 4;
  o.prefix_len = 10;
  o.prefix_sharing_ratio = 0.5;
  o.num_prefix_groups = 2;
  auto specs = RandomDataset(o, *source);
  ASSERT_TRUE(specs.ok());
  auto words = [](const std::string& s, int n) {
    size_t pos = 0;
    for (int i = 0; i < n && pos != std::string::npos; ++i) pos = s.find(' ', pos + 1);
    return s.substr(0, pos);
  };
  for (const RequestSpec& s : *specs) EXPECT_EQ(s.prompt_len, 50);
  // Same group (0, 2, 4): the first 10 + 20 words agree; groups 0 and 1 share only 10.
  EXPECT_EQ(words((*specs)[0].prompt, 30), words((*specs)[2].prompt, 30));
  EXPECT_EQ(words((*specs)[1].prompt, 30), words((*specs)[3].prompt, 30));
  EXPECT_EQ(words((*specs)[0].prompt, 10), words((*specs)[1].prompt, 10));
  EXPECT_NE(words((*specs)[0].prompt, 30), words((*specs)[1].prompt, 30));
  EXPECT_NE((*specs)[0].prompt, (*specs)[2].prompt);
}

TEST(DatasetTest, ShareGptTakesFirstTurnAndFiltersLikeVllm) {
  auto source = MakeWordPromptSource();
  std::string path = TempFile("sharegpt.json", R"([
    {"id":"a","conversations":[{"from":"human","value":"one two three four five"},
                               {"from":"gpt","value":"a b c d e f"}]},
    {"id":"short","conversations":[{"from":"human","value":"hi"},{"from":"gpt","value":"a b c d"}]},
    {"id":"single","conversations":[{"from":"human","value":"alone here for now"}]},
    {"id":"b","conversations":[{"from":"human","value":"w x y z"},{"from":"gpt","value":"1 2 3 4"}]}
  ])");
  auto specs = ShareGptDataset(path, 10, -1, 0, *source);
  ASSERT_TRUE(specs.ok()) << specs.status();
  ASSERT_EQ(specs->size(), 2u);  // "short" (prompt < 4) and "single" (one turn) dropped
  for (const RequestSpec& s : *specs) {
    if (s.prompt == "one two three four five") {
      EXPECT_EQ(s.prompt_len, 5);
      EXPECT_EQ(s.output_len, 6);
    } else {
      EXPECT_EQ(s.prompt, "w x y z");
      EXPECT_EQ(s.output_len, 4);
    }
  }
  auto fixed = ShareGptDataset(path, 1, 32, 0, *source);
  ASSERT_TRUE(fixed.ok());
  ASSERT_EQ(fixed->size(), 1u);
  EXPECT_EQ((*fixed)[0].output_len, 32);
  EXPECT_FALSE(ShareGptDataset(TempFile("bad.json", "{"), 1, -1, 0, *source).ok());
}

TEST(DatasetTest, MooncakeTraceKeepsTimestampsLengthsAndSharedBlocks) {
  auto source = MakeWordPromptSource();
  std::string path = TempFile("trace.jsonl",
                              "{\"timestamp\": 1000, \"input_length\": 6, \"output_length\": 3, "
                              "\"hash_ids\": [1, 2]}\n"
                              "{\"timestamp\": 1500, \"input_length\": 7, \"output_length\": 2, "
                              "\"hash_ids\": [1, 3]}\n"
                              "\n"
                              "{\"timestamp\": 4000, \"input_length\": 2, \"output_length\": 1, "
                              "\"hash_ids\": [9]}\n");
  TraceOptions o;
  o.block_size = 4;
  o.time_scale = 0.5;
  auto specs = MooncakeTraceDataset(path, o, *source);
  ASSERT_TRUE(specs.ok()) << specs.status();
  ASSERT_EQ(specs->size(), 3u);
  EXPECT_DOUBLE_EQ((*specs)[0].arrival_s, 0.0);
  EXPECT_DOUBLE_EQ((*specs)[1].arrival_s, 0.25);
  EXPECT_DOUBLE_EQ((*specs)[2].arrival_s, 1.5);
  EXPECT_TRUE((*specs)[0].has_arrival);
  EXPECT_EQ(source->Count((*specs)[0].prompt), 6);
  EXPECT_EQ(source->Count((*specs)[1].prompt), 7);
  EXPECT_EQ((*specs)[1].output_len, 2);
  // Hash id 1 is the first block (4 tokens) of both requests; the rest differs.
  auto block = [](const std::string& s) {
    size_t pos = 0;
    for (int i = 0; i < 4; ++i) pos = s.find(' ', pos + 1);
    return s.substr(0, pos);
  };
  EXPECT_EQ(block((*specs)[0].prompt), block((*specs)[1].prompt));
  EXPECT_NE((*specs)[0].prompt, (*specs)[1].prompt.substr(0, (*specs)[0].prompt.size()));
  o.num_prompts = 1;
  EXPECT_EQ(MooncakeTraceDataset(path, o, *source)->size(), 1u);
  EXPECT_FALSE(MooncakeTraceDataset(TempFile("bad.jsonl", "{\"x\":1}\n"), o, *source).ok());
}

TEST(DatasetTest, WithTheTargetTokenizerRandomPromptsHaveExactTokenLengths) {
  std::string dir = testing::TempDir() + "/lg_tokenizer";
  std::filesystem::create_directories(dir);
  TokenizerSpec spec;
  spec.vocab_size = 2048;
  ASSERT_TRUE(WriteTokenizerFiles(dir, TokenizerFamily::kLlama3, spec).ok());
  auto source = MakeTokenizerPromptSource(dir);
  ASSERT_TRUE(source.ok()) << source.status();
  auto tokenizer = Tokenizer::Load(dir);
  ASSERT_TRUE(tokenizer.ok());
  RandomDatasetOptions o;
  o.num_prompts = 20;
  o.input_len = 37;
  o.output_len = 4;
  auto specs = RandomDataset(o, **source);
  ASSERT_TRUE(specs.ok());
  for (const RequestSpec& s : *specs) {
    EXPECT_EQ((*tokenizer)->Encode(s.prompt, false).size(), 37u) << s.prompt;
    EXPECT_EQ(s.prompt_len, 37);
  }
  EXPECT_FALSE(MakeTokenizerPromptSource(dir + "/missing").ok());
}

}  // namespace
}  // namespace tandem::loadgen
