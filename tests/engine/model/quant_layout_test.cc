// Quantized checkpoints through tandem's loader:
// - each format's unpacking against an independent reference: quant_layouts.py (numpy) packs
//   random codes as the format's documentation describes and writes the dequantized weights;
//   the loader's fused, dequantized weights must equal them exactly;
// - make-model's pre-quantized checkpoints dequantize to the bf16 checkpoint of the same seed
//   within each format's rounding bound;
// - shapes a format cannot hold, and tensors that do not match the config, are refused.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "base/check.h"
#include "base/status_macros.h"
#include "engine/model/make_model.h"
#include "engine/model/model.h"
#include "engine/model/quant_config.h"
#include "engine/model/safetensors.h"
#include "engine/model/weights.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/model/model_test_util.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;
using testing_util::NewTempDir;

constexpr char kPreset[] = "tiny-qwen3-untied";  // hidden 128, intermediate 256, kv rows 64

std::string MakeOrDie(const std::string& tag, const std::string& quantization,
                      const std::string& preset = kPreset, int64_t group = 128) {
  MakeModelOptions o;
  o.preset = preset;
  o.out_dir = NewTempDir(tag);
  o.seed = 11;
  o.quantization = quantization;
  o.quant_group_size = group;
  absl::StatusOr<ModelConfig> c = MakeModel(o);
  CHECK(c.ok()) << c.status();
  return o.out_dir;
}

absl::StatusOr<ModelWeights> Load(const std::string& dir) {
  ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::Load(dir));
  ASSIGN_OR_RETURN(QuantConfig quant, QuantConfig::Resolve(dir, ""));
  ASSIGN_OR_RETURN(auto ckpt, SafetensorsCheckpoint::Open(dir));
  return LoadWeights(*ckpt, config, DType::kF32, quant);
}

// The linear weights of layer l in fusion order, with the names of their parts.
struct Linear {
  const HostTensor* tensor;
  std::vector<std::string> parts;
};
std::vector<Linear> Linears(const ModelWeights& w, int l) {
  const std::string p = "model.layers." + std::to_string(l) + ".";
  const LayerWeights& lw = w.layers[l];
  return {{&lw.qkv_proj,
           {p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
            p + "self_attn.v_proj.weight"}},
          {&lw.o_proj, {p + "self_attn.o_proj.weight"}},
          {&lw.gate_up_proj, {p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"}},
          {&lw.down_proj, {p + "mlp.down_proj.weight"}}};
}

std::vector<float> F32Rows(const SafetensorsCheckpoint& ckpt,
                           const std::vector<std::string>& names) {
  std::vector<float> out;
  for (const std::string& name : names) {
    const SafetensorsCheckpoint::Entry e = ckpt.Find(name);
    CHECK(e.file != nullptr && e.info->dtype == DType::kF32) << name;
    const float* p = reinterpret_cast<const float*>(e.file->Data(*e.info));
    out.insert(out.end(), p, p + e.info->NumElements());
  }
  return out;
}

class LayoutTest : public ::testing::TestWithParam<std::string> {};

TEST_P(LayoutTest, UnpacksAsTheIndependentNumpyReference) {
  const std::string base = MakeOrDie("layout_base", "");
  const std::string q = NewTempDir("layout_q_" + GetParam()), d = NewTempDir("layout_dense");
  const char* src = std::getenv("TANDEM_SOURCE_DIR");
  ASSERT_NE(src, nullptr) << "run through ctest (TANDEM_SOURCE_DIR)";
  const std::string cmd = "python3 " + std::string(src) +
                          "/tests/engine/model/quant_layouts.py --base " + base + " --format " +
                          GetParam() + " --out " + q + " --dense " + d;
  const int rc = std::system(cmd.c_str());
  if (WIFEXITED(rc) && WEXITSTATUS(rc) == 77) GTEST_SKIP() << "numpy not available to python3";
  ASSERT_EQ(rc, 0) << cmd;
  absl::StatusOr<ModelWeights> w = Load(q);
  ASSERT_TRUE(w.ok()) << w.status();
  absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> dense = SafetensorsCheckpoint::Open(d);
  ASSERT_TRUE(dense.ok()) << dense.status();
  for (int l = 0; l < static_cast<int>(w->layers.size()); ++l) {
    for (const Linear& lin : Linears(*w, l)) {
      ASSERT_NE(lin.tensor->quant, nullptr) << lin.parts[0];
      const std::vector<float> got = lin.tensor->quant->Dequantize();
      const std::vector<float> want = F32Rows(**dense, lin.parts);
      ASSERT_EQ(got.size(), want.size()) << lin.parts[0];
      int64_t mismatches = 0;
      for (size_t i = 0; i < got.size(); ++i) mismatches += got[i] != want[i];
      EXPECT_EQ(mismatches, 0) << lin.parts[0] << " of " << GetParam();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, LayoutTest,
                         ::testing::Values("fp8-block", "fp8-channel", "int8", "awq", "gptq",
                                           "gptq-v2"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& ch : s) ch = ch == '-' ? '_' : ch;
                           return s;
                         });

// |dequant(w) - w| <= the format's rounding bound, element by element.
void ExpectWithinRounding(const std::string& scheme, const QuantizedWeight& q,
                          const std::vector<float>& w, const std::string& what) {
  const std::vector<float> got = q.Dequantize();
  ASSERT_EQ(got.size(), w.size());
  const int64_t groups = q.num_groups();
  double worst = 0;
  for (int64_t j = 0; j < q.n; ++j) {
    for (int64_t kk = 0; kk < q.k; ++kk) {
      const float s = q.scales[j * groups + kk / q.group_size];
      const float x = w[j * q.k + kk], err = std::fabs(got[j * q.k + kk] - x);
      // fp8: half a unit in the last of 3 mantissa bits (relative 2^-4), or half the subnormal
      // step; int8 / int4: half a step, a whole step where a group's end is clamped (AWQ / GPTQ
      // zero and scale rounded to integers and f16).
      const float bound = q.code == QuantCode::kFp8E4M3 ? std::fabs(x) / 16 + s / 1024
                          : q.code == QuantCode::kInt8  ? s * 0.5f * 1.001f
                                                        : s * 1.001f;
      worst = std::max(worst, static_cast<double>(err / bound));
      ASSERT_LE(err, bound) << what << " [" << j << ", " << kk << "] " << scheme;
    }
  }
  EXPECT_GT(worst, 0.0) << what << ": no rounding at all is not a quantized weight";
}

TEST(QuantMakeModel, EveryFormatDequantizesToTheBf16Weights) {
  const std::string base = MakeOrDie("roundtrip_base", "");
  absl::StatusOr<ModelWeights> dense = Load(base);
  ASSERT_TRUE(dense.ok()) << dense.status();
  for (const std::string scheme : {"fp8-block", "fp8-channel", "int8", "awq", "gptq"}) {
    absl::StatusOr<ModelWeights> w = Load(MakeOrDie("roundtrip_" + scheme, scheme));
    ASSERT_TRUE(w.ok()) << scheme << ": " << w.status();
    for (int l = 0; l < static_cast<int>(w->layers.size()); ++l) {
      const std::vector<Linear> q = Linears(*w, l), d = Linears(*dense, l);
      for (size_t i = 0; i < q.size(); ++i) {
        ASSERT_NE(q[i].tensor->quant, nullptr);
        const float* p = reinterpret_cast<const float*>(d[i].tensor->data());
        ExpectWithinRounding(scheme, *q[i].tensor->quant,
                             std::vector<float>(p, p + d[i].tensor->NumElements()), q[i].parts[0]);
      }
    }
    // Embeddings and norms are untouched.
    EXPECT_EQ(w->embed_tokens.bytes, dense->embed_tokens.bytes) << scheme;
    EXPECT_EQ(w->lm_head.bytes, dense->lm_head.bytes) << scheme;
  }
}

TEST(QuantMakeModel, LoadTimeQuantizationHandlesPartialGroupsAndUnevenShapes) {
  // tiny-llama3: hidden 64 and intermediate 176, neither a multiple of 128: int4 groups of 128
  // end in a partial group, fp8 / int8 per channel are shape-free.
  const std::string base = MakeOrDie("loadtime_base", "", "tiny-llama3");
  for (const std::string flag : {"fp8", "int8", "int4"}) {
    absl::StatusOr<std::unique_ptr<Model>> m = LoadModel(base, Backend::kCpu, flag);
    ASSERT_TRUE(m.ok()) << flag << ": " << m.status();
    std::vector<testing_util::SeqResult> r =
        testing_util::GenerateGreedy(**m, {{1, 2, 3, 4, 5, 6, 7}}, 3, 7, 4, DType::kF32);
    ASSERT_EQ(r[0].tokens.size(), 3u) << flag;
    for (float v : r[0].prompt_logits) ASSERT_TRUE(std::isfinite(v)) << flag;
  }
}

TEST(QuantMakeModel, RefusesShapesTheFormatCannotHold) {
  MakeModelOptions o;
  o.preset = "tiny-llama3";  // in_features 64 / 176: not multiples of 128
  o.out_dir = NewTempDir("bad_group");
  o.quantization = "awq";
  absl::StatusOr<ModelConfig> c = MakeModel(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("group_size 128"));
  o.quantization = "int3";
  EXPECT_THAT(std::string(MakeModel(o).status().message()), HasSubstr("known: fp8-block"));
  // Group 16 divides every in_features of tiny-llama3 (64, 176): written and loaded.
  absl::StatusOr<ModelWeights> w = Load(MakeOrDie("group16", "gptq", "tiny-llama3", 16));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->layers[0].down_proj.quant->group_size, 16);
}

TEST(QuantLoad, RefusesTensorsThatDoNotMatchTheConfig) {
  const std::string awq = MakeOrDie("mismatch_awq", "awq");
  // The config claims groups of 64: qzeros / scales have half the rows expected.
  std::string config = testing_util::ReadFileOrDie(awq + "/config.json");
  const size_t at = config.find("\"group_size\": 128");
  ASSERT_NE(at, std::string::npos);
  testing_util::WriteFileOrDie(awq + "/config.json", config.replace(at, 17, "\"group_size\": 64"));
  absl::Status st = Load(awq).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("model.layers.0.self_attn.q_proj.qzeros"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("expected [2, 16]"));

  // An int8 checkpoint declared as FP8: the weight's dtype is named.
  const std::string int8 = MakeOrDie("mismatch_int8", "int8");
  config = testing_util::ReadFileOrDie(int8 + "/config.json");
  for (auto [from, to] : {std::pair<std::string, std::string>{"int-quantized", "float-quantized"},
                          {"\"type\": \"int\"", "\"type\": \"float\""}}) {
    config.replace(config.find(from), from.size(), to);
  }
  testing_util::WriteFileOrDie(int8 + "/config.json", config);
  st = Load(int8).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("dtype I8, expected F8_E4M3"));

  // An unquantized checkpoint that claims fp8: the scales are missing.
  const std::string plain = MakeOrDie("mismatch_plain", "");
  config = testing_util::ReadFileOrDie(plain + "/config.json");
  config.insert(
      config.rfind('}'),
      R"(, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]})");
  testing_util::WriteFileOrDie(plain + "/config.json", config);
  st = Load(plain).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("q_proj.weight in"));
}

}  // namespace
}  // namespace tandem
