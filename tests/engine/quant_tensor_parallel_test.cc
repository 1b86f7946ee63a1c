// Quantized weights with tensor (and pipeline) parallelism on the CPU backend
// (engine/model/quant_shard.h): for every quantized format, pre-quantized (make-model's writer)
// and quantized at load (--quantization fp8 / int8 / int4):
//   * each rank's quantized weights are bitwise the same slices of the whole quantized weights
//     (codes, scales, zero points, group size) at TP 2 and 4: read in the checkpoint's layout,
//     or quantized from the rank's slice (per-channel row-parallel slices with the whole rows'
//     scales);
//   * the model at TP 2, TP 4 and TP 2 x PP 2 against TP 1 of the same quantized checkpoint:
//     three prompts (1, 13, 45 tokens) as one continuous batch, last-position logits within
//     kSumOrderTolerance and the same 40 greedy tokens;
//   * the engine (EngineOptions::quantization with tensor_parallel / pipeline_parallel): batched
//     chunked requests give TP 1's tokens;
//   * (quant_shard_test.cc) shard boundaries a format cannot cut (a 128-column fp8 block, an
//     int4 group, the eight columns packed per int32) are InvalidArgument naming the tensor, its
//     shape and the TP.
// fp32 everywhere on the CPU, so TP differs from TP 1 by the summation order of the split GEMMs
// and the all-reduce alone, with two FP8 W8A8 (dynamic activation scales) caveats:
//   * the activations are rounded to e4m3, a step function: a summation-order difference in the
//     residual stream (~1e-7) now and then moves an activation (or a per-token scale) across a
//     rounding boundary, a jump of up to a few percent of the logits on these random models. So
//     W8A8 logits are within kW8A8Tolerance, and greedy tokens agree up to a near tie of the
//     reference (a top-2 margin below kW8A8NearTie of the logits' scale);
//   * per-token activation scales (fp8-channel, --quantization fp8) on a row-parallel layer are
//     per rank: each rank quantizes its slice of o_proj's / down_proj's input with the max of
//     that slice, as vLLM does (an exact global scale would cost one more collective per layer).
//     That is FP8 per token and group of k / TP along k, so those formats are compared (as
//     above) with TP 1 whose row-parallel weights quantize their
//     activations so (Tp1WithRankActGroups); against plain TP 1 the difference is FP8 activation
//     rounding (within kPerRankActBound, tokens not compared). fp8 block's per-128-column scales
//     are unaffected: their groups never straddle ranks.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "base/check.h"
#include "engine/engine.h"
#include "engine/model/llama_model.h"
#include "engine/model/make_model.h"
#include "engine/model/parallel_model.h"
#include "engine/model/presets.h"
#include "engine/model/quant_config.h"
#include "engine/model/safetensors.h"
#include "engine/model/tensor_shard.h"
#include "engine/model/weights.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"
#include "tests/engine/model/model_test_util.h"

namespace tandem::testing {
namespace {

using testing_util::GenerateGreedy;
using testing_util::NewTempDir;
using testing_util::SeqResult;

constexpr double kSumOrderTolerance = 1e-5;
constexpr double kW8A8Tolerance = 0.05;  // measured <= 0.022
constexpr double kW8A8NearTie = 0.02;
constexpr double kPerRankActBound = 0.2;  // measured <= 0.092
constexpr int kNewTokens = 40;

// Shapes every format can split at TP 2 and 4 (row-parallel cuts on multiples of 128): hidden
// 256, 8 query heads and 2 KV heads of 64 (TP 4 replicates each KV head on two ranks; a rank's
// 64 K/V rows cut through a 128-row fp8 block, which is exact), intermediate 512.
ModelConfig SplittableConfig() {
  absl::StatusOr<ModelPreset> p = FindModelPreset("tiny-llama3");
  CHECK_OK(p.status());
  ModelConfig c = p->config;
  c.hidden_size = 256;
  c.num_q_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.intermediate_size = 512;
  c.num_layers = 2;
  return c;
}

// A checkpoint of `scheme` ("" = bf16) in SplittableConfig's shapes, or the preset's.
std::string Make(const std::string& scheme, const std::string& preset = "", int64_t group = 128) {
  MakeModelOptions o;
  o.preset = preset.empty() ? "tiny-llama3" : preset;
  o.out_dir = NewTempDir("qtp_" + scheme);
  o.seed = 9;
  o.quantization = scheme;
  o.quant_group_size = group;
  if (preset.empty()) o.config = SplittableConfig();
  CHECK_OK(MakeModel(o).status());
  return o.out_dir;
}

struct Format {
  std::string scheme;  // make-model --quantization ("" = bf16 checkpoint)
  std::string flag;    // --quantization at load
  bool w8a8 = false;
  bool per_rank_act = false;  // per-token activation scales
  int64_t group = 128;        // awq, gptq (-1: one group per row)
  std::string Name() const {
    if (scheme.empty()) return "--quantization " + flag;
    return group == 128 ? scheme : scheme + " group " + std::to_string(group);
  }
};
const Format kFormats[] = {{"fp8-block", "", true},
                           {"fp8-channel", "", true, true},
                           {"int8", ""},
                           {"awq", ""},
                           {"gptq", ""},
                           {"gptq", "", false, false, -1},
                           {"", "fp8", true, true},
                           {"", "int8"},
                           {"", "int4"}};

// --- Each rank's weights are slices of the whole -------------------------------------------

// Rows [begin, begin + count) of each range, one after the other.
QuantizedWeight Rows(const QuantizedWeight& w, const std::vector<std::pair<int64_t, int64_t>>& r) {
  QuantizedWeight out = w;
  const int64_t row_bytes = static_cast<int64_t>(w.codes.size()) / w.n, groups = w.num_groups();
  out.n = 0;
  out.codes.clear();
  out.scales.clear();
  out.zeros.clear();
  for (auto [begin, count] : r) {
    out.n += count;
    out.codes.insert(out.codes.end(), w.codes.begin() + begin * row_bytes,
                     w.codes.begin() + (begin + count) * row_bytes);
    out.scales.insert(out.scales.end(), w.scales.begin() + begin * groups,
                      w.scales.begin() + (begin + count) * groups);
    if (!w.zeros.empty()) {
      out.zeros.insert(out.zeros.end(), w.zeros.begin() + begin * groups,
                       w.zeros.begin() + (begin + count) * groups);
    }
  }
  return out;
}

// Columns [begin, begin + count) (begin on a group boundary; one group per row: replicated).
QuantizedWeight Cols(const QuantizedWeight& w, int64_t begin, int64_t count) {
  QuantizedWeight out = w;
  const bool per_row = w.group_size == w.k;
  const int64_t g0 = per_row ? 0 : begin / w.group_size, groups = w.num_groups();
  out.k = count;
  out.group_size = per_row ? count : w.group_size;
  const int64_t local_groups = out.num_groups();
  const bool nibbles = w.code == QuantCode::kUint4;
  const int64_t row_bytes = QuantRowBytes(w.code, w.k), out_bytes = QuantRowBytes(w.code, count);
  out.codes.assign(w.n * out_bytes, 0);
  out.scales.assign(w.n * local_groups, 0.0f);
  out.zeros.assign(w.zeros.empty() ? 0 : w.n * local_groups, 0);
  for (int64_t j = 0; j < w.n; ++j) {
    const int64_t b0 = nibbles ? begin / 2 : begin;
    std::copy_n(w.codes.begin() + j * row_bytes + b0, out_bytes, out.codes.begin() + j * out_bytes);
    std::copy_n(w.scales.begin() + j * groups + g0, local_groups,
                out.scales.begin() + j * local_groups);
    if (!w.zeros.empty()) {
      std::copy_n(w.zeros.begin() + j * groups + g0, local_groups,
                  out.zeros.begin() + j * local_groups);
    }
  }
  return out;
}

void ExpectSame(const QuantizedWeight& got, const QuantizedWeight& want, const std::string& what) {
  EXPECT_EQ(got.code, want.code) << what;
  ASSERT_EQ(got.n, want.n) << what;
  ASSERT_EQ(got.k, want.k) << what;
  EXPECT_EQ(got.group_size, want.group_size) << what;
  EXPECT_EQ(got.act_quant, want.act_quant) << what;
  EXPECT_EQ(got.act_group_size, want.act_group_size) << what;
  EXPECT_TRUE(got.codes == want.codes) << what << ": codes differ";
  EXPECT_TRUE(got.scales == want.scales) << what << ": scales differ";
  EXPECT_TRUE(got.zeros == want.zeros) << what << ": zero points differ";
}

TEST(QuantTensorParallelTest, EachRankHoldsExactlyItsSliceOfTheQuantizedWeights) {
  const ModelConfig c = SplittableConfig();
  const std::string bf16_dir = Make("");
  for (const Format& f : kFormats) {
    const std::string dir = f.scheme.empty() ? bf16_dir : Make(f.scheme, "", f.group);
    absl::StatusOr<ModelConfig> config = ModelConfig::Load(dir);
    ASSERT_TRUE(config.ok()) << config.status();
    absl::StatusOr<QuantConfig> quant = QuantConfig::Resolve(dir, f.flag);
    ASSERT_TRUE(quant.ok()) << quant.status();
    absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> ckpt = SafetensorsCheckpoint::Open(dir);
    ASSERT_TRUE(ckpt.ok());
    absl::StatusOr<ModelWeights> whole = LoadWeights(**ckpt, *config, DType::kF32, *quant);
    ASSERT_TRUE(whole.ok()) << f.Name() << ": " << whole.status();
    const int64_t d = c.head_dim, q_rows = int64_t{c.num_q_heads} * d;
    for (int tp : {2, 4}) {
      const ModelConfig s = ShardConfig(*config, tp);
      for (int r = 0; r < tp; ++r) {
        const std::string what =
            f.Name() + " TP " + std::to_string(tp) + " rank " + std::to_string(r);
        absl::StatusOr<ModelWeights> rank =
            LoadWeights(**ckpt, *config, DType::kF32, TensorShard{r, tp}, StageLayers{}, *quant);
        ASSERT_TRUE(rank.ok()) << what << ": " << rank.status();
        const TensorShard shard{r, tp};
        const int64_t q0 = FirstQHead(c, shard) * d, kv0 = FirstKvHead(c, shard) * d;
        const int64_t sq = int64_t{s.num_q_heads} * d, skv = int64_t{s.num_kv_heads} * d;
        const int64_t i0 = FirstIntermediate(c, shard), si = s.intermediate_size;
        for (size_t l = 0; l < whole->layers.size(); ++l) {
          const LayerWeights& w = whole->layers[l];
          const LayerWeights& g = rank->layers[l];
          const std::string at = what + " layer " + std::to_string(l);
          ASSERT_NE(g.qkv_proj.quant, nullptr) << at;
          ExpectSame(*g.qkv_proj.quant,
                     Rows(*w.qkv_proj.quant, {{q0, sq},
                                              {q_rows + kv0, skv},
                                              {q_rows + int64_t{c.num_kv_heads} * d + kv0, skv}}),
                     at + " qkv_proj");
          ExpectSame(*g.o_proj.quant, Cols(*w.o_proj.quant, q0, sq), at + " o_proj");
          ExpectSame(*g.gate_up_proj.quant,
                     Rows(*w.gate_up_proj.quant, {{i0, si}, {c.intermediate_size + i0, si}}),
                     at + " gate_up_proj");
          ExpectSame(*g.down_proj.quant, Cols(*w.down_proj.quant, i0, si), at + " down_proj");
        }
      }
    }
  }
}

// --- The model against TP 1 ---------------------------------------------------------------

std::vector<SeqResult> Generate(Model& model) {
  const int vocab = model.config().vocab_size;
  return GenerateGreedy(
      model, {RandomPrompt(1, vocab, 1), RandomPrompt(13, vocab, 2), RandomPrompt(45, vocab, 3)},
      kNewTokens, 7, 20, DType::kF32);
}

std::vector<SeqResult> Generate(const std::string& dir, const std::string& flag, int tp, int pp) {
  absl::StatusOr<std::unique_ptr<Model>> model = LoadModel(
      dir, Backend::kCpu, ParallelConfig{.tensor_parallel = tp, .pipeline_parallel = pp}, flag);
  CHECK_OK(model.status());
  return Generate(**model);
}

// TP 1 whose o_proj and down_proj quantize their activations per token and group of k / tp:
// what tp ranks with per-token scales compute.
std::vector<SeqResult> Tp1WithRankActGroups(const std::string& dir, const std::string& flag,
                                            int tp) {
  absl::StatusOr<ModelConfig> config = ModelConfig::Load(dir);
  CHECK_OK(config.status());
  absl::StatusOr<std::unique_ptr<LlamaModel>> model =
      LlamaModel::Create(*config, testing_util::RankActGroupWeights(dir, flag, tp, DType::kF32),
                         MakeRefOps(), Backend::kCpu);
  CHECK_OK(model.status());
  return Generate(**model);
}

// Max |Δ logit| / max(1, max |logit|) over the prompts' last positions. Tokens must agree; with
// `near_tie` > 0 a first difference is allowed where the reference's top-2 margin is below
// near_tie of that scale (the sequences diverge from there). Counts the agreeing tokens.
double CompareToTp1(const std::vector<SeqResult>& want, const std::vector<SeqResult>& got,
                    double near_tie, const std::string& what, int* agreed) {
  EXPECT_EQ(got.size(), want.size()) << what;
  double worst = 0.0;
  for (size_t s = 0; s < std::min(got.size(), want.size()); ++s) {
    double scale = 1.0, diff = 0.0;
    for (size_t i = 0; i < want[s].prompt_logits.size(); ++i) {
      EXPECT_TRUE(std::isfinite(got[s].prompt_logits[i])) << what;
      scale = std::max(scale, std::abs(double{want[s].prompt_logits[i]}));
      diff = std::max(diff, std::abs(double{got[s].prompt_logits[i]} - want[s].prompt_logits[i]));
    }
    worst = std::max(worst, diff / scale);
    EXPECT_EQ(got[s].tokens.size(), size_t{kNewTokens}) << what;
    if (agreed == nullptr) continue;
    for (size_t i = 0; i < std::min(got[s].tokens.size(), want[s].tokens.size()); ++i) {
      if (got[s].tokens[i] != want[s].tokens[i]) {
        EXPECT_LT(want[s].margins[i], near_tie * scale)
            << what << " prompt " << s << ": token " << i << " differs (" << want[s].tokens[i]
            << " vs " << got[s].tokens[i] << "), reference margin " << want[s].margins[i];
        break;
      }
      ++*agreed;
    }
  }
  return worst;
}

struct Layout {
  int tp, pp;
};
constexpr Layout kLayouts[] = {{2, 1}, {4, 1}, {2, 2}};

void RunFormatsAgainstTp1(const std::string& bf16_dir, const std::string& preset,
                          const std::vector<Format>& formats, const std::vector<Layout>& layouts) {
  for (const Format& f : formats) {
    const std::string dir = f.scheme.empty() ? bf16_dir : Make(f.scheme, preset, f.group);
    const std::vector<SeqResult> tp1 = Generate(dir, f.flag, 1, 1);
    for (const Layout& l : layouts) {
      const std::string what = (preset.empty() ? "splittable" : preset) + " " + f.Name() + " TP " +
                               std::to_string(l.tp) + " x PP " + std::to_string(l.pp);
      SCOPED_TRACE(what);
      const std::vector<SeqResult> got = Generate(dir, f.flag, l.tp, l.pp);
      const std::vector<SeqResult> want =
          f.per_rank_act ? Tp1WithRankActGroups(dir, f.flag, l.tp) : tp1;
      int agreed = 0;
      const double worst = CompareToTp1(want, got, f.w8a8 ? kW8A8NearTie : 0.0, what, &agreed);
      std::cout << what << ": max relative logit difference " << worst << ", greedy tokens agreed "
                << agreed << " of " << 3 * kNewTokens
                << (f.per_rank_act ? " (against TP 1 with per-rank activation groups)" : "")
                << "\n";
      EXPECT_LE(worst, f.w8a8 ? kW8A8Tolerance : kSumOrderTolerance) << what;
      if (f.per_rank_act) {
        const double plain = CompareToTp1(tp1, got, 0.0, what + " against plain TP 1", nullptr);
        std::cout << what << ": against plain TP 1 (FP8 activation rounding per rank) " << plain
                  << "\n";
        EXPECT_LE(plain, kPerRankActBound) << what;
      }
    }
  }
}

TEST(QuantTensorParallelTest, EveryFormatMatchesTp1) {
  RunFormatsAgainstTp1(Make(""), "", std::vector<Format>(std::begin(kFormats), std::end(kFormats)),
                       std::vector<Layout>(std::begin(kLayouts), std::end(kLayouts)));
}

// The per-channel formats cut anywhere: tiny-llama3's uneven shapes (intermediate 176 = 44 per
// rank at TP 4, 16-row heads inside one 128-row block) split too.
TEST(QuantTensorParallelTest, PerChannelFormatsSplitUnevenShapes) {
  RunFormatsAgainstTp1(
      Make("", "tiny-llama3"), "tiny-llama3",
      {{"fp8-channel", "", true, true}, {"int8", ""}, {"", "fp8", true, true}, {"", "int8"}},
      {{2, 1}, {4, 1}});
}

// --- The engine ------------------------------------------------------------------------------

// EngineOptions::quantization and a checkpoint's format reach the ranks through Engine::Create
// (what `tandem serve --quantization X --tensor-parallel-size N` runs): 12 batched, chunked
// greedy requests give TP 1's tokens.
TEST(QuantTensorParallelTest, EngineBatchesGiveTp1Tokens) {
  struct Case {
    std::string scheme, flag;
    Layout layout;
  };
  const std::string bf16_dir = Make("");
  for (const Case& c :
       {Case{"awq", "", {2, 1}}, Case{"", "int4", {4, 1}}, Case{"", "int8", {2, 2}}}) {
    const std::string dir = c.scheme.empty() ? bf16_dir : Make(c.scheme);
    auto options = [&](Layout l) {
      EngineOptions o;
      o.model_dir = dir;
      o.quantization = c.flag;
      o.page_size = 4;
      o.num_pages = 512;
      o.max_num_batched_tokens = 32;
      o.tensor_parallel = l.tp;
      o.pipeline_parallel = l.pp;
      return o;
    };
    const std::string what = (c.scheme.empty() ? "--quantization " + c.flag : c.scheme) + " TP " +
                             std::to_string(c.layout.tp) + " x PP " + std::to_string(c.layout.pp);
    SCOPED_TRACE(what);
    std::map<std::string, Finished> want, got;
    for (bool tp1 : {true, false}) {
      absl::StatusOr<std::unique_ptr<Engine>> engine =
          Engine::Create(options(tp1 ? Layout{1, 1} : c.layout));
      ASSERT_TRUE(engine.ok()) << engine.status();
      const int vocab = (*engine)->model_config().vocab_size;
      for (int i = 0; i < 12; ++i) {
        EngineRequest r =
            Request("r" + std::to_string(i), RandomPrompt(1 + (i * 29) % 70, vocab, i), 10);
        r.sampling.ignore_eos = true;
        ASSERT_TRUE((*engine)->AddRequest(r).ok());
      }
      (tp1 ? want : got) = RunToCompletion(**engine);
      ExpectIdle(**engine);
    }
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [id, f] : want) {
      EXPECT_EQ(f.tokens.size(), 10u) << id;
      EXPECT_EQ(got.at(id).tokens, f.tokens) << id;
    }
  }
}

}  // namespace
}  // namespace tandem::testing
