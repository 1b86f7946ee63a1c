// Speculative decoding with automatic prefix caching on, over the FakeModel in kHash mode (every
// logits row hashes the (token, position) pairs it reads back from the pages, so a cached page
// holding the KV of a rejected proposal instead of the emitted token changes the tokens of every
// later request that reuses it): multi-turn conversations over shared system prompts, each turn
// resending the previous prompt and its answer (whose pages were filled by verify steps), give
// the same tokens as the engine with neither speculation nor the cache; also with a pool small
// enough to evict and preempt. Every run ends with the target's pages free or cached (clearing
// the cache frees them all) and the draft's pool free: it keeps no cache.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"

namespace tandem::testing {
namespace {

constexpr int kVocab = 101;
constexpr int kEos = 3;

EngineOptions Options(SpecMethod method, bool cache, int num_pages) {
  EngineOptions o;
  o.page_size = 4;
  o.num_pages = num_pages;
  o.max_num_seqs = 16;
  o.max_num_batched_tokens = 48;
  o.enable_prefix_caching = cache;
  o.speculative.method = method;
  o.speculative.num_speculative_tokens = method == SpecMethod::kNone ? 0 : 3;
  o.speculative.prompt_lookup_min = 1;
  o.speculative.prompt_lookup_max = 3;
  if (method == SpecMethod::kDraft) o.speculative.draft_model = "given";  // handed over, not read
  return o;
}

FakeModel::Options Model(FakeModel::Mode mode, uint64_t salt) {
  FakeModel::Options m;
  m.mode = mode;
  m.vocab_size = kVocab;
  m.eos_token_ids = {kEos};
  m.salt = salt;
  return m;
}

std::unique_ptr<Engine> Make(const EngineOptions& options, FakeModel::Mode mode,
                             uint64_t draft_salt) {
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::CreateWithModel(options, std::make_unique<FakeModel>(Model(mode, 0)),
                              options.speculative.method == SpecMethod::kDraft
                                  ? std::make_unique<FakeModel>(Model(mode, draft_salt))
                                  : nullptr);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *std::move(engine) : nullptr;
}

// System prompts ending mid-page and on a page boundary, made of short repeated patterns or an
// ascending run (what kCount's argmax continues) so that the n-gram lookup finds matches.
std::vector<int32_t> System(int s) {
  const int len = std::vector<int>{10, 16, 23}[s];
  std::vector<int32_t> p;
  for (int j = 0; j < len; ++j) p.push_back(s % 2 == 0 ? 10 + (j % (2 + s)) * 7 + s : 20 + s + j);
  return p;
}

// Runs three turns of 12 conversations: turn t + 1 of a conversation sends its turn-t prompt,
// the answer to it and a few new tokens; the engine is drained between turns. Returns every
// turn's tokens by request id.
std::map<std::string, std::vector<int32_t>> RunConversations(Engine& engine, float temperature) {
  std::vector<std::vector<int32_t>> prompts(12);
  for (int c = 0; c < 12; ++c) {
    prompts[c] = System(c % 3);
    const std::vector<int32_t> suffix = RandomPrompt(c % 5, kVocab, 300 + c);
    prompts[c].insert(prompts[c].end(), suffix.begin(), suffix.end());
  }
  std::map<std::string, std::vector<int32_t>> tokens;
  for (int turn = 0; turn < 3; ++turn) {
    for (int c = 0; c < 12; ++c) {
      EngineRequest r = Request("t" + std::to_string(turn) + "c" + std::to_string(c), prompts[c],
                                6 + (c * 5 + turn * 3) % 15, temperature);
      r.sampling.seed = 500 + 100 * turn + c;
      r.sampling.ignore_eos = c % 2 == 0;
      EXPECT_TRUE(engine.AddRequest(std::move(r)).ok());
    }
    const std::map<std::string, Finished> done = RunToCompletion(engine);
    EXPECT_EQ(done.size(), 12u) << "turn " << turn;
    for (int c = 0; c < 12; ++c) {
      const std::string id = "t" + std::to_string(turn) + "c" + std::to_string(c);
      auto it = done.find(id);
      if (it == done.end()) continue;
      EXPECT_EQ(it->second.num_terminal_events, 1) << id;
      EXPECT_NE(it->second.reason, FinishReason::kError) << id << " " << it->second.error;
      tokens[id] = it->second.tokens;
      prompts[c].insert(prompts[c].end(), it->second.tokens.begin(), it->second.tokens.end());
      const std::vector<int32_t> more = RandomPrompt(1 + c % 4, kVocab, 700 + 13 * turn + c);
      prompts[c].insert(prompts[c].end(), more.begin(), more.end());
    }
  }
  return tokens;
}

void ExpectAllFree(Engine& engine) {
  ExpectIdle(engine);
  const EngineStats s = engine.Stats();
  EXPECT_EQ(s.num_draft_pages_free, s.num_draft_pages_total) << "draft KV pages leaked";
}

struct Case {
  const char* name;
  SpecMethod method;
  uint64_t draft_salt;  // the draft's: 0 is the target itself (every proposal accepted)
  FakeModel::Mode mode;
  float temperature;  // > 0: seeded sampling (n-gram proposals keep it lossless token for token)
  int num_pages;
};

constexpr FakeModel::Mode kHash = FakeModel::Mode::kHash;
constexpr FakeModel::Mode kCount = FakeModel::Mode::kCount;

class SpecPrefixCacheTest : public ::testing::TestWithParam<Case> {};

TEST_P(SpecPrefixCacheTest, SameTokensAsWithNeitherSpeculationNorTheCache) {
  const Case& c = GetParam();
  std::unique_ptr<Engine> plain = Make(Options(SpecMethod::kNone, false, 2048), c.mode, 0);
  ASSERT_NE(plain, nullptr);
  const std::map<std::string, std::vector<int32_t>> want = RunConversations(*plain, c.temperature);
  ASSERT_EQ(want.size(), 36u);
  ExpectAllFree(*plain);

  std::unique_ptr<Engine> engine = Make(Options(c.method, true, c.num_pages), c.mode, c.draft_salt);
  ASSERT_NE(engine, nullptr);
  const std::map<std::string, std::vector<int32_t>> got = RunConversations(*engine, c.temperature);
  EXPECT_EQ(got, want);
  const EngineStats s = engine->Stats();
  // It speculated, accepted some proposals and rejected others, and later turns found their
  // earlier turns (prompt and speculated answer) in the cache.
  EXPECT_GT(s.spec_decode_num_drafts, 0);
  EXPECT_GT(s.spec_decode_num_accepted_tokens, 0);
  if (c.draft_salt != 0 || c.method == SpecMethod::kNgram) {
    EXPECT_LT(s.spec_decode_num_accepted_tokens, s.spec_decode_num_draft_tokens);
  }
  EXPECT_GT(s.prefix_cache_hits_total, 0);
  if (c.num_pages < 2048) {
    EXPECT_GT(s.num_preemptions_total, 0);
  }
  ExpectAllFree(*engine);
}

INSTANTIATE_TEST_SUITE_P(
    Proposers, SpecPrefixCacheTest,
    ::testing::Values(Case{"ngram", SpecMethod::kNgram, 0, kCount, 0.3f, 2048},
                      Case{"draft_self", SpecMethod::kDraft, 0, kHash, 0.0f, 2048},
                      Case{"draft_other", SpecMethod::kDraft, 99, kHash, 0.0f, 2048},
                      Case{"ngram_small_pool", SpecMethod::kNgram, 0, kCount, 0.3f, 40},
                      Case{"draft_other_small_pool", SpecMethod::kDraft, 99, kHash, 0.0f, 40}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace tandem::testing
