// Engine behaviour over the FakeModel (tests/engine/fake_model.h): batching invariance with
// chunked prefill, preemption, request validation, abort, the token-level stop conditions, and
// a stop string applied by the caller (TextStream + Abort, as the router and `tandem generate`
// do). Every test ends with all KV pages free.
#include "engine/engine.h"

#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"
#include "tests/engine/fake_tokenizer.h"
#include "tokenizer/text_stream.h"

namespace tandem::testing {
namespace {

constexpr int kVocab = 101;

struct Spec {
  std::string id;
  std::vector<int32_t> prompt;
  int max_tokens;
  float temperature;
};

// 64 requests: prompts of 1..300 tokens (many longer than a 64-token budget, some needing
// dozens of 4-token pages), 1..24 new tokens, every fourth one sampled at temperature 0.8.
std::vector<Spec> MixedRequests() {
  std::vector<Spec> specs;
  for (int i = 0; i < 64; ++i) {
    const int len = i % 8 == 7 ? 200 + i : 1 + (i * 37) % 150;
    specs.push_back({"req-" + std::to_string(i), RandomPrompt(len, kVocab, 1000 + i),
                     1 + (i * 13) % 24, i % 4 == 3 ? 0.8f : 0.0f});
  }
  return specs;
}

EngineOptions SmallOptions() {
  EngineOptions o;
  o.page_size = 4;
  o.num_pages = 4096;
  o.max_num_batched_tokens = 64;
  o.max_num_seqs = 64;
  return o;
}

std::map<std::string, Finished> RunAlone(const EngineOptions& options,
                                         const std::vector<Spec>& specs) {
  std::map<std::string, Finished> results;
  std::unique_ptr<Engine> engine = MakeEngine(options, FakeModel::Options());
  for (const Spec& s : specs) {
    EXPECT_TRUE(engine->AddRequest(Request(s.id, s.prompt, s.max_tokens, s.temperature)).ok());
    results[s.id] = RunToCompletion(*engine)[s.id];
    ExpectIdle(*engine);
  }
  return results;
}

void ExpectSameTokens(const std::map<std::string, Finished>& got,
                      const std::map<std::string, Finished>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [id, f] : want) {
    ASSERT_TRUE(got.contains(id)) << id;
    EXPECT_EQ(got.at(id).tokens, f.tokens) << id;
    EXPECT_EQ(got.at(id).reason, FinishReason::kLength) << id;
  }
}

TEST(EngineTest, BatchingInvarianceWithChunkedPrefill) {
  const std::vector<Spec> specs = MixedRequests();
  const EngineOptions options = SmallOptions();
  const std::map<std::string, Finished> alone = RunAlone(options, specs);

  FakeModel* model = nullptr;
  std::unique_ptr<Engine> engine = MakeEngine(options, FakeModel::Options(), &model);
  for (const Spec& s : specs) {
    ASSERT_TRUE(engine->AddRequest(Request(s.id, s.prompt, s.max_tokens, s.temperature)).ok());
  }
  const std::map<std::string, Finished> together = RunToCompletion(*engine);
  ExpectSameTokens(together, alone);
  for (const Spec& s : specs) EXPECT_EQ(alone.at(s.id).tokens.size(), s.max_tokens) << s.id;
  // It really batched, and really chunked: the longest prompt is far beyond the budget.
  EXPECT_GT(model->max_seqs_per_forward(), 8);
  EXPECT_EQ(model->max_tokens_per_forward(), options.max_num_batched_tokens);
  EXPECT_EQ(engine->Stats().num_preemptions_total, 0);
  ExpectIdle(*engine);
}

TEST(EngineTest, PreemptionByRecomputeGivesTheSameTokens) {
  std::vector<Spec> specs;
  for (int i = 0; i < 16; ++i) {
    specs.push_back({"p" + std::to_string(i), RandomPrompt(10 + 3 * i, kVocab, 77 + i), 30,
                     i % 2 == 0 ? 0.0f : 1.0f});
  }
  EngineOptions options = SmallOptions();
  options.num_pages = 40;  // 160 token slots; together the requests need ~ 1000
  const std::map<std::string, Finished> alone = RunAlone(options, specs);

  std::unique_ptr<Engine> engine = MakeEngine(options, FakeModel::Options());
  for (const Spec& s : specs) {
    ASSERT_TRUE(engine->AddRequest(Request(s.id, s.prompt, s.max_tokens, s.temperature)).ok());
  }
  ExpectSameTokens(RunToCompletion(*engine), alone);
  EXPECT_GT(engine->Stats().num_preemptions_total, 0);
  ExpectIdle(*engine);
}

TEST(EngineTest, RejectsBadRequests) {
  FakeModel::Options model;
  model.max_position_embeddings = 64;
  EngineOptions options = SmallOptions();
  options.num_pages = 8;  // 32 token slots
  std::unique_ptr<Engine> engine = MakeEngine(options, model);
  ASSERT_EQ(engine->max_model_len(), 64);
  auto code = [&](EngineRequest r) { return engine->AddRequest(std::move(r)).code(); };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(code(Request("long", RandomPrompt(65, kVocab, 1), 1)), kInvalid);
  EXPECT_EQ(code(Request("long+gen", RandomPrompt(20, kVocab, 1), 50)), kInvalid);
  EXPECT_EQ(code(Request("pool", RandomPrompt(30, kVocab, 1), 5)), kInvalid);  // 9 pages
  EXPECT_EQ(code(Request("empty", {}, 1)), kInvalid);
  EXPECT_EQ(code(Request("oov", {1, kVocab}, 1)), kInvalid);
  EXPECT_EQ(code(Request("neg", {-1}, 1)), kInvalid);
  EXPECT_EQ(code(Request("temp", {1}, 1, -0.5f)), kInvalid);
  EXPECT_FALSE(engine->HasWork());
  ASSERT_TRUE(engine->AddRequest(Request("ok", {1, 2}, 3)).ok());
  EXPECT_EQ(code(Request("ok", {1, 2}, 3)), absl::StatusCode::kAlreadyExists);
  RunToCompletion(*engine);
  ExpectIdle(*engine);

  options.max_model_len = 65;  // beyond the model's
  EXPECT_EQ(Engine::CreateWithModel(options, std::make_unique<FakeModel>(model)).status().code(),
            kInvalid);
}

// A model that cannot run the asked KV cache dtype (the fake computes on fp32 pages only) is
// refused at Create with the dtype named, never run on another dtype.
TEST(EngineTest, RefusesAKvCacheDtypeTheModelCannotRun) {
  EngineOptions options = SmallOptions();
  for (const std::string dtype : {"fp8", "bf16"}) {
    options.kv_cache_dtype = dtype;
    const absl::Status st =
        Engine::CreateWithModel(options, std::make_unique<FakeModel>(FakeModel::Options()))
            .status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << dtype;
    EXPECT_NE(st.message().find("cannot run a " + dtype + " KV cache"), std::string::npos) << st;
  }
  options.kv_cache_dtype = "auto";
  EXPECT_TRUE(
      Engine::CreateWithModel(options, std::make_unique<FakeModel>(FakeModel::Options())).ok());
}

TEST(EngineTest, AbortFreesPagesAndEndsTheRequestOnce) {
  EngineOptions options = SmallOptions();
  options.max_num_seqs = 2;
  std::unique_ptr<Engine> engine = MakeEngine(options, FakeModel::Options());
  ASSERT_TRUE(engine->AddRequest(Request("a", RandomPrompt(100, kVocab, 1), 50)).ok());
  ASSERT_TRUE(engine->AddRequest(Request("b", RandomPrompt(10, kVocab, 2), 50)).ok());
  ASSERT_TRUE(engine->AddRequest(Request("c", RandomPrompt(10, kVocab, 3), 50)).ok());
  std::map<std::string, Finished> results;
  for (int i = 0; i < 3; ++i) Collect(*engine->Step(), &results);
  EXPECT_GT(engine->Stats().num_pages_owned, 0);
  EXPECT_EQ(engine->Stats().num_waiting, 1);  // c
  ASSERT_TRUE(engine->Abort("a").ok());       // running, mid-prefill or decoding
  ASSERT_TRUE(engine->Abort("c").ok());       // waiting
  ASSERT_TRUE(engine->Abort("c").ok());       // twice is harmless
  EXPECT_EQ(engine->Abort("nope").code(), absl::StatusCode::kNotFound);
  Collect(*engine->Step(), &results);
  EXPECT_EQ(results["a"].reason, FinishReason::kAbort);
  EXPECT_EQ(results["c"].reason, FinishReason::kAbort);
  EXPECT_EQ(results["c"].tokens.size(), 0u);
  EXPECT_EQ(engine->Abort("a").code(), absl::StatusCode::kNotFound);
  std::map<std::string, Finished> rest = RunToCompletion(*engine);
  EXPECT_FALSE(rest.contains("a"));
  EXPECT_EQ(rest["b"].reason, FinishReason::kLength);
  ExpectIdle(*engine);
}

// The kCount model continues a prompt ending in token t with t+1, t+2, ...; the fake
// tokenizer reads token i as the letter 'a' + i % 26.
class EngineStopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FakeModel::Options model;
    model.mode = FakeModel::Mode::kCount;
    model.eos_token_ids = {kEos};
    engine_ = MakeEngine(SmallOptions(), model);
  }
  void TearDown() override { ExpectIdle(*engine_); }

  Finished Generate(EngineRequest r) {
    const std::string id = r.id;
    EXPECT_TRUE(engine_->AddRequest(std::move(r)).ok());
    return RunToCompletion(*engine_)[id];
  }

  static constexpr int32_t kEos = 30;
  std::unique_ptr<Engine> engine_;
};

TEST_F(EngineStopTest, MaxTokens) {
  Finished f = Generate(Request("r", {7, 0}, 4));  // continues b c d e
  EXPECT_EQ(f.tokens, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(f.reason, FinishReason::kLength);
}

// Stop strings are the caller's: it streams the tokens through a TextStream and aborts the
// request when a stop string completes; the engine ends it at its next step and frees its pages.
TEST_F(EngineStopTest, StopStringThroughTheCallersTextStream) {
  const FakeTokenizer tokenizer(kVocab, {kEos});
  TextStream text(&tokenizer, /*skip_special_tokens=*/true, {"zz", "efg"});
  ASSERT_TRUE(engine_->AddRequest(Request("r", {0}, 20)).ok());
  std::string out;
  int streamed = 0;
  std::map<std::string, Finished> results;
  while (engine_->HasWork()) {
    const std::vector<RequestOutput> outputs = *engine_->Step();
    Collect(outputs, &results);
    for (const RequestOutput& o : outputs) {
      if (text.stopped()) continue;
      TextStream::Delta d = text.Add(o.new_tokens);
      out += d.text;
      streamed += d.num_tokens;
      if (d.stopped) {
        ASSERT_TRUE(engine_->Abort("r").ok());
      }
    }
  }
  EXPECT_EQ(out, "bcd");
  EXPECT_EQ(streamed, 6);  // b c d e f g: the last three completed the stop string
  EXPECT_EQ(results["r"].tokens.size(), 6u);  // aborted before it sampled another
  EXPECT_EQ(results["r"].reason, FinishReason::kAbort);
}

TEST_F(EngineStopTest, StopTokenIdAndEos) {
  EngineRequest r = Request("ids", {0}, 20);
  r.sampling.stop_token_ids = {4};
  Finished f = Generate(std::move(r));
  EXPECT_EQ(f.tokens, (std::vector<int32_t>{1, 2, 3, 4}));  // the stop token is returned
  EXPECT_EQ(f.reason, FinishReason::kStop);

  f = Generate(Request("eos", {27}, 20));  // 28 29 then EOS (30)
  EXPECT_EQ(f.tokens, (std::vector<int32_t>{28, 29, kEos}));
  EXPECT_EQ(f.reason, FinishReason::kStop);
}

TEST_F(EngineStopTest, IgnoreEos) {
  EngineRequest r = Request("r", {27}, 5);
  r.sampling.ignore_eos = true;
  Finished f = Generate(std::move(r));
  EXPECT_EQ(f.tokens, (std::vector<int32_t>{28, 29, kEos, 31, 32}));
  EXPECT_EQ(f.reason, FinishReason::kLength);
}

}  // namespace
}  // namespace tandem::testing
