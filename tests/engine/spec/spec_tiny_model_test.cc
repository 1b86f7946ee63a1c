// Speculative decoding over real generated checkpoints (tandem make-model, CPU backend, bf16
// paged KV, page size 4, chunked prefill): 64 greedy prompts give the same tokens without
// speculation, with n-gram lookup, with the target as its own draft (every proposal accepted)
// and with a smaller draft preset sharing the tokenizer (tiny-llama3 for tiny-llama3-tied).
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/model/make_model.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"

namespace tandem::testing {
namespace {

std::string Make(const std::string& preset) {
  const std::string dir = ::testing::TempDir() + "/spec_tiny_" + preset;
  MakeModelOptions make;
  make.preset = preset;
  make.out_dir = dir;
  make.seed = 11;
  absl::StatusOr<ModelConfig> config = MakeModel(make);
  EXPECT_TRUE(config.ok()) << config.status();
  return dir;
}

struct Outcome {
  std::map<std::string, Finished> finished;
  EngineStats stats;
};

Outcome RunEngine(const std::string& target, SpecMethod method, const std::string& draft,
                  int vocab) {
  EngineOptions o;
  o.model_dir = target;
  o.page_size = 4;
  o.num_pages = 1024;
  o.max_num_batched_tokens = 48;
  o.speculative.method = method;
  o.speculative.num_speculative_tokens = method == SpecMethod::kNone ? 0 : 3;
  o.speculative.draft_model = draft;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(o);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  for (int i = 0; i < 64; ++i) {
    // Every other prompt repeats a phrase, so n-gram lookup has something to find.
    std::vector<int32_t> prompt = RandomPrompt(1 + (i * 17) % 40, vocab, 900 + i);
    if (i % 2 == 0) {
      const std::vector<int32_t> phrase = prompt;
      for (int r = 0; r < 2; ++r) prompt.insert(prompt.end(), phrase.begin(), phrase.end());
    }
    EngineRequest r = Request("t" + std::to_string(i), prompt, 4 + i % 9);
    r.sampling.ignore_eos = true;
    EXPECT_TRUE((*engine)->AddRequest(std::move(r)).ok());
  }
  Outcome out;
  out.finished = RunToCompletion(**engine);
  ExpectIdle(**engine);
  out.stats = (*engine)->Stats();
  EXPECT_EQ(out.stats.num_draft_pages_free, out.stats.num_draft_pages_total);
  return out;
}

TEST(SpecTinyModelTest, GreedyTokensUnchangedByEitherProposer) {
  const std::string target = Make("tiny-llama3-tied");
  const std::string small = Make("tiny-llama3");
  absl::StatusOr<std::unique_ptr<Model>> model = LoadModel(target, Backend::kCpu);
  ASSERT_TRUE(model.ok()) << model.status();
  const int vocab = (*model)->config().vocab_size;
  absl::StatusOr<std::unique_ptr<Model>> draft = LoadModel(small, Backend::kCpu);
  ASSERT_TRUE(draft.ok()) << draft.status();
  ASSERT_EQ((*draft)->config().vocab_size, vocab) << "the presets no longer share a vocabulary";

  const Outcome off = RunEngine(target, SpecMethod::kNone, "", vocab);
  ASSERT_EQ(off.finished.size(), 64u);
  struct Case {
    const char* name;
    SpecMethod method;
    std::string draft;
  };
  for (const Case& c :
       {Case{"ngram", SpecMethod::kNgram, ""}, Case{"self draft", SpecMethod::kDraft, target},
        Case{"small draft", SpecMethod::kDraft, small}}) {
    const Outcome on = RunEngine(target, c.method, c.draft, vocab);
    ASSERT_EQ(on.finished.size(), 64u) << c.name;
    for (const auto& [id, f] : off.finished) {
      EXPECT_EQ(on.finished.at(id).tokens, f.tokens) << c.name << " " << id;
    }
    EXPECT_GT(on.stats.spec_decode_num_drafts, 0) << c.name;
    if (c.draft == target) {
      // Every proposal accepted: fewer steps (a random small draft agrees rarely, and its
      // proposals take token budget from the prefills, so it may need more).
      EXPECT_EQ(on.stats.spec_decode_num_accepted_tokens, on.stats.spec_decode_num_draft_tokens);
      EXPECT_LT(on.stats.num_steps_total, off.stats.num_steps_total);
    }
  }
}

}  // namespace
}  // namespace tandem::testing
