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
  // 1. top-k as a logit threshold (HF TopKLogitsWarper: ties with the k-th value are kept).
  const int64_t k = args.top_k[row];
  const float min_logit = (k > 0 && k < vocab) ? KthLargest(logits, vocab, k) : -INFINITY;
  const float max_logit = logits[ArgMax(logits, vocab)];
  // 2. temperature-scaled softmax weights of the survivors; 0 for the filtered ones.
  const float scale = kSamplingLog2e / temperature;
  std::vector<float> w(vocab);
  double total = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    w[i] = logits[i] >= min_logit ? std::exp2((logits[i] - max_logit) * scale) : 0.0f;
    total += w[i];
  }
  // 3. top-p over the survivors' renormalised distribution, again as a threshold.
  float min_weight = 0.0f;
  if (args.top_p[row] < 1.0f) {
    std::vector<float> kept;
    for (float x : w) {
      if (x > 0.0f) kept.push_back(x);
    }
    min_weight = TopPCutoff(std::move(kept), total, args.top_p[row]);
    total = 0.0;
    for (float& x : w) {
      if (x < min_weight) x = 0.0f;
      total += x;
    }
  }
  // 4. inverse CDF in ascending token-id order.
  const double target = SamplingUniform(args.seeds[row], args.steps[row]) * total;
  double cum = 0.0;
  int64_t last_kept = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (w[i] <= 0.0f) continue;
    cum += w[i];
    last_kept = i;
    if (cum > target) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(last_kept);
}

}  // namespace

double SamplingUniform(uint64_t seed, uint64_t step) { return SamplingUniformImpl(seed, step); }

void SamplingRef(const SamplingArgs& args) {
  ParallelFor(args.batch, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) args.out_tokens[r] = SampleRow(args, r);
  });
}

}  // namespace tandem
