// SamplingRef: greedy ties, determinism per (seed, step), and empirical frequencies against the
// filtered distribution computed independently (full sort, double precision).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/sampling/sampling.h"
#include "kernels/sampling/sampling_rng.h"

namespace tandem {
namespace {

struct RowParams {
  float temperature = 1.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  uint64_t step = 0;
  float min_p = 0.0f;
};

// Samples `rows` rows that share one logits vector (copied per row) and per-row params.
std::vector<int32_t> Sample(const std::vector<float>& logits, const std::vector<RowParams>& rows) {
  const int64_t vocab = logits.size(), batch = rows.size();
  std::vector<float> all(batch * vocab), temp(batch), top_p(batch), min_p(batch);
  std::vector<int32_t> top_k(batch), out(batch, -1);
  std::vector<uint64_t> seeds(batch), steps(batch);
  for (int64_t r = 0; r < batch; ++r) {
    std::copy(logits.begin(), logits.end(), all.begin() + r * vocab);
    temp[r] = rows[r].temperature;
    top_k[r] = rows[r].top_k;
    top_p[r] = rows[r].top_p;
    min_p[r] = rows[r].min_p;
    seeds[r] = rows[r].seed;
    steps[r] = rows[r].step;
  }
  SamplingRef({.logits = all.data(),
               .temperature = temp.data(),
               .top_k = top_k.data(),
               .top_p = top_p.data(),
               .min_p = min_p.data(),
               .seeds = seeds.data(),
               .steps = steps.data(),
               .out_tokens = out.data(),
               .batch = batch,
               .vocab_size = vocab});
  return out;
}

// temperature -> min_p -> top-k -> top-p (vLLM's order; HF's without min_p), written
// independently: full sort, double precision.
std::vector<double> FilteredDistribution(const std::vector<float>& logits, const RowParams& p) {
  const int64_t vocab = logits.size();
  std::vector<int64_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t x, int64_t y) { return logits[x] > logits[y]; });
  auto weight = [&](int64_t i) {
    return std::exp((double{logits[i]} - logits[order[0]]) / p.temperature);
  };
  // min_p: the most likely token weighs 1, so p_i / p_max is the weight itself.
  std::vector<int64_t> kept;
  for (int64_t i : order) {
    if (weight(i) >= p.min_p) kept.push_back(i);
  }
  std::vector<double> prob(vocab, 0.0);
  const int64_t keep_k =
      (p.top_k > 0 && p.top_k < static_cast<int64_t>(kept.size())) ? p.top_k : kept.size();
  double z = 0.0;
  for (int64_t j = 0; j < keep_k; ++j) z += prob[kept[j]] = weight(kept[j]);
  double cum = 0.0;
  for (int64_t j = 0; j < keep_k; ++j) {
    if (cum >= p.top_p) prob[kept[j]] = 0.0;  // prefix already reached top_p
    cum += weight(kept[j]) / z;
  }
  const double mass = std::accumulate(prob.begin(), prob.end(), 0.0);
  for (double& x : prob) x /= mass;
  return prob;
}

TEST(SamplingUniformTest, InUnitIntervalDeterministicAndUniform) {
  double sum = 0.0;
  int low_quarter = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    const double u = SamplingUniform(42, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    low_quarter += u < 0.25;
  }
  EXPECT_EQ(SamplingUniform(7, 9), SamplingUniform(7, 9));
  EXPECT_NE(SamplingUniform(7, 9), SamplingUniform(7, 10));
  EXPECT_NE(SamplingUniform(7, 9), SamplingUniform(8, 9));
  // Fixed draws, so these cannot flake; the bounds are 6 standard deviations.
  EXPECT_NEAR(sum / n, 0.5, 6 * std::sqrt(1.0 / 12 / n));
  EXPECT_NEAR(low_quarter, n / 4, 6 * std::sqrt(n * 0.25 * 0.75));
}

TEST(SamplingRefTest, GreedyTakesLowestIdOnTies) {
  std::vector<float> logits = {0.1f, 3.0f, -1.0f, 5.0f, 2.0f, 5.0f, 5.0f};
  const auto out = Sample(logits, {{.temperature = 0.0f}, {.temperature = 0.0f, .seed = 99}});
  EXPECT_EQ(out[0], 3);
  EXPECT_EQ(out[1], 3);
}

TEST(SamplingRefTest, SameSeedAndStepGiveSameTokenWhateverTheBatch) {
  std::mt19937_64 rng(1);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> logits(1000);
  for (float& x : logits) x = dist(rng);
  std::vector<RowParams> rows;
  for (uint64_t s = 0; s < 64; ++s) rows.push_back({.temperature = 1.0f, .seed = s, .step = 3});
  const auto batch = Sample(logits, rows);
  int distinct = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    EXPECT_EQ(Sample(logits, {rows[r]})[0], batch[r]) << r;
    distinct += batch[r] != batch[0];
  }
  EXPECT_GT(distinct, 10) << "different seeds should give different tokens";
}

// Empirical frequencies over many seeds vs the filtered distribution; tokens outside the kept
// set never appear. Seeds are fixed, so the 6-sigma bound is deterministic and cannot flake.
void CheckFrequencies(const std::vector<float>& logits, RowParams p) {
  const std::vector<double> want = FilteredDistribution(logits, p);
  const int n = 20000;
  std::vector<RowParams> rows;
  for (int i = 0; i < n; ++i) {
    p.seed = 1000 + i;
    p.step = i % 7;
    rows.push_back(p);
  }
  std::vector<int> count(logits.size(), 0);
  for (int32_t t : Sample(logits, rows)) {
    ASSERT_GE(t, 0);
    ASSERT_LT(t, static_cast<int32_t>(logits.size()));
    ++count[t];
  }
  for (size_t i = 0; i < logits.size(); ++i) {
    if (want[i] == 0.0) {
      EXPECT_EQ(count[i], 0) << "filtered token " << i << " was sampled";
    } else {
      const double sigma = std::sqrt(n * want[i] * (1 - want[i]));
      EXPECT_NEAR(count[i], n * want[i], 6 * sigma + 1) << "token " << i;
    }
  }
}

TEST(SamplingRefTest, FrequenciesMatchFilteredDistribution) {
  const std::vector<float> logits = {1.0f, 2.5f, 0.3f, 2.0f, -1.0f, 1.7f, 0.9f, 3.1f, -0.5f, 1.2f};
  CheckFrequencies(logits, {.temperature = 1.0f});
  CheckFrequencies(logits, {.temperature = 0.7f, .top_k = 5});
  CheckFrequencies(logits, {.temperature = 1.3f, .top_p = 0.8f});
  CheckFrequencies(logits, {.temperature = 0.7f, .top_k = 6, .top_p = 0.75f});
}

// min_p drops tokens below min_p times the top probability (at this temperature), before top-k
// and top-p: logits 3.1, 2.5, 2.0, 1.7 ... at T = 1 weigh 1, 0.55, 0.33, 0.25, ...
TEST(SamplingRefTest, MinPDropsUnlikelyTokensFirst) {
  const std::vector<float> logits = {1.0f, 2.5f, 0.3f, 2.0f, -1.0f, 1.7f, 0.9f, 3.1f, -0.5f, 1.2f};
  CheckFrequencies(logits, {.temperature = 1.0f, .min_p = 0.3f});  // keeps 3.1, 2.5, 2.0
  CheckFrequencies(logits, {.temperature = 2.0f, .min_p = 0.3f});  // hotter: keeps more
  CheckFrequencies(logits, {.temperature = 1.0f, .top_k = 2, .min_p = 0.3f});
  CheckFrequencies(logits, {.temperature = 1.0f, .top_p = 0.7f, .min_p = 0.2f});
  // min_p = 1 keeps the top token (and its ties) alone; 0 keeps everything.
  const auto one = Sample(logits, {{.temperature = 1.0f, .seed = 3, .min_p = 1.0f}});
  EXPECT_EQ(one[0], 7);
  CheckFrequencies(logits, {.temperature = 0.9f, .min_p = 0.0f});
}

// Top-p rows without top-k draw from the whole distribution until a draw lands in the nucleus
// (at most kTopPAttempts, then the inverse CDF over the nucleus with one more draw; sampling.h).
// Two tied strong tokens hold 7.4% of this row: at p = 0.05 both are the nucleus (ties kept),
// each draw lands there with probability 0.074, and ~8% of rows use all 32 draws and the last
// step. Either way the frequencies must be the nucleus's, 1/2 each.
TEST(SamplingRefTest, TopPRejectionDrawsKeepTheNucleusDistribution) {
  std::vector<float> logits(502, 0.0f);
  logits[17] = logits[333] = 3.0f;
  CheckFrequencies(logits, {.temperature = 1.0f, .top_p = 0.05f});
  // A nucleus of many tokens, most draws landing in it (p = 0.9), and one where most miss.
  std::mt19937_64 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.5f);
  std::vector<float> normal(300);
  for (float& x : normal) x = dist(rng);
  CheckFrequencies(normal, {.temperature = 1.0f, .top_p = 0.9f});
  CheckFrequencies(normal, {.temperature = 0.5f, .top_p = 0.2f});
}

TEST(SamplingUniformTest, AttemptsContinueTheSequence) {
  EXPECT_EQ(SamplingUniform(7, 9, 0), SamplingUniform(7, 9));
  for (uint32_t a = 1; a < kTopPAttempts + 1; ++a) {
    EXPECT_NE(SamplingUniform(7, 9, a), SamplingUniform(7, 9, a - 1)) << a;
    EXPECT_GE(SamplingUniform(7, 9, a), 0.0);
    EXPECT_LT(SamplingUniform(7, 9, a), 1.0);
  }
}

TEST(SamplingRefTest, TopKOneAndTinyTopPAreGreedy) {
  std::mt19937_64 rng(2);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> logits(5000);
  for (float& x : logits) x = dist(rng);
  const int32_t best = std::max_element(logits.begin(), logits.end()) - logits.begin();
  for (uint64_t s = 0; s < 20; ++s) {
    const auto out = Sample(logits, {{.temperature = 2.0f, .top_k = 1, .seed = s},
                                     {.temperature = 2.0f, .top_p = 1e-6f, .seed = s}});
    EXPECT_EQ(out[0], best);
    EXPECT_EQ(out[1], best);
  }
}

TEST(SamplingRefTest, TopKKeepsTiesAtTheBoundary) {
  // Logits 4, 3, 3, 3, 0: top_k = 2 keeps the three tied 3s (HF keeps logits >= the k-th value).
  const std::vector<float> logits = {4.0f, 3.0f, 3.0f, 3.0f, 0.0f};
  std::vector<RowParams> rows;
  for (uint64_t s = 0; s < 2000; ++s) rows.push_back({.temperature = 1.0f, .top_k = 2, .seed = s});
  std::vector<int> count(5, 0);
  for (int32_t t : Sample(logits, rows)) ++count[t];
  EXPECT_EQ(count[4], 0);
  for (int i = 1; i <= 3; ++i) EXPECT_GT(count[i], 100) << i;
}

TEST(SamplingRefTest, LargeVocabTopKStaysInTopK) {
  std::mt19937_64 rng(4);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> logits(152064);
  for (float& x : logits) x = dist(rng);
  std::vector<float> sorted = logits;
  std::sort(sorted.begin(), sorted.end(), std::greater<float>());
  std::vector<RowParams> rows;
  for (uint64_t s = 0; s < 32; ++s) {
    rows.push_back({.temperature = 0.8f, .top_k = 50, .top_p = 0.9f, .seed = s, .step = s});
  }
  for (int32_t t : Sample(logits, rows)) EXPECT_GE(logits[t], sorted[49]);
}

}  // namespace
}  // namespace tandem
