// The engine's layer-wise KV push hook (engine/kv_push.h) with a recording listener:
//   - on a real tiny checkpoint (CPU forward pass): only the step that computes a prefill-only
//     prompt's last token is announced, with the prompt's pages; each layer is reported in order
//     while the step runs, and when layer l is reported its KV is already final (equal to what
//     the pool holds after the step) while layer l + 1's is not yet written;
//   - every way an announced request's pages are freed (first token ends it, abort, release,
//     a failed batch, a broken backend) calls BeforeFree first, once, with the pages still held;
//     requests never announced (not prefill-only, or not at their final chunk) never are.
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/model/make_model.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"

namespace tandem::testing {
namespace {

class RecordingListener : public KvPushListener {
 public:
  explicit RecordingListener(Engine** engine) : engine_(engine) {}

  void OnPushBegin(const std::vector<KvPush>& pushes) override {
    ++num_push_steps;
    current = pushes;
    for (const KvPush& p : pushes) announced[p.id] = p;
    layers.clear();
    if (snapshot_layers) {
      // Every layer of the prompts' pages as it is before the forward pass.
      before.clear();
      for (int l = 0; l < Layout().num_layers; ++l) before.push_back(Bytes(l));
    }
  }
  void OnLayerStored(int layer, void* event) override {
    EXPECT_EQ(event, nullptr);  // the CPU backend has stored the layer when it reports it
    layers.push_back(layer);
    if (snapshot_layers)
      at_hook[layer] = {Bytes(layer),
                        layer + 1 < Layout().num_layers ? Bytes(layer + 1) : std::vector<char>()};
  }
  void BeforeFree(const std::string& id) override {
    ++before_free[id];
    // The pages are still held: none of the announced ones is free yet.
    const EngineStats s = (*engine_)->Stats();
    pages_free_at_before_free[id] = s.num_pages_free;
  }

  // The bytes of layer `l` of every page of the current pushes, concatenated.
  std::vector<char> Bytes(int l) const {
    const KvLayout& layout = Layout();
    const char* pool = static_cast<const char*>((*engine_)->kv_pool());
    std::vector<char> out;
    for (const KvPush& p : current) {
      for (int32_t page : p.pages) {
        const char* src = pool + layout.PageOffset(l, page) * DTypeSize(layout.dtype);
        out.insert(out.end(), src, src + layout.PageBytes());
      }
    }
    return out;
  }
  const KvLayout& Layout() const { return (*engine_)->kv_layout(); }

  Engine** engine_;
  bool snapshot_layers = false;
  int num_push_steps = 0;
  std::vector<KvPush> current;
  std::map<std::string, KvPush> announced;
  std::vector<int> layers;
  std::vector<std::vector<char>> before;
  std::map<int, std::pair<std::vector<char>, std::vector<char>>> at_hook;  // layer l, l + 1
  std::map<std::string, int> before_free;
  std::map<std::string, int> pages_free_at_before_free;
};

EngineRequest PrefillOnly(const std::string& id, std::vector<int32_t> prompt, int max_tokens = 8) {
  EngineRequest r = Request(id, std::move(prompt), max_tokens);
  r.prefill_only = true;
  r.sampling.ignore_eos = true;
  return r;
}

class EngineKvPushTinyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/engine_kv_push_tiny";
    MakeModelOptions make;
    make.preset = "tiny";
    make.out_dir = dir_;
    make.seed = 5;
    absl::StatusOr<ModelConfig> config = MakeModel(make);
    ASSERT_TRUE(config.ok()) << config.status();
    vocab_ = config->vocab_size;
    EngineOptions o;
    o.model_dir = dir_;
    o.page_size = 4;
    o.num_pages = 128;
    o.max_num_batched_tokens = 32;
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(o);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
    raw_ = engine_.get();
    engine_->SetKvPushListener(&listener_);
  }

  std::string dir_;
  int vocab_ = 0;
  std::unique_ptr<Engine> engine_;
  Engine* raw_ = nullptr;
  RecordingListener listener_{&raw_};
};

TEST_F(EngineKvPushTinyTest, OnlyTheFinalChunkIsAnnouncedAndEachLayerIsFinalWhenReported) {
  listener_.snapshot_layers = true;
  // 70 tokens at a 32-token budget: chunks of 32, 32, 6; the third step is the push step.
  ASSERT_TRUE(engine_->AddRequest(PrefillOnly("p", RandomPrompt(70, vocab_, 1))).ok());
  std::map<std::string, Finished> results;
  for (int step = 1; step <= 2; ++step) {
    auto outs = engine_->Step();
    ASSERT_TRUE(outs.ok()) << outs.status();
    Collect(*outs, &results);
    EXPECT_EQ(listener_.num_push_steps, 0) << "step " << step;
  }
  auto outs = engine_->Step();
  ASSERT_TRUE(outs.ok()) << outs.status();
  Collect(*outs, &results);
  ASSERT_EQ(results["p"].reason, FinishReason::kPrefillDone);
  ASSERT_EQ(listener_.num_push_steps, 1);
  const int layers = engine_->kv_layout().num_layers;
  ASSERT_GE(layers, 2);
  std::vector<int> want_layers(layers);
  for (int l = 0; l < layers; ++l) want_layers[l] = l;
  EXPECT_EQ(listener_.layers, want_layers);

  const KvPush& push = listener_.announced.at("p");
  EXPECT_EQ(push.num_prompt_tokens, 70);
  auto pages = engine_->KvPages("p");
  ASSERT_TRUE(pages.ok());
  ASSERT_EQ(push.pages.size(), 18u);  // ceil(70 / 4)
  EXPECT_EQ(push.pages, std::vector<int32_t>(pages->begin(), pages->begin() + 18));
  for (int l = 0; l < layers; ++l) {
    const std::vector<char> final_bytes = listener_.Bytes(l);
    EXPECT_EQ(listener_.at_hook[l].first, final_bytes) << "layer " << l << " not final at its hook";
    // The final chunk wrote layer l during the step: it changed from before the step.
    EXPECT_NE(listener_.before[l], final_bytes) << "layer " << l;
    if (l + 1 < layers) {
      EXPECT_NE(listener_.at_hook[l].second, listener_.Bytes(l + 1))
          << "layer " << l + 1 << " was already final when layer " << l << " was reported";
    }
  }
  EXPECT_EQ(listener_.before_free.count("p"), 0u);
  ASSERT_TRUE(engine_->ReleaseRequest("p").ok());
  EXPECT_EQ(listener_.before_free["p"], 1);
  ExpectIdle(*engine_);
}

TEST_F(EngineKvPushTinyTest, OnlyPrefillOnlyRequestsAtTheirFinalChunkAreAnnounced) {
  // One step: "short" completes, "long" (40 tokens) has its first chunk, "full" is a normal
  // request (its prompt completes too, but it decodes here: no push).
  ASSERT_TRUE(engine_->AddRequest(PrefillOnly("short", RandomPrompt(6, vocab_, 2))).ok());
  ASSERT_TRUE(engine_->AddRequest(PrefillOnly("long", RandomPrompt(40, vocab_, 3))).ok());
  EngineRequest full = Request("full", RandomPrompt(5, vocab_, 4), 3);
  full.sampling.ignore_eos = true;
  ASSERT_TRUE(engine_->AddRequest(full).ok());
  std::map<std::string, Finished> results;
  auto outs = engine_->Step();
  ASSERT_TRUE(outs.ok()) << outs.status();
  Collect(*outs, &results);
  ASSERT_EQ(listener_.num_push_steps, 1);
  ASSERT_EQ(listener_.current.size(), 1u);
  EXPECT_EQ(listener_.current[0].id, "short");
  EXPECT_EQ(listener_.current[0].pages.size(), 2u);
  while (engine_->HasWork()) {
    auto more = engine_->Step();
    ASSERT_TRUE(more.ok()) << more.status();
    Collect(*more, &results);
  }
  EXPECT_EQ(listener_.num_push_steps, 2);  // "long"'s final chunk later
  EXPECT_EQ(listener_.announced.count("long"), 1u);
  EXPECT_EQ(listener_.announced.count("full"), 0u);
  EXPECT_EQ(results["full"].reason, FinishReason::kLength);
  EXPECT_EQ(listener_.before_free.count("full"), 0u);  // never announced
  ASSERT_TRUE(engine_->ReleaseRequest("short").ok());
  ASSERT_TRUE(engine_->Abort("long").ok());
  while (engine_->HasWork()) ASSERT_TRUE(engine_->Step().ok());
  EXPECT_EQ(listener_.before_free["short"], 1);
  EXPECT_EQ(listener_.before_free["long"], 1);
  ExpectIdle(*engine_);
}

TEST_F(EngineKvPushTinyTest, AFirstTokenThatEndsTheRequestFreesItsPagesOnlyAfterBeforeFree) {
  ASSERT_TRUE(engine_->AddRequest(PrefillOnly("one", RandomPrompt(21, vocab_, 5), 1)).ok());
  const int free_before = engine_->Stats().num_pages_free;
  std::map<std::string, Finished> results;
  auto outs = engine_->Step();
  ASSERT_TRUE(outs.ok()) << outs.status();
  Collect(*outs, &results);
  EXPECT_EQ(results["one"].reason, FinishReason::kLength);
  EXPECT_EQ(listener_.announced.count("one"), 1u);
  EXPECT_EQ(listener_.before_free["one"], 1);
  // At BeforeFree the request's pages (6 for 21 tokens + the sampled one) were still taken.
  EXPECT_LT(listener_.pages_free_at_before_free["one"], free_before);
  ExpectIdle(*engine_);
}

// The FakeModel reports layers after its step (Model's default StepWithLayerHook); a failed
// batch and a broken backend free announced pages only after BeforeFree.
TEST(EngineKvPushFakeTest, FailedBatchAndBrokenBackendCallBeforeFree) {
  EngineOptions o;
  o.page_size = 4;
  o.num_pages = 64;
  FakeModel* model = nullptr;
  std::unique_ptr<Engine> engine = MakeEngine(o, FakeModel::Options(), &model);
  ASSERT_NE(engine, nullptr);
  Engine* raw = engine.get();
  RecordingListener listener(&raw);
  engine->SetKvPushListener(&listener);

  ASSERT_TRUE(engine->AddRequest(PrefillOnly("ok", {1, 2, 3, 4, 5})).ok());
  ASSERT_TRUE(engine->Step().ok());
  EXPECT_EQ(listener.layers, (std::vector<int>{0, 1}));  // after the step, in order

  model->InjectFault(absl::InvalidArgumentError("bad batch"), -1, /*sticky=*/false);
  ASSERT_TRUE(engine->AddRequest(PrefillOnly("bad", {6, 7, 8})).ok());
  auto outs = engine->Step();
  ASSERT_TRUE(outs.ok());
  std::map<std::string, Finished> results;
  Collect(*outs, &results);
  EXPECT_EQ(results["bad"].reason, FinishReason::kError);
  EXPECT_EQ(listener.before_free["bad"], 1);

  model->InjectFault(absl::InternalError("device lost"), -1, /*sticky=*/true);
  ASSERT_TRUE(engine->AddRequest(PrefillOnly("doomed", {9, 10})).ok());
  EXPECT_FALSE(engine->Step().ok());
  EXPECT_EQ(listener.before_free["doomed"], 1);
  EXPECT_EQ(listener.before_free["ok"], 1);  // kPrefillDone pages freed by the break
  EXPECT_EQ(engine->Stats().num_pages_free, engine->Stats().num_pages_total);
}

}  // namespace
}  // namespace tandem::testing
