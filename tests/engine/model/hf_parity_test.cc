// Numerics against a real peer: tandem's CPU forward pass on every tiny make-model preset versus
// Hugging Face transformers (float32) on the same checkpoint.
//
// The golden file (testdata/hf_golden.json, written by make_golden.py) holds, per preset and
// seed, a few prompts with transformers' last-position logits and a 40-token greedy continuation.
// The test re-creates the checkpoint (make-model is deterministic from the seed), runs the prompts
// as one continuous batch (prompt chunks of 20 tokens mixed with other sequences' decode steps,
// page size 7 so pages never align with the prompts, pages in scrambled order), and requires:
//   * last-position logits: max |tandem - HF| <= kLogitTolerance * max(1, max |HF logit|)
//     (fp32 everywhere; the difference is summation order, measured ~1e-6 relative);
//   * the greedy continuation identical for all 40 tokens, with each chosen token's logit within
//     the same tolerance.
// Live mode: with TANDEM_REF_PYTHON naming a python that has torch + transformers, the golden
// file is regenerated on the fly with the tandem binary of this build (CI uses the committed one).
#include <cmath>
#include <cstdlib>
#include <iostream>

#include "base/check.h"
#include "engine/model/make_model.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engine/model/model_test_util.h"

namespace tandem {
namespace {

using json = nlohmann::json;
using testing_util::GenerateGreedy;
using testing_util::MaxAbs;
using testing_util::NewTempDir;
using testing_util::ReadFileOrDie;
using testing_util::SeqResult;

constexpr double kLogitTolerance = 1e-4;
constexpr int kPageSize = 7;
constexpr int kChunk = 20;

std::string SourceDir() {
  const char* dir = std::getenv("TANDEM_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

// The golden JSON: regenerated live when TANDEM_REF_PYTHON is set, else the committed file.
json LoadGolden() {
  std::string path = SourceDir() + "/tests/engine/model/testdata/hf_golden.json";
  const char* python = std::getenv("TANDEM_REF_PYTHON");
  const char* bin = std::getenv("TANDEM_BINARY_DIR");
  if (python != nullptr && *python != '\0' && bin != nullptr) {
    const std::string out = NewTempDir("golden") + "/hf_golden.json";
    const std::string cmd = std::string(python) + " " + SourceDir() +
                            "/tests/engine/model/make_golden.py --tandem " + bin +
                            "/bin/tandem --out " + out + " 2>/dev/null";
    std::cerr << "live mode: " << cmd << "\n";
    if (std::system(cmd.c_str()) != 0) {
      ADD_FAILURE() << "live golden generation failed: " << cmd;
    } else {
      path = out;
    }
  }
  json j = json::parse(ReadFileOrDie(path), nullptr, false);
  CHECK(!j.is_discarded()) << path;
  return j;
}

void CheckCase(const std::string& preset, const json& want, const SeqResult& got, int vocab) {
  const auto hf_logits = want["last_logits"].get<std::vector<float>>();
  const auto hf_tokens = want["greedy_tokens"].get<std::vector<int32_t>>();
  const auto hf_token_logits = want["greedy_logits"].get<std::vector<float>>();
  const size_t prompt_len = want["prompt"].size();
  SCOPED_TRACE(preset + ", prompt of " + std::to_string(prompt_len) + " tokens");
  ASSERT_EQ(got.prompt_logits.size(), static_cast<size_t>(vocab));
  const double tol = kLogitTolerance * std::max(1.0, MaxAbs(hf_logits));
  double max_err = 0;
  for (int i = 0; i < vocab; ++i) {
    ASSERT_TRUE(std::isfinite(got.prompt_logits[i])) << "logit " << i;
    max_err = std::max(max_err, std::fabs(double{got.prompt_logits[i]} - hf_logits[i]));
  }
  EXPECT_LE(max_err, tol) << "max abs logit error";
  std::cout << preset << " prompt " << prompt_len << ": max abs logit error " << max_err
            << " (tolerance " << tol << ")\n";
  EXPECT_EQ(got.tokens, hf_tokens) << "greedy continuation differs";
  for (size_t i = 0; i < hf_token_logits.size() && i < got.token_logits.size(); ++i) {
    EXPECT_NEAR(got.token_logits[i], hf_token_logits[i], tol) << "step " << i;
  }
}

class HfParityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { golden_ = new json(LoadGolden()); }
  static void TearDownTestSuite() { delete golden_; }
  static json* golden_;
};
json* HfParityTest::golden_ = nullptr;

void RunPreset(const json& entry, DType kv_dtype) {
  const std::string preset = entry["preset"];
  const std::string dir = NewTempDir(preset);
  absl::StatusOr<ModelConfig> made =
      MakeModel({.preset = preset, .out_dir = dir, .seed = entry["seed"].get<uint64_t>()});
  ASSERT_TRUE(made.ok()) << made.status();
  ASSERT_EQ(made->vocab_size, entry["vocab_size"].get<int>()) << preset;
  absl::StatusOr<std::unique_ptr<Model>> model = LoadModel(dir, Backend::kCpu);
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<std::vector<int32_t>> prompts;
  for (const json& c : entry["cases"]) prompts.push_back(c["prompt"].get<std::vector<int32_t>>());
  const int new_tokens = static_cast<int>(entry["cases"][0]["greedy_tokens"].size());
  const std::vector<SeqResult> results =
      GenerateGreedy(**model, prompts, new_tokens, kPageSize, kChunk, kv_dtype);
  for (size_t i = 0; i < prompts.size(); ++i) {
    CheckCase(preset, entry["cases"][i], results[i], made->vocab_size);
  }
}

TEST_F(HfParityTest, EveryTinyPresetMatchesTransformers) {
  ASSERT_GE((*golden_)["models"].size(), 6u);
  for (const json& entry : (*golden_)["models"]) {
    RunPreset(entry, DType::kF32);
  }
}

// The engine stores KV in bf16 for bf16 checkpoints: same prompts, a bf16 cache, looser bound
// (K/V rounded to 8 mantissa bits; measured max error <= 0.06, about 0.6% of max |logit|).
TEST_F(HfParityTest, Bf16KvCacheStaysClose) {
  constexpr double kBf16Tolerance = 3e-2;
  for (const json& entry : (*golden_)["models"]) {
    const std::string preset = entry["preset"];
    const std::string dir = NewTempDir(preset + "_bf16");
    absl::StatusOr<ModelConfig> made =
        MakeModel({.preset = preset, .out_dir = dir, .seed = entry["seed"].get<uint64_t>()});
    ASSERT_TRUE(made.ok()) << made.status();
    absl::StatusOr<std::unique_ptr<Model>> model = LoadModel(dir, Backend::kCpu);
    ASSERT_TRUE(model.ok()) << model.status();
    std::vector<std::vector<int32_t>> prompts;
    for (const json& c : entry["cases"]) prompts.push_back(c["prompt"].get<std::vector<int32_t>>());
    const std::vector<SeqResult> results =
        GenerateGreedy(**model, prompts, 1, kPageSize, kChunk, DType::kBF16);
    for (size_t i = 0; i < prompts.size(); ++i) {
      const auto hf = entry["cases"][i]["last_logits"].get<std::vector<float>>();
      double max_err = 0;
      for (size_t v = 0; v < hf.size(); ++v) {
        max_err = std::max(max_err, std::fabs(double{results[i].prompt_logits[v]} - hf[v]));
      }
      std::cout << preset << " prompt " << prompts[i].size() << " (bf16 KV): max abs logit error "
                << max_err << "\n";
      EXPECT_LE(max_err, kBf16Tolerance * std::max(1.0, MaxAbs(hf))) << preset;
    }
  }
}

}  // namespace
}  // namespace tandem
