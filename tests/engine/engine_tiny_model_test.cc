// The engine over real generated checkpoints (tandem make-model presets, written at test time):
// the Llama-family CPU forward pass, bf16 paged KV (and fp8: a "<preset>/fp8" parameter runs
// the same tests with --kv-cache-dtype fp8, tokens compared between fp8 engines). Batching
// invariance with chunked prefill and preemption, the disaggregated prefill → page copy → decode
// path, and which checkpoint files the engine needs (no tokenizer unless the config names no EOS).
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/model/make_model.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engine/engine_test_util.h"

namespace tandem::testing {
namespace {

class EngineTinyModelTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    std::string param = GetParam();
    if (const size_t slash = param.find('/'); slash != std::string::npos) {
      kv_cache_dtype_ = param.substr(slash + 1);
      param.resize(slash);
    }
    dir_ = ::testing::TempDir() + "/engine_tiny_" + param;
    MakeModelOptions make;
    make.preset = param;
    make.out_dir = dir_;
    make.seed = 7;
    absl::StatusOr<ModelConfig> config = MakeModel(make);
    ASSERT_TRUE(config.ok()) << config.status();
    vocab_ = config->vocab_size;
  }

  std::unique_ptr<Engine> Make(int num_pages, int budget = 32) {
    EngineOptions o;
    o.model_dir = dir_;
    o.page_size = 4;
    o.num_pages = num_pages;
    o.max_num_batched_tokens = budget;
    o.kv_cache_dtype = kv_cache_dtype_;
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(o);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? *std::move(engine) : nullptr;
  }

  // 20 requests, prompts of 1..90 tokens (beyond the 32-token budget: chunked), 12 new tokens
  // each; every fifth sampled at temperature 1 with top-k/top-p.
  std::vector<EngineRequest> Requests() {
    std::vector<EngineRequest> out;
    for (int i = 0; i < 20; ++i) {
      EngineRequest r =
          Request("t" + std::to_string(i), RandomPrompt(1 + (i * 29) % 90, vocab_, 300 + i), 12,
                  i % 5 == 4 ? 1.0f : 0.0f);
      r.sampling.top_k = i % 5 == 4 ? 50 : -1;
      r.sampling.top_p = i % 5 == 4 ? 0.9f : 1.0f;
      r.sampling.ignore_eos = true;
      out.push_back(std::move(r));
    }
    return out;
  }

  std::map<std::string, Finished> RunAlone(const std::vector<EngineRequest>& requests) {
    std::map<std::string, Finished> out;
    std::unique_ptr<Engine> engine = Make(1024);
    for (const EngineRequest& r : requests) {
      EXPECT_TRUE(engine->AddRequest(r).ok());
      out[r.id] = RunToCompletion(*engine)[r.id];
    }
    ExpectIdle(*engine);
    return out;
  }

  std::string dir_;
  std::string kv_cache_dtype_ = "auto";
  int vocab_ = 0;
};

TEST_P(EngineTinyModelTest, BatchedChunkedAndPreemptedRunsMatchRunsAlone) {
  const std::vector<EngineRequest> requests = Requests();
  const std::map<std::string, Finished> alone = RunAlone(requests);
  for (int num_pages : {1024, 40}) {  // 40 pages of 4 tokens: preemption
    std::unique_ptr<Engine> engine = Make(num_pages);
    for (const EngineRequest& r : requests) ASSERT_TRUE(engine->AddRequest(r).ok());
    std::map<std::string, Finished> together = RunToCompletion(*engine);
    for (const EngineRequest& r : requests) {
      EXPECT_EQ(together[r.id].tokens, alone.at(r.id).tokens) << r.id << " pages " << num_pages;
    }
    EXPECT_EQ(engine->Stats().num_preemptions_total > 0, num_pages == 40);
    ExpectIdle(*engine);
  }
}

TEST_P(EngineTinyModelTest, PrefillEngineThenDecodeEngineMatchOneEngine) {
  const std::vector<EngineRequest> requests = Requests();
  const std::map<std::string, Finished> want = RunAlone(requests);
  std::unique_ptr<Engine> prefill = Make(512);
  std::unique_ptr<Engine> decode = Make(700);
  ASSERT_TRUE(decode->ReservePages("pad", 50).ok());  // different page ids on each side
  EXPECT_EQ(prefill->kv_layout().dtype == DType::kF8E4M3, kv_cache_dtype_ == "fp8");
  for (EngineRequest r : requests) {
    r.prefill_only = true;
    ASSERT_TRUE(prefill->AddRequest(std::move(r)).ok());
  }
  std::map<std::string, Finished> first = RunToCompletion(*prefill);
  const KvLayout& src_layout = prefill->kv_layout();
  const KvLayout& dst_layout = decode->kv_layout();
  const int64_t elem = DTypeSize(src_layout.dtype);
  for (const EngineRequest& r : requests) {
    ASSERT_EQ(first[r.id].reason, FinishReason::kPrefillDone);
    std::vector<int32_t> dst =
        *decode->ReservePages(r.id, static_cast<int>(r.prompt_tokens.size()));
    std::vector<int32_t> src = *prefill->KvPages(r.id);
    for (int layer = 0; layer < src_layout.num_layers; ++layer) {
      for (size_t i = 0; i < src.size(); ++i) {
        std::memcpy(
            static_cast<char*>(decode->kv_pool()) + dst_layout.PageOffset(layer, dst[i]) * elem,
            static_cast<char*>(prefill->kv_pool()) + src_layout.PageOffset(layer, src[i]) * elem,
            src_layout.PageBytes());
      }
    }
    ASSERT_TRUE(prefill->ReleaseRequest(r.id).ok());
    ASSERT_TRUE(decode->AddPrefilledRequest(r, first[r.id].tokens.at(0)).ok());
  }
  ExpectIdle(*prefill);
  std::map<std::string, Finished> rest = RunToCompletion(*decode);
  for (const EngineRequest& r : requests) {
    std::vector<int32_t> got = first[r.id].tokens;
    got.insert(got.end(), rest[r.id].tokens.begin(), rest[r.id].tokens.end());
    EXPECT_EQ(got, want.at(r.id).tokens) << r.id;
  }
  ASSERT_TRUE(decode->ReleaseRequest("pad").ok());
  ExpectIdle(*decode);
}

TEST_P(EngineTinyModelTest, PromptLongerThanTheContextIsRejected) {
  std::unique_ptr<Engine> engine = Make(64);
  const int n = engine->max_model_len() + 1;
  EXPECT_EQ(engine->AddRequest(Request("long", RandomPrompt(n, vocab_, 1), 1)).code(),
            absl::StatusCode::kInvalidArgument);
  ExpectIdle(*engine);
}

TEST_P(EngineTinyModelTest, PrefixCacheHitMatchesAMiss) {
  // The same prompts again (each a prefix-cache hit of its whole pages, read back from the
  // cache) give the tokens of an engine that never cached them.
  std::vector<EngineRequest> requests = Requests();
  const std::map<std::string, Finished> alone = RunAlone(requests);
  std::unique_ptr<Engine> engine = Make(1024);
  for (const EngineRequest& r : requests) ASSERT_TRUE(engine->AddRequest(r).ok());
  RunToCompletion(*engine);
  for (EngineRequest& r : requests) r.id += "-again";
  for (const EngineRequest& r : requests) ASSERT_TRUE(engine->AddRequest(r).ok());
  std::map<std::string, Finished> again = RunToCompletion(*engine);
  for (const EngineRequest& r : requests) {
    if (r.sampling.temperature > 0) continue;  // its random stream follows the request id
    EXPECT_EQ(again[r.id].tokens, alone.at(r.id.substr(0, r.id.size() - 6)).tokens) << r.id;
  }
  EXPECT_GT(engine->Stats().prefix_cache_hits_total, 0);
  ExpectIdle(*engine);
}

INSTANTIATE_TEST_SUITE_P(Presets, EngineTinyModelTest,
                         ::testing::Values("tiny-llama3", "tiny-qwen3", "tiny-qwen2",
                                           "tiny-llama3/fp8", "tiny-qwen3/fp8", "tiny-qwen2/fp8"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) c = c == '-' || c == '/' ? '_' : c;
                           return name;
                         });

// The engine knows tokens only: a checkpoint without tokenizer files loads as long as its
// config names the EOS ids; one whose config names none needs tokenizer_config.json's EOS.
TEST(EngineCreateTest, NeedsTheTokenizerOnlyForAnEosTheConfigLacks) {
  const std::string dir = ::testing::TempDir() + "/engine_tiny_no_tokenizer";
  MakeModelOptions make;
  make.preset = "tiny";
  make.out_dir = dir;
  ASSERT_TRUE(MakeModel(make).ok());
  ASSERT_EQ(std::remove((dir + "/tokenizer.json").c_str()), 0);
  EngineOptions o;
  o.model_dir = dir;
  o.num_pages = 64;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_TRUE((*engine)->AddRequest(Request("r", {1, 2, 3}, 4)).ok());
  EXPECT_EQ(RunToCompletion(**engine)["r"].num_terminal_events, 1);

  // No EOS in config.json nor generation_config.json: the tokenizer is looked for.
  ASSERT_EQ(std::remove((dir + "/generation_config.json").c_str()), 0);
  std::ifstream in(dir + "/config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  config.erase("eos_token_id");
  std::ofstream(dir + "/config.json") << config.dump();
  EXPECT_EQ(Engine::Create(o).status().code(), absl::StatusCode::kNotFound);
}

// --kv-cache-dtype fp8: the same KV memory holds (head_dim + 4) / (2 head_dim) of bf16's bytes
// per page; an unknown value is refused.
TEST(EngineCreateTest, KvCacheDtypeSizesThePoolAndRejectsUnknownValues) {
  MakeModelOptions make;
  make.preset = "tiny-llama3";
  make.out_dir = ::testing::TempDir() + "/engine_kv_dtype";
  ASSERT_TRUE(MakeModel(make).ok());
  EngineOptions o;
  o.model_dir = make.out_dir;
  o.kv_memory_bytes = int64_t{8} << 20;
  std::map<std::string, int> pages;
  std::map<std::string, KvLayout> layouts;
  for (const std::string dtype : {"auto", "bf16", "fp8"}) {
    o.kv_cache_dtype = dtype;
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(o);
    ASSERT_TRUE(engine.ok()) << dtype << ": " << engine.status();
    pages[dtype] = (*engine)->kv_layout().num_pages;
    layouts[dtype] = (*engine)->kv_layout();
    EXPECT_EQ((*engine)->kv_layout().dtype, dtype == "fp8" ? DType::kF8E4M3 : DType::kBF16);
    EXPECT_LE((*engine)->kv_layout().PoolBytes(), o.kv_memory_bytes);
  }
  EXPECT_EQ(pages["auto"], pages["bf16"]);
  const int d = layouts["fp8"].head_dim;
  // Page size 16: no padding, codes + scales exactly.
  EXPECT_EQ(layouts["fp8"].PageBytes(), layouts["bf16"].PageBytes() / 2 / d * (d + 4));
  EXPECT_NEAR(static_cast<double>(pages["fp8"]) / pages["bf16"], 2.0 * d / (d + 4), 0.02);
  o.kv_cache_dtype = "fp16";
  EXPECT_EQ(Engine::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(EngineCreateTest, MissingModelFolderIsAnError) {
  EngineOptions o;
  o.model_dir = ::testing::TempDir() + "/no_such_model";
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(o);
  EXPECT_FALSE(engine.ok());
}

}  // namespace
}  // namespace tandem::testing
