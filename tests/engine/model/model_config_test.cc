#include "engine/model/model_config.h"

#include <cmath>

#include "gtest/gtest.h"
#include "tests/engine/model/model_test_util.h"

namespace tandem {
namespace {

using testing_util::NewTempDir;
using testing_util::WriteFileOrDie;

// Abridged from Meta-Llama-3.1-8B-Instruct's config.json.
constexpr char kLlama31[] = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096,
  "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": false,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "vocab_size": 128256})";

// Abridged from Qwen3-8B's config.json (explicit head_dim, no q/k/v bias).
constexpr char kQwen3[] = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "bos_token_id": 151643,
  "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
  "intermediate_size": 12288, "max_position_embeddings": 40960, "max_window_layers": 36,
  "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 36,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null,
  "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "use_sliding_window": false, "vocab_size": 151936})";

TEST(ModelConfigTest, ParsesLlama31WithRopeScaling) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(kLlama31);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kLlama);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->num_kv_heads, 8);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_FLOAT_EQ(c->rope_scaling.factor, 8.0f);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int>{128001, 128008, 128009}));
  EXPECT_EQ(c->bos_token_id, 128000);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_EQ(c->dtype, DType::kBF16);
}

TEST(ModelConfigTest, ParsesQwen3AndQwen2Flags) {
  absl::StatusOr<ModelConfig> q3 = ModelConfig::FromJson(kQwen3);
  ASSERT_TRUE(q3.ok()) << q3.status();
  EXPECT_EQ(q3->architecture, Architecture::kQwen3);
  EXPECT_TRUE(q3->qk_norm);
  EXPECT_FALSE(q3->qkv_bias);
  EXPECT_EQ(q3->head_dim, 128);
  EXPECT_EQ(q3->eos_token_ids, std::vector<int>{151645});
  std::string qwen2 = kQwen3;
  qwen2.replace(qwen2.find("\"qwen3\""), 7, "\"qwen2\"");
  absl::StatusOr<ModelConfig> q2 = ModelConfig::FromJson(qwen2);
  ASSERT_TRUE(q2.ok()) << q2.status();
  EXPECT_TRUE(q2->qkv_bias);
  EXPECT_FALSE(q2->qk_norm);
}

TEST(ModelConfigTest, HeadDimDefaultsAndKvHeadsDefault) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(
      R"({"model_type": "mistral", "vocab_size": 32000, "hidden_size": 512,
          "intermediate_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 8,
          "sliding_window": null})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kMistral);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->num_kv_heads, 8);
  EXPECT_EQ(c->max_position_embeddings, 2048);
}

TEST(ModelConfigTest, MistralSlidingWindowClampsContext) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(
      R"({"model_type": "mistral", "vocab_size": 32000, "hidden_size": 512,
          "intermediate_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 8,
          "max_position_embeddings": 32768, "sliding_window": 4096})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->max_position_embeddings, 4096);
}

// transformers 5.x writes rope_theta inside "rope_parameters" and "dtype" for "torch_dtype".
TEST(ModelConfigTest, ParsesTransformers5Spelling) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(
      R"({"model_type": "llama", "vocab_size": 1000, "hidden_size": 64,
          "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "dtype": "float16",
          "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 8192}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_theta, 500000.0f);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(c->rope_scaling.factor, 32.0f);
  EXPECT_EQ(c->dtype, DType::kF16);
}

TEST(ModelConfigTest, UnsupportedArchitectureIsUnimplementedAndNamed) {
  absl::StatusOr<ModelConfig> c =
      ModelConfig::FromJson(R"({"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"]})");
  ASSERT_EQ(c.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(c.status().message().find("gemma2"), std::string::npos) << c.status();
  absl::StatusOr<ModelConfig> yarn = ModelConfig::FromJson(
      std::string(kQwen3).replace(std::string(kQwen3).find("\"rope_scaling\": null"), 20,
                                  R"("rope_scaling": {"rope_type": "yarn", "factor": 4.0})"));
  ASSERT_EQ(yarn.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(yarn.status().message().find("yarn"), std::string::npos) << yarn.status();
}

TEST(ModelConfigTest, BadFieldsAreInvalidArgumentNamingTheField) {
  const std::pair<std::string, std::string> cases[] = {
      {"\"hidden_size\": 4096", "hidden_size"},  // removed below
      {"\"num_key_value_heads\": 8", "num_key_value_heads"},
      {"\"vocab_size\": 128256", "vocab_size"},
      {"\"rms_norm_eps\": 1e-05", "rms_norm_eps"},
  };
  const std::string replacements[] = {"\"hidden_sizeX\": 4096", "\"num_key_value_heads\": 7",
                                      "\"vocab_size\": \"big\"", "\"rms_norm_eps\": -1"};
  for (size_t i = 0; i < std::size(cases); ++i) {
    std::string text = kLlama31;
    text.replace(text.find(cases[i].first), cases[i].first.size(), replacements[i]);
    absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(text);
    ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << replacements[i];
    EXPECT_NE(c.status().message().find(cases[i].second), std::string::npos) << c.status();
  }
  EXPECT_EQ(ModelConfig::FromJson("{not json").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ModelConfigTest, LoadMergesGenerationConfigEos) {
  const std::string dir = NewTempDir("config");
  std::string text = kLlama31;
  text.replace(text.find("[128001, 128008, 128009]"), 24, "128001");
  WriteFileOrDie(dir + "/config.json", text);
  WriteFileOrDie(dir + "/generation_config.json", R"({"eos_token_id": [128001, 128009]})");
  absl::StatusOr<ModelConfig> c = ModelConfig::Load(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->eos_token_ids, (std::vector<int>{128001, 128009}));
}

TEST(ModelConfigTest, MissingConfigIsNotFound) {
  absl::StatusOr<ModelConfig> c = ModelConfig::Load(NewTempDir("empty"));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("config.json"), std::string::npos);
}

TEST(ModelConfigTest, RopeInvFreqDefaultLinearAndLlama3) {
  ModelConfig c;
  c.head_dim = 128;
  c.rope_theta = 500000.0f;
  const std::vector<float> plain = c.RopeInvFreq();
  ASSERT_EQ(plain.size(), 64u);
  EXPECT_FLOAT_EQ(plain[0], 1.0f);
  EXPECT_NEAR(plain[10], std::pow(500000.0, -20.0 / 128), 1e-7 * plain[10]);
  c.rope_scaling = {RopeScaling::Type::kLinear, 4.0f};
  EXPECT_FLOAT_EQ(c.RopeInvFreq()[10], plain[10] / 4);
  c.rope_scaling = {RopeScaling::Type::kLlama3, 8.0f, 1.0f, 4.0f, 8192};
  const std::vector<float> l3 = c.RopeInvFreq();
  int high = 0, mid = 0, low = 0;
  for (int i = 0; i < 64; ++i) {
    const double wavelen = 2 * M_PI / plain[i];
    if (wavelen < 8192 / 4.0) {
      EXPECT_FLOAT_EQ(l3[i], plain[i]) << i;  // high frequency: unchanged
      ++high;
    } else if (wavelen > 8192 / 1.0) {
      EXPECT_FLOAT_EQ(l3[i], plain[i] / 8) << i;  // low frequency: divided by factor
      ++low;
    } else {
      EXPECT_LT(l3[i], plain[i]) << i;  // in between: smoothly interpolated
      EXPECT_GT(l3[i], plain[i] / 8) << i;
      ++mid;
    }
  }
  EXPECT_GT(high, 0);
  EXPECT_GT(mid, 0);
  EXPECT_GT(low, 0);
}

}  // namespace
}  // namespace tandem
