// Accuracy of each quantized format against the bf16 model it was made from (the same random
// checkpoint: make-model's seed), on a fixed prompt set: the KL divergence of the last-position
// next-token distributions, KL(p_bf16 || p_quant) in nats averaged over prompts, and how often
// the argmax agrees. Printed as the table engine/model/README.md quotes (random weights, not a
// real model: the numbers compare formats, they do not predict a real model's accuracy).
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "base/check.h"
#include "base/status_macros.h"
#include "engine/model/make_model.h"
#include "engine/model/model.h"
#include "gtest/gtest.h"
#include "tests/engine/model/model_test_util.h"

namespace tandem {
namespace {

using testing_util::GenerateGreedy;
using testing_util::SeqResult;

constexpr int kPrompts = 64;

std::vector<std::vector<int32_t>> Prompts(int vocab) {
  std::mt19937 rng(2026);
  std::vector<std::vector<int32_t>> prompts;
  for (int p = 0; p < kPrompts; ++p) {
    std::vector<int32_t> ids(1 + p * 3 % 37);
    for (int32_t& id : ids) id = static_cast<int32_t>(rng() % vocab);
    prompts.push_back(std::move(ids));
  }
  return prompts;
}

std::vector<double> Softmax(const std::vector<float>& logits) {
  double mx = -1e30, sum = 0;
  for (float v : logits) mx = std::max(mx, static_cast<double>(v));
  std::vector<double> p(logits.size());
  for (size_t i = 0; i < p.size(); ++i) sum += p[i] = std::exp(logits[i] - mx);
  for (double& v : p) v /= sum;
  return p;
}

size_t Argmax(const std::vector<float>& v) {
  return static_cast<size_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

struct Accuracy {
  double kl = 0;
  double top1 = 0;
};

Accuracy Compare(const std::vector<SeqResult>& ref, const std::vector<SeqResult>& got) {
  Accuracy a;
  for (size_t i = 0; i < ref.size(); ++i) {
    const std::vector<double> p = Softmax(ref[i].prompt_logits), q = Softmax(got[i].prompt_logits);
    for (size_t t = 0; t < p.size(); ++t) {
      if (p[t] > 0) a.kl += p[t] * (std::log(p[t]) - std::log(std::max(q[t], 1e-300)));
    }
    a.top1 += Argmax(ref[i].prompt_logits) == Argmax(got[i].prompt_logits);
  }
  a.kl /= static_cast<double>(ref.size());
  a.top1 /= static_cast<double>(ref.size());
  return a;
}

std::vector<SeqResult> RunModel(const std::string& dir, const std::string& flag,
                                const std::vector<std::vector<int32_t>>& prompts) {
  absl::StatusOr<std::unique_ptr<Model>> m = LoadModel(dir, Backend::kCpu, flag);
  CHECK(m.ok()) << dir << " " << flag << ": " << m.status();
  return GenerateGreedy(**m, prompts, 1, 16, 64, DType::kF32);
}

struct Format {
  std::string name;        // as printed
  std::string make_model;  // make-model --quantization ("" = the bf16 checkpoint)
  std::string flag;        // --quantization at load time
  double max_kl;           // bounds: ~3x the KL measured (README table), top-1 with margin
  double min_top1;
};

TEST(QuantAccuracy, EachFormatAgainstTheBf16Model) {
  const Format formats[] = {
      {"fp8 block 128x128 (W8A8)", "fp8-block", "", 0.2, 0.6},
      {"fp8 per-channel (W8A8, compressed-tensors)", "fp8-channel", "", 0.2, 0.6},
      {"int8 per-channel (W8A16, compressed-tensors)", "int8", "", 0.005, 0.9},
      {"int4 AWQ g128 (W4A16)", "awq", "", 0.6, 0.45},
      {"int4 GPTQ g128 sym (W4A16)", "gptq", "", 0.6, 0.45},
      {"--quantization fp8", "", "fp8", 0.2, 0.6},
      {"--quantization int8", "", "int8", 0.005, 0.9},
      {"--quantization int4", "", "int4", 0.6, 0.45},
  };
  for (const std::string preset : {"tiny-qwen3-untied", "tiny-llama31"}) {
    MakeModelOptions o;
    o.preset = preset;
    o.seed = 5;
    o.out_dir = testing_util::NewTempDir("acc_bf16");
    absl::StatusOr<ModelConfig> config = MakeModel(o);
    ASSERT_TRUE(config.ok()) << config.status();
    const std::string bf16_dir = o.out_dir;
    const auto prompts = Prompts(config->vocab_size);
    const std::vector<SeqResult> ref = RunModel(bf16_dir, "", prompts);
    std::printf("\n%s (random weights, seed 5), %d prompts of 1-37 tokens, last position:\n",
                preset.c_str(), kPrompts);
    std::printf("| format | KL(bf16 || quant) nats | top-1 agreement |\n| --- | --- | --- |\n");
    for (const Format& f : formats) {
      std::string dir = bf16_dir;
      if (!f.make_model.empty()) {
        o.out_dir = testing_util::NewTempDir("acc_q");
        o.quantization = f.make_model;
        ASSERT_TRUE(MakeModel(o).ok()) << f.name;
        o.quantization.clear();
        dir = o.out_dir;
      }
      const Accuracy a = Compare(ref, RunModel(dir, f.flag, prompts));
      std::printf("| %s | %.5f | %.3f |\n", f.name.c_str(), a.kl, a.top1);
      EXPECT_GT(a.kl, 0.0) << f.name << ": identical logits mean nothing was quantized";
      EXPECT_LE(a.kl, f.max_kl) << f.name << " on " << preset;
      EXPECT_GE(a.top1, f.min_top1) << f.name << " on " << preset;
    }
  }
}

}  // namespace
}  // namespace tandem
