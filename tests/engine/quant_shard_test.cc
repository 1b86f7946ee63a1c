// Where a tensor-parallel rank's slice may cut each quantized format (engine/model/quant_shard.h):
// CheckQuantSlice's rules on awkward cuts, and loads at a TP whose slices cut through a 128-column
// fp8 block, an int4 group or the eight columns packed per int32: InvalidArgument naming the
// tensor, its shape, the cut and the TP (never a silent misread).
#include "engine/model/quant_shard.h"

#include <string>
#include <vector>

#include "base/check.h"
#include "engine/model/make_model.h"
#include "engine/model/model.h"
#include "engine/model/quant_config.h"
#include "gtest/gtest.h"
#include "tests/engine/model/model_test_util.h"

namespace tandem::testing {
namespace {

// tiny-llama3 (hidden 64, 4 heads of 16, intermediate 176) in `scheme` ("" = bf16).
std::string Make(const std::string& scheme, int64_t group = 128) {
  MakeModelOptions o;
  o.preset = "tiny-llama3";
  o.out_dir = testing_util::NewTempDir("qshard_" + scheme);
  o.seed = 9;
  o.quantization = scheme;
  o.quant_group_size = group;
  CHECK_OK(MakeModel(o).status());
  return o.out_dir;
}

void ExpectRefused(const std::string& dir, const std::string& flag, int tp,
                   const std::vector<std::string>& needles) {
  const absl::Status st =
      LoadModel(dir, Backend::kCpu, ParallelConfig{.tensor_parallel = tp}, flag).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  for (const std::string& n : needles) {
    EXPECT_NE(st.message().find(n), std::string::npos) << "\"" << n << "\" not in: " << st;
  }
}

TEST(QuantShardTest, CheckQuantSliceRules) {
  auto config = [](const std::string& json) {
    absl::StatusOr<QuantConfig> q =
        QuantConfig::FromConfigJson(R"({"quantization_config": )" + json + "}");
    CHECK_OK(q.status());
    return *q;
  };
  const QuantConfig block = config(
      R"({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]})");
  // A [256, 320] weight: k ends in a partial block of 64.
  auto check = [](const QuantConfig& q, int dim, int64_t begin, int64_t count) {
    return CheckQuantSlice(q, "m", 256, 320, TensorSlice{dim, begin, count}, 2);
  };
  EXPECT_TRUE(check(block, 1, 0, 128).ok());
  EXPECT_TRUE(check(block, 1, 256, 64).ok());  // the last, partial block, up to the edge
  EXPECT_EQ(check(block, 1, 128, 64).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(check(block, 1, 64, 128).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(check(block, 0, 3, 61).ok());  // rows: any cut (per-row scales)
  EXPECT_TRUE(check(block, -1, 0, 0).ok());
  const QuantConfig awq = config(R"({"quant_method": "awq", "bits": 4, "group_size": 64})");
  EXPECT_TRUE(check(awq, 0, 8, 16).ok());
  EXPECT_EQ(check(awq, 0, 4, 16).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(check(awq, 1, 64, 128).ok());
  EXPECT_TRUE(check(awq, 1, 256, 64).ok());
  EXPECT_EQ(check(awq, 1, 64, 96).code(), absl::StatusCode::kInvalidArgument);
  const QuantConfig gptq_row =
      config(R"({"quant_method": "gptq", "bits": 4, "group_size": -1, "desc_act": false})");
  EXPECT_TRUE(check(gptq_row, 1, 160, 160).ok());  // one group per row: replicated
  EXPECT_EQ(check(gptq_row, 1, 4, 160).code(), absl::StatusCode::kInvalidArgument);  // packing
  const QuantConfig gptq_12 =
      config(R"({"quant_method": "gptq", "bits": 4, "group_size": 12, "desc_act": false})");
  EXPECT_TRUE(check(gptq_12, 1, 24, 48).ok());  // lcm(12, 8)
  EXPECT_EQ(check(gptq_12, 1, 12, 48).code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<QuantConfig> int4 = QuantConfig::FromConfigJson("{}");
  ASSERT_TRUE(int4.ok());
  int4->format = QuantConfig::Format::kLoadTimeInt4;
  int4->group_size = 128;
  EXPECT_TRUE(check(*int4, 1, 256, 64).ok());
  EXPECT_EQ(check(*int4, 1, 160, 160).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(check(*int4, 0, 5, 7).ok());
  const QuantConfig channel = config(
      R"({"quant_method": "compressed-tensors", "format": "int-quantized", "config_groups": )"
      R"({"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "int", )"
      R"("strategy": "channel", "symmetric": true, "dynamic": false}}}})");
  EXPECT_TRUE(check(channel, 1, 7, 13).ok());
  EXPECT_TRUE(check(channel, 0, 7, 13).ok());
}

TEST(QuantShardTest, CutsThroughABlockOrAGroupAreRefused) {
  // tiny-llama3: hidden 64, 4 heads of 16 (o_proj in_features 64), intermediate 176.
  // fp8 block: o_proj's 64 columns are half of one 128-column block at TP 2.
  ExpectRefused(Make("fp8-block"), "", 2,
                {"model.layers.0.self_attn.o_proj", "[64, 64]", "tensor_parallel 2", "in_features",
                 "cutting at 32", "128x128 scale block"});
  // awq group 16 at TP 4: gate_proj's 176 rows give 44 per rank, not a multiple of 8.
  ExpectRefused(Make("awq", 16), "", 4,
                {"model.layers.0.mlp.gate_proj", "[176, 64]", "tensor_parallel 4", "out_features",
                 "cutting at 44", "eight output columns"});
  // gptq group 16 at TP 2: down_proj's 176 columns give 88 per rank, cutting a group.
  ExpectRefused(Make("gptq", 16), "", 2,
                {"model.layers.0.mlp.down_proj", "[64, 176]", "tensor_parallel 2", "cutting at 88",
                 "quantization group of 16"});
  // --quantization int4 (groups of 128 along k) at TP 2: o_proj's 64 columns, cut at 32.
  ExpectRefused(Make(""), "int4", 2,
                {"model.layers.0.self_attn.o_proj", "[64, 64]", "tensor_parallel 2",
                 "cutting at 32", "quantization group of 128"});
}

}  // namespace
}  // namespace tandem::testing
