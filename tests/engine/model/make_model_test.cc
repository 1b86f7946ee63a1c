#include "engine/model/make_model.h"

#include <cmath>
#include <cstring>
#include <filesystem>

#include "base/check.h"
#include "engine/model/hf_tensors.h"
#include "engine/model/presets.h"
#include "engine/model/safetensors.h"
#include "gtest/gtest.h"
#include "tests/engine/model/model_test_util.h"

namespace tandem {
namespace {

using testing_util::NewTempDir;
using testing_util::ReadFileOrDie;

std::string Make(const std::string& preset, uint64_t seed, int shards = 0) {
  const std::string dir = NewTempDir("mm");
  absl::StatusOr<ModelConfig> c =
      MakeModel({.preset = preset, .out_dir = dir, .seed = seed, .num_shards = shards});
  CHECK_OK(c.status());
  return dir;
}

// Last-position logits of a short fixed prompt.
std::vector<float> PromptLogits(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<Model>> m = LoadModel(dir, Backend::kCpu);
  CHECK_OK(m.status());
  const std::vector<testing_util::SeqResult> r =
      testing_util::GenerateGreedy(**m, {{3, 1, 4, 1, 5, 9, 2, 6}}, 1, 4, 8, DType::kF32);
  return r[0].prompt_logits;
}

TEST(MakeModelTest, SameSeedSameBytesOtherSeedOtherBytes) {
  const std::string a = Make("tiny-qwen3", 5), b = Make("tiny-qwen3", 5), c = Make("tiny-qwen3", 6);
  for (const char* f :
       {"config.json", "generation_config.json", "tokenizer.json", "model.safetensors"}) {
    EXPECT_EQ(ReadFileOrDie(a + "/" + f), ReadFileOrDie(b + "/" + f)) << f;
  }
  EXPECT_NE(ReadFileOrDie(a + "/model.safetensors"), ReadFileOrDie(c + "/model.safetensors"));
}

TEST(MakeModelTest, ShardedCheckpointHoldsTheSameModel) {
  const std::string one = Make("tiny-mistral", 3), three = Make("tiny-mistral", 3, 3);
  EXPECT_FALSE(std::filesystem::exists(one + "/model.safetensors.index.json"));
  ASSERT_TRUE(std::filesystem::exists(three + "/model.safetensors.index.json"));
  EXPECT_TRUE(std::filesystem::exists(three + "/model-00003-of-00003.safetensors"));
  auto a = SafetensorsCheckpoint::Open(one);
  auto b = SafetensorsCheckpoint::Open(three);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*b)->files().size(), 3u);
  ASSERT_EQ((*a)->tensors().size(), (*b)->tensors().size());
  for (const auto& [name, ea] : (*a)->tensors()) {
    const auto eb = (*b)->Find(name);
    ASSERT_NE(eb.file, nullptr) << name;
    ASSERT_EQ(ea.info->end - ea.info->begin, eb.info->end - eb.info->begin) << name;
    EXPECT_EQ(0, std::memcmp(ea.file->Data(*ea.info), eb.file->Data(*eb.info),
                             ea.info->end - ea.info->begin))
        << name;
  }
  EXPECT_EQ(PromptLogits(one), PromptLogits(three));
}

TEST(MakeModelTest, EveryTinyPresetLoadsAndGivesSpreadLogits) {
  for (const ModelPreset& p : ModelPresets()) {
    if (!p.tiny) continue;
    SCOPED_TRACE(p.name);
    const std::vector<float> logits = PromptLogits(Make(p.name, 1));
    double sum = 0, sq = 0;
    for (float x : logits) {
      ASSERT_TRUE(std::isfinite(x));
      sum += x;
      sq += double{x} * x;
    }
    const double mean = sum / logits.size();
    const double std_dev = std::sqrt(sq / logits.size() - mean * mean);
    EXPECT_GT(std_dev, 1.0);  // well spread: greedy ties are vanishingly unlikely
    EXPECT_LT(std_dev, 10.0);
  }
}

TEST(MakeModelTest, ConfigJsonRoundTripsForEveryPreset) {
  for (const ModelPreset& p : ModelPresets()) {
    ModelConfig want = p.config;
    want.vocab_size = std::max(want.vocab_size, 1000);
    want.bos_token_id = 1;
    want.eos_token_ids = {2, 3};
    absl::StatusOr<ModelConfig> got = ModelConfig::FromJson(HfConfigJson(want));
    ASSERT_TRUE(got.ok()) << p.name << ": " << got.status();
    EXPECT_EQ(got->architecture, want.architecture) << p.name;
    EXPECT_EQ(got->head_dim, want.head_dim) << p.name;
    EXPECT_EQ(got->num_kv_heads, want.num_kv_heads) << p.name;
    EXPECT_EQ(got->rope_scaling.type, want.rope_scaling.type) << p.name;
    EXPECT_EQ(got->rope_theta, want.rope_theta) << p.name;
    EXPECT_EQ(got->rms_norm_eps, want.rms_norm_eps) << p.name;
    EXPECT_EQ(got->tie_word_embeddings, want.tie_word_embeddings) << p.name;
    EXPECT_EQ(got->dtype, want.dtype) << p.name;
    EXPECT_EQ(got->eos_token_ids, want.eos_token_ids) << p.name;
    EXPECT_EQ(got->RopeInvFreq(), want.RopeInvFreq()) << p.name;
  }
}

// Full shapes match the published parameter counts of the real models.
TEST(MakeModelTest, FullPresetsHaveTheRealParameterCounts) {
  const std::pair<const char*, double> expected[] = {
      {"llama3-8b", 8.030e9},  {"llama31-8b", 8.030e9}, {"qwen3-8b", 8.191e9},
      {"qwen25-7b", 7.616e9},  {"mistral-7b", 7.248e9}, {"llama2-7b", 6.738e9},
      {"llama32-1b", 1.236e9},
  };
  for (const auto& [name, params] : expected) {
    absl::StatusOr<ModelPreset> p = FindModelPreset(name);
    ASSERT_TRUE(p.ok()) << p.status();
    double n = 0;
    for (const HfTensor& t : HfTensors(p->config)) n += t.spec.NumElements();
    EXPECT_NEAR(n / params, 1.0, 1e-3) << name << ": " << n;
    EXPECT_EQ(p->config.dtype, DType::kBF16);
  }
}

TEST(MakeModelTest, UnknownPresetListsKnownOnes) {
  absl::StatusOr<ModelConfig> c = MakeModel({.preset = "gpt5", .out_dir = NewTempDir("x")});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("tiny-qwen3"), std::string::npos) << c.status();
}

}  // namespace
}  // namespace tandem
