// CPU reference of token sampling. The semantics (documented in sampling.h) are defined here.
#include <algorithm>
#include <cmath>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/sampling/sampling.h"
#include "kernels/sampling/sampling_rng.h"

namespace tandem {
namespace {

// Lowest id among the maximal logits; NaN never wins (it fails every comparison).
int32_t ArgMax(const float* logits, int64_t vocab) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best] || std::isnan(logits[best])) best = i;
  }
  return static_cast<int32_t>(best);
}

// The k-th largest logit (k in [1, vocab)), by selection: O(vocab), no sort.
float KthLargest(const float* logits, int64_t vocab, int64_t k) {
  std::vector<float> copy(logits, logits + vocab);
  std::nth_element(copy.begin(), copy.begin() + (k - 1), copy.end(), std::greater<float>());
  return copy[k - 1];
}

// The smallest weight w* such that the tokens with weight >= w* hold >= top_p of the total
// mass `total` (HF nucleus: the smallest prefix, in descending order, reaching top_p). Sorts only
// a growing prefix of the candidates (partial_sort), so a peaked distribution costs O(vocab).
float TopPCutoff(std::vector<float> weights, double total, float top_p) {
  const double target = static_cast<double>(top_p) * total;
  const int64_t n = static_cast<int64_t>(weights.size());
  int64_t sorted = std::min<int64_t>(64, n);
  for (;;) {
    std::partial_sort(weights.begin(), weights.begin() + sorted, weights.end(),
                      std::greater<float>());
    double cum = 0.0;
    for (int64_t j = 0; j < sorted; ++j) {
      cum += weights[j];
      if (cum >= target) return weights[j];
    }
    if (sorted == n) return weights[n - 1];  // rounding: keep everything
    sorted = std::min(n, sorted * 8);
  }
}

int32_t SampleRow(const SamplingArgs& args, int64_t row) {
  const int64_t vocab = args.vocab_size;
  const float* logits = args.logits + row * vocab;
  const float temperature = args.temperature[row];
  if (!(temperature > 0.0f)) return ArgMax(logits, vocab);
  // 1. top-k as a logit threshold (HF TopKLogitsWarper: ties with the k-th value are kept), and
  // min_p's cutoff: dropping the logits below the cutoff before top-k keeps, of the k largest,
  // those at or above it, so the two thresholds combine as a max.
  const int64_t k = args.top_k[row];
  const bool filter_k = k > 0 && k < vocab;
  const float max_logit = logits[ArgMax(logits, vocab)];
  const float scale = kSamplingLog2e / temperature;
  const float min_p = args.min_p != nullptr ? args.min_p[row] : 0.0f;
  const float cutoff = min_p > 0.0f ? max_logit + std::log2(min_p) / scale : -INFINITY;
  const float min_logit = std::max(filter_k ? KthLargest(logits, vocab, k) : -INFINITY, cutoff);
  // 2. temperature-scaled softmax weights of the survivors; 0 for the filtered ones.
  std::vector<float> w(vocab);
  double total = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    w[i] = logits[i] >= min_logit ? std::exp2((logits[i] - max_logit) * scale) : 0.0f;
    total += w[i];
  }
  // 3. top-p over the survivors' renormalised distribution, again as a threshold.
  const bool filter_p = args.top_p[row] < 1.0f;
  float min_weight = 0.0f;
  if (filter_p) {
    std::vector<float> kept;
    for (float x : w) {
      if (x > 0.0f) kept.push_back(x);
    }
    min_weight = TopPCutoff(std::move(kept), total, args.top_p[row]);
  }
  // 4. inverse CDF in ascending token-id order over the weights >= `floor`.
  auto draw = [&](uint32_t attempt, float floor, double mass) {
    const double target = SamplingUniform(args.seeds[row], args.steps[row], attempt) * mass;
    double cum = 0.0;
    int64_t last_kept = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      if (w[i] <= 0.0f || w[i] < floor) continue;
      cum += w[i];
      last_kept = i;
      if (cum > target) return last_kept;
    }
    return last_kept;
  };
  if (!filter_p) return static_cast<int32_t>(draw(0, 0.0f, total));
  // Top-p without top-k: draws from the whole distribution, the first inside the nucleus kept.
  if (!filter_k) {
    for (uint32_t a = 0; a < kTopPAttempts; ++a) {
      const int64_t token = draw(a, 0.0f, total);
      if (w[token] >= min_weight) return static_cast<int32_t>(token);
    }
  }
  const uint32_t attempt = filter_k ? 0 : kTopPAttempts;
  double kept_mass = 0.0;
  for (float x : w) kept_mass += x >= min_weight ? x : 0.0;
  return static_cast<int32_t>(draw(attempt, min_weight, kept_mass));
}

}  // namespace

double SamplingUniform(uint64_t seed, uint64_t step, uint32_t attempt) {
  return SamplingUniformImpl(seed, step, attempt);
}

void SamplingRef(const SamplingArgs& args) {
  ParallelFor(args.batch, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) args.out_tokens[r] = SampleRow(args, r);
  });
}

}  // namespace tandem
