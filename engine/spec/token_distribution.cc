#include "engine/spec/token_distribution.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "base/check.h"
#include "kernels/logits_process/logits_process.h"
#include "kernels/sampling/sampling_rng.h"

namespace tandem {
namespace {

// Row `row`'s penalties and biases applied to `x` in place, through the reference kernel on a
// one-row batch.
void Process(const StepInputs& in, size_t row, std::vector<float>* x) {
  const SamplingRow& r = in.sampling[row];
  LogitsProcessArgs a;
  a.logits = x->data();
  a.batch = 1;
  a.vocab_size = static_cast<int64_t>(x->size());
  a.repetition_penalty = &r.repetition_penalty;
  a.frequency_penalty = &r.frequency_penalty;
  a.presence_penalty = &r.presence_penalty;
  int32_t history_start[2] = {0, 0};
  if (!in.history_start.empty() && in.history_start[row + 1] > in.history_start[row]) {
    history_start[1] = in.history_start[row + 1] - in.history_start[row];
    a.history_tokens = in.history_tokens.data() + in.history_start[row];
    a.history_start = history_start;
    a.num_prompt_history = &in.num_prompt_history[row];
  }
  int32_t bias_start[2] = {0, 0};
  if (!in.bias_start.empty() && in.bias_start[row + 1] > in.bias_start[row]) {
    bias_start[1] = in.bias_start[row + 1] - in.bias_start[row];
    a.bias_tokens = in.bias_tokens.data() + in.bias_start[row];
    a.bias_values = in.bias_values.data() + in.bias_start[row];
    a.bias_start = bias_start;
  }
  LogitsProcessRef(a);
}

int64_t ArgMax(const std::vector<float>& x) {
  int64_t best = 0;
  for (int64_t i = 1; i < static_cast<int64_t>(x.size()); ++i) {
    if (x[i] > x[best] || std::isnan(x[best])) best = i;
  }
  return best;
}

}  // namespace

std::vector<float> TokenDistribution(const float* logits, int64_t vocab, const StepInputs& in,
                                     size_t row, std::vector<float>* processed) {
  CHECK_LT(row, in.sampling.size());
  std::vector<float> x(logits, logits + vocab);
  Process(in, row, &x);
  if (processed != nullptr) *processed = x;
  const SamplingRow& r = in.sampling[row];
  std::vector<float> p(vocab, 0.0f);
  const int64_t best = ArgMax(x);
  if (!(r.temperature > 0.0f)) {
    p[best] = 1.0f;
    return p;
  }
  // Semantics of kernels/sampling/sampling.h, steps 1-4, as weights; then normalised.
  const float max_logit = x[best];
  const float scale = kSamplingLog2e / r.temperature;
  const float cutoff = r.min_p > 0.0f ? max_logit + std::log2(r.min_p) / scale : -INFINITY;
  float min_logit = cutoff;
  if (r.top_k > 0 && r.top_k < vocab) {
    std::vector<float> copy = x;
    std::nth_element(copy.begin(), copy.begin() + (r.top_k - 1), copy.end(), std::greater<float>());
    min_logit = std::max(min_logit, copy[r.top_k - 1]);
  }
  std::vector<float> w(vocab);
  double total = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    w[i] = x[i] >= min_logit ? std::exp2((x[i] - max_logit) * scale) : 0.0f;
    total += w[i];
  }
  float min_weight = 0.0f;
  if (r.top_p < 1.0f) {
    std::vector<float> kept;
    for (float v : w) {
      if (v > 0.0f) kept.push_back(v);
    }
    std::sort(kept.begin(), kept.end(), std::greater<float>());
    const double target = static_cast<double>(r.top_p) * total;
    double cum = 0.0;
    min_weight = kept.empty() ? 0.0f : kept.back();
    for (float v : kept) {
      cum += v;
      if (cum >= target) {
        min_weight = v;
        break;
      }
    }
  }
  double mass = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (w[i] < min_weight) w[i] = 0.0f;
    mass += w[i];
  }
  for (int64_t i = 0; i < vocab; ++i) p[i] = static_cast<float>(w[i] / mass);
  return p;
}

int32_t DrawToken(const std::vector<float>& probs, double u) {
  double total = 0.0;
  for (float v : probs) total += v;
  const double target = u * total;
  double cum = 0.0;
  int32_t last = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0.0f) continue;
    cum += probs[i];
    last = static_cast<int32_t>(i);
    if (cum > target) return last;
  }
  return last;
}

}  // namespace tandem
