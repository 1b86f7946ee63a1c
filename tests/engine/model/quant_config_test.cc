// QuantConfig: each format's quantization_config as real checkpoints write it is read, and every
// field this loader cannot honour is refused with an error naming it.
#include "engine/model/quant_config.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/model/model_test_util.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<QuantConfig> Parse(const std::string& q) {
  return QuantConfig::FromConfigJson(R"({"model_type": "llama", "quantization_config": )" + q +
                                     "}");
}

std::string Compressed(const std::string& weights, const std::string& input,
                       const std::string& format = "float-quantized",
                       const std::string& extra = "") {
  return R"({"quant_method": "compressed-tensors", "format": ")" + format +
         R"(", "quantization_status": "compressed", )" + extra +
         R"("config_groups": {"group_0": {"targets": ["Linear"], "weights": )" + weights +
         R"(, "input_activations": )" + input + R"(}}, "ignore": ["lm_head"]})";
}
const char* kFp8Weights =
    R"({"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": true, "dynamic": false})";
const char* kInt8Weights =
    R"({"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": true, "dynamic": false})";
const char* kTokenFp8 =
    R"({"num_bits": 8, "type": "float", "strategy": "token", "dynamic": true, "symmetric": true})";

TEST(QuantConfig, NoQuantizationConfigIsUnquantized) {
  absl::StatusOr<QuantConfig> c = QuantConfig::FromConfigJson(R"({"model_type": "llama"})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->quantized());
}

TEST(QuantConfig, ReadsQwen3Fp8BlockConfig) {
  // Qwen3-8B-FP8's quantization_config, verbatim.
  absl::StatusOr<QuantConfig> c = Parse(
      R"({"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
          "weight_block_size": [128, 128]})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->format, QuantConfig::Format::kFp8Block);
  EXPECT_EQ(c->block_n, 128);
  EXPECT_EQ(c->block_k, 128);
  EXPECT_EQ(c->act_quant, ActQuant::kFp8PerTokenGroup);
  EXPECT_EQ(c->act_group_size, 128);
  c = Parse(R"({"quant_method": "fp8", "activation_scheme": "dynamic"})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->format, QuantConfig::Format::kFp8PerTensor);
}

TEST(QuantConfig, ReadsCompressedTensorsFp8AndInt8) {
  absl::StatusOr<QuantConfig> c = Parse(Compressed(kFp8Weights, kTokenFp8));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->format, QuantConfig::Format::kCompressedFp8);
  EXPECT_EQ(c->act_quant, ActQuant::kFp8PerToken);
  c = Parse(Compressed(kInt8Weights, "null", "int-quantized"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->format, QuantConfig::Format::kCompressedInt8);
  EXPECT_EQ(c->act_quant, ActQuant::kNone);
  EXPECT_FALSE(c->per_tensor);
}

TEST(QuantConfig, ReadsAwqAndGptq) {
  absl::StatusOr<QuantConfig> c = Parse(
      R"({"bits": 4, "group_size": 128, "modules_to_not_convert": null, "quant_method": "awq",
          "version": "gemm", "zero_point": true})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->format, QuantConfig::Format::kAwq);
  EXPECT_EQ(c->group_size, 128);
  c = Parse(R"({"bits": 4, "group_size": -1, "desc_act": false, "sym": true,
                "quant_method": "gptq", "checkpoint_format": "gptq_v2"})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->format, QuantConfig::Format::kGptq);
  EXPECT_EQ(c->group_size, -1);
  EXPECT_TRUE(c->gptq_v2);
}

TEST(QuantConfig, RefusesWhatItCannotHonour) {
  struct Bad {
    std::string json;
    absl::StatusCode code;
    std::string says;
  };
  const Bad cases[] = {
      {R"({"quant_method": "bitsandbytes"})", absl::StatusCode::kUnimplemented, "quant_method"},
      {R"({"quant_method": "fp8", "activation_scheme": "static"})",
       absl::StatusCode::kUnimplemented, "activation_scheme"},
      {R"({"quant_method": "fp8", "fmt": "e5m2"})", absl::StatusCode::kUnimplemented, "fmt"},
      {R"({"quant_method": "fp8", "weight_block_size": [128]})", absl::StatusCode::kInvalidArgument,
       "weight_block_size"},
      {R"({"quant_method": "fp8", "modules_to_not_convert": ["model.layers.0.mlp.down_proj"]})",
       absl::StatusCode::kUnimplemented, "model.layers.0.mlp.down_proj"},
      {R"({"quant_method": "awq", "bits": 3, "group_size": 128})", absl::StatusCode::kUnimplemented,
       "bits"},
      {R"({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"})",
       absl::StatusCode::kUnimplemented, "version"},
      {R"({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": false})",
       absl::StatusCode::kUnimplemented, "zero_point"},
      {R"({"quant_method": "awq", "bits": 4, "group_size": 0})", absl::StatusCode::kInvalidArgument,
       "group_size"},
      {R"({"quant_method": "gptq", "bits": 8, "group_size": 128})",
       absl::StatusCode::kUnimplemented, "bits"},
      {R"({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": true})",
       absl::StatusCode::kUnimplemented, "desc_act"},
      {R"({"quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "marlin"})",
       absl::StatusCode::kUnimplemented, "checkpoint_format"},
      {R"({"quant_method": "gptq", "bits": 4, "group_size": 128, "dynamic": {"x": {}}})",
       absl::StatusCode::kUnimplemented, "dynamic"},
      {R"({"quant_method": "gptq", "group_size": 128})", absl::StatusCode::kInvalidArgument,
       "bits"},
      {Compressed(kFp8Weights, kTokenFp8, "float-quantized", R"("kv_cache_scheme": {}, )"),
       absl::StatusCode::kUnimplemented, "kv_cache_scheme"},
      {Compressed(R"({"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": false})",
                  "null", "int-quantized"),
       absl::StatusCode::kUnimplemented, "symmetric"},
      {Compressed(R"({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128})",
                  "null", "pack-quantized"),
       absl::StatusCode::kUnimplemented, "num_bits"},
      {Compressed(kInt8Weights, "null", "pack-quantized"), absl::StatusCode::kUnimplemented,
       "format"},
      {Compressed(kFp8Weights,
                  R"({"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": false})"),
       absl::StatusCode::kUnimplemented, "input_activations"},
  };
  for (const Bad& b : cases) {
    absl::StatusOr<QuantConfig> c = Parse(b.json);
    ASSERT_FALSE(c.ok()) << b.json;
    EXPECT_EQ(c.status().code(), b.code) << c.status();
    EXPECT_THAT(std::string(c.status().message()), HasSubstr(b.says)) << b.json;
  }
  absl::StatusOr<QuantConfig> frozen = QuantConfig::FromConfigJson(
      R"({"quantization_config": {"quant_method": "compressed-tensors",
          "quantization_status": "frozen"}})");
  ASSERT_FALSE(frozen.ok());
  EXPECT_THAT(std::string(frozen.status().message()), HasSubstr("quantization_status"));
}

TEST(QuantConfig, FlagQuantizesOnlyUnquantizedCheckpoints) {
  const std::string plain = testing_util::NewTempDir("quant_flag_plain");
  testing_util::WriteFileOrDie(plain + "/config.json", R"({"model_type": "llama"})");
  absl::StatusOr<QuantConfig> c = QuantConfig::Resolve(plain, "int4");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->format, QuantConfig::Format::kLoadTimeInt4);
  EXPECT_EQ(c->group_size, 128);
  c = QuantConfig::Resolve(plain, "fp8");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->act_quant, ActQuant::kFp8PerToken);
  c = QuantConfig::Resolve(plain, "nf4");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("fp8, int8 or int4"));

  const std::string quantized = testing_util::NewTempDir("quant_flag_awq");
  testing_util::WriteFileOrDie(quantized + "/config.json",
                               R"({"quantization_config": {"quant_method": "awq", "bits": 4,
                                   "group_size": 128}})");
  c = QuantConfig::Resolve(quantized, "fp8");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("already quantized"));
  c = QuantConfig::Resolve(quantized, "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->format, QuantConfig::Format::kAwq);
}

}  // namespace
}  // namespace tandem
