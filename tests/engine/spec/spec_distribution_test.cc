// The lossless rule for sampled requests with a draft model, tested statistically: the emitted
// tokens of many seeds are distributed as the target's own samples, and a deliberately wrong rule
// (accept every proposal: SpecAcceptance::kAcceptAllForTesting) fails the same test.
//
// Set-up. Vocabulary of 4, FakeModel target and a FakeModel draft of another salt (so q != p),
// one fixed prompt, max_tokens 4, k = 2: x1 comes from the prefill step, x2 .. x4 from verify
// steps (first two proposals and a bonus, then shorter rounds after a rejection), so both
// proposal positions, the residual draw and the bonus are exercised. N = 24000 requests with
// seeds 0 .. N-1. The exact target distribution of (x1, x2, x3, x4) is computed from the
// target's logits (FakeModel::ComputeLogits over a hand-built step) with the request's
// temperature, penalty and top-k.
//
// Test. Pearson chi-square over the 256 joint outcomes (cells expected < 5 lumped into one),
// rejected at α = 1e-3 (critical value by Wilson-Hilferty). Power: for the wrong rule the exact
// distribution of what it emits is p(x1) q(x2|x1) q(x3|x1,x2) p(x4|x1..x3); the test computes
// the noncentrality λ = N Σ (w − p)² / p of that alternative and requires the normal
// approximation of the noncentral chi-square to give power > 0.999 before it trusts a pass
// (λ is in the thousands here, so the power is 1 to many digits), and then checks that the wrong
// rule does fail. The seeds are fixed, so the outcome is deterministic. The same test passes
// for the sampler without speculation (the oracle's check).
//
// What it can see: at α = 1e-3 and N = 24000 the test has power 0.9 against alternatives with
// λ ≈ 72 (df 80) to ≈ 107 (df 212), i.e. Σ (w − p)² / p ≥ 0.003 – 0.0045: every joint
// probability off by 5.5 – 6.7 % of itself. The wrong rule's λ is 6e4 – 6e5. Measured
// statistics (temperature / penalty_topk) at seeds from 0: without speculation 236.5 / 103.8,
// lossless 248.6 / 117.6 (critical 281.4 / 124.9); from 100000: 192.6 / 58.6 and 185.8 / 68.5;
// from 7777777: 221.9 / 69.0 and 222.0 / 94.0 — around df, as they should be.
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"

namespace tandem::testing {
namespace {

constexpr int kV = 4;
constexpr int kN = 24000;
constexpr int kMaxTokens = 4;
constexpr uint64_t kSeedBase = 0;  // request s samples with seed kSeedBase + s
const std::vector<int32_t> kPrompt = {1, 2, 3, 0, 2};

struct Params {
  const char* name;
  float temperature;
  float frequency_penalty;
  int top_k;
};

FakeModel::Options Fake(uint64_t salt) {
  FakeModel::Options m;
  m.vocab_size = kV;
  m.salt = salt;
  return m;
}

// The target's logits after `tokens` (one sequence, one step over a private pool).
std::vector<float> NextLogits(FakeModel& model, const std::vector<int32_t>& tokens) {
  KvLayout layout;
  layout.num_layers = 2;
  layout.num_kv_heads = 2;
  layout.head_dim = 4;
  layout.page_size = 16;
  layout.num_pages = 1;
  layout.dtype = DType::kF32;
  std::vector<float> pool(layout.PoolBytes() / sizeof(float));
  const int n = static_cast<int>(tokens.size());
  StepInputs in;
  in.num_seqs = 1;
  in.num_tokens = n;
  in.token_ids = tokens;
  for (int i = 0; i < n; ++i) {
    in.positions.push_back(i);
    in.slot_mapping.push_back(i);
  }
  in.query_start = {0, n};
  in.seq_lens = {n};
  in.max_pages_per_seq = 1;
  in.block_tables = {0};
  in.logits_rows = {n - 1};
  std::vector<float> logits(kV);
  EXPECT_TRUE(model.ComputeLogits(in, layout, pool.data(), logits.data()).ok());
  return logits;
}

// p(· | prompt, outputs) under the request's sampling: frequency penalty over the outputs,
// top-k, temperature.
std::vector<double> NextProbs(FakeModel& model, const Params& params,
                              const std::vector<int32_t>& outputs) {
  std::vector<int32_t> tokens = kPrompt;
  tokens.insert(tokens.end(), outputs.begin(), outputs.end());
  std::vector<float> l = NextLogits(model, tokens);
  for (int32_t t : outputs) l[t] -= params.frequency_penalty;
  std::vector<float> sorted = l;
  std::sort(sorted.begin(), sorted.end(), std::greater<float>());
  const float kth = params.top_k > 0 ? sorted[params.top_k - 1] : -INFINITY;
  std::vector<double> p(kV);
  double total = 0.0;
  for (int v = 0; v < kV; ++v) {
    p[v] = l[v] >= kth ? std::exp((l[v] - sorted[0]) / params.temperature) : 0.0;
    total += p[v];
  }
  for (double& x : p) x /= total;
  return p;
}

// Exact probability of each outcome (x1..x4 as a base-kV number) when x_i is drawn from
// `first`'s distribution for i == 1, `middle`'s for i = 2, 3 and the target's for i = 4.
std::vector<double> Joint(FakeModel& target, FakeModel& middle, const Params& params) {
  std::vector<double> joint(kV * kV * kV * kV);
  for (int c = 0; c < static_cast<int>(joint.size()); ++c) {
    const std::vector<int32_t> x = {c / 64, c / 16 % 4, c / 4 % 4, c % 4};
    double prob = 1.0;
    for (int i = 0; i < kMaxTokens; ++i) {
      FakeModel& m = (i == 1 || i == 2) ? middle : target;
      prob *= NextProbs(m, params, std::vector<int32_t>(x.begin(), x.begin() + i))[x[i]];
    }
    joint[c] = prob;
  }
  return joint;
}

std::vector<int> Emitted(const Params& params, SpecAcceptance rule, int64_t* accepted,
                         SpecMethod method = SpecMethod::kDraft) {
  EngineOptions o;
  o.page_size = 4;
  o.num_pages = 8192;
  o.max_num_seqs = 256;
  o.max_num_batched_tokens = 2048;
  o.speculative.method = method;
  o.speculative.num_speculative_tokens = method == SpecMethod::kNone ? 0 : 2;
  o.speculative.draft_model = "given";
  o.speculative.acceptance = rule;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::CreateWithModel(
      o, std::make_unique<FakeModel>(Fake(0)), std::make_unique<FakeModel>(Fake(77)));
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  for (int s = 0; s < kN; ++s) {
    EngineRequest r = Request("s" + std::to_string(s), kPrompt, kMaxTokens, params.temperature);
    r.sampling.seed = kSeedBase + s;
    r.sampling.frequency_penalty = params.frequency_penalty;
    r.sampling.top_k = params.top_k;
    EXPECT_TRUE((*engine)->AddRequest(std::move(r)).ok());
  }
  const std::map<std::string, Finished> done = RunToCompletion(**engine);
  ExpectIdle(**engine);
  const EngineStats stats = (*engine)->Stats();
  EXPECT_EQ(stats.num_draft_pages_free, stats.num_draft_pages_total);
  *accepted = stats.spec_decode_num_accepted_tokens;
  std::vector<int> counts(kV * kV * kV * kV);
  for (const auto& [id, f] : done) {
    EXPECT_EQ(f.tokens.size(), static_cast<size_t>(kMaxTokens)) << id;
    if (f.tokens.size() != kMaxTokens) continue;
    ++counts[f.tokens[0] * 64 + f.tokens[1] * 16 + f.tokens[2] * 4 + f.tokens[3]];
  }
  return counts;
}

// Pearson's statistic with its degrees of freedom; cells expected < 5 are lumped together.
struct ChiSquare {
  double stat = 0.0;
  int df = 0;
  double noncentrality = 0.0;  // N Σ (alt − p)² / p for `alternative`, over the same cells
};

ChiSquare PearsonTest(const std::vector<int>& counts, const std::vector<double>& p,
                      const std::vector<double>& alternative) {
  ChiSquare out;
  double lumped_o = 0.0, lumped_e = 0.0, lumped_a = 0.0;
  int cells = 0;
  for (size_t c = 0; c < p.size(); ++c) {
    const double e = kN * p[c];
    if (e < 5.0) {
      lumped_o += counts[c];
      lumped_e += e;
      lumped_a += kN * alternative[c];
      continue;
    }
    out.stat += (counts[c] - e) * (counts[c] - e) / e;
    out.noncentrality += (kN * alternative[c] - e) * (kN * alternative[c] - e) / e;
    ++cells;
  }
  if (lumped_e > 0.0) {
    out.stat += (lumped_o - lumped_e) * (lumped_o - lumped_e) / lumped_e;
    out.noncentrality += (lumped_a - lumped_e) * (lumped_a - lumped_e) / lumped_e;
    ++cells;
  }
  out.df = cells - 1;
  return out;
}

// The chi-square quantile at 1 - 1e-3 (Wilson-Hilferty; z = 3.0902).
double Critical(int df) {
  const double z = 3.0902, a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

class SpecDistributionTest : public ::testing::TestWithParam<Params> {};

TEST_P(SpecDistributionTest, EmittedTokensAreDistributedAsTheTarget) {
  const Params& params = GetParam();
  FakeModel target(Fake(0)), draft(Fake(77));
  const std::vector<double> p = Joint(target, target, params);
  const std::vector<double> wrong = Joint(target, draft, params);
  double total = 0.0;
  for (double x : p) total += x;
  ASSERT_NEAR(total, 1.0, 1e-9);

  int64_t accepted = 0;
  const ChiSquare plain = PearsonTest(
      Emitted(params, SpecAcceptance::kLossless, &accepted, SpecMethod::kNone), p, wrong);
  // The oracle itself: the sampler without speculation passes.
  EXPECT_LT(plain.stat, Critical(plain.df)) << "df " << plain.df;
  const ChiSquare good =
      PearsonTest(Emitted(params, SpecAcceptance::kLossless, &accepted), p, wrong);
  const double critical = Critical(good.df);
  // The test has the power to see the wrong rule: normal approximation of the noncentral
  // chi-square (mean df + λ, variance 2 (df + 2λ)).
  const double z = (critical - (good.df + good.noncentrality)) /
                   std::sqrt(2.0 * (good.df + 2.0 * good.noncentrality));
  EXPECT_LT(z, -3.1) << "power below 0.999: λ = " << good.noncentrality;
  EXPECT_GT(accepted, kN / 4) << "the draft was hardly accepted: a weak test of the rule";
  EXPECT_LT(good.stat, critical) << "df " << good.df << ", λ of the wrong rule "
                                 << good.noncentrality;

  const ChiSquare bad =
      PearsonTest(Emitted(params, SpecAcceptance::kAcceptAllForTesting, &accepted), p, wrong);
  EXPECT_GT(bad.stat, critical) << "the wrong rule passed: df " << bad.df;
  std::printf(
      "%s: chi2 without speculation %.1f, lossless %.1f, accept-all %.1f; critical %.1f (df %d), "
      "λ of accept-all %.0f\n",
      params.name, plain.stat, good.stat, bad.stat, critical, good.df, good.noncentrality);
}

INSTANTIATE_TEST_SUITE_P(Sampling, SpecDistributionTest,
                         ::testing::Values(Params{"temperature", 0.25f, 0.0f, -1},
                                           Params{"penalty_topk", 0.4f, 0.3f, 3}),
                         [](const ::testing::TestParamInfo<Params>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace tandem::testing
