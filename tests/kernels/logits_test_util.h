// Helpers shared by the logits-processing and logprobs tests: random batches of per-row
// penalties, histories and bias lists with the awkward cases (duplicates, ids 0 and vocab - 1,
// ids outside the vocabulary, bad prompt counts, empty lists), and the naive implementations the
// references are checked against (written independently: per-token scans, double precision).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/logits_process/logits_process.h"

namespace tandem::testing {

inline constexpr float kInf = std::numeric_limits<float>::infinity();

// Equal bits, or both NaN (a GPU's NaN payload may differ from the CPU's).
inline bool SameFloat(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

// A batch for LogitsProcess, as host vectors.
struct ProcessBatch {
  int64_t batch = 0, vocab = 0;
  std::vector<float> logits, rp, freq, pres, bias_values;
  std::vector<int32_t> history, history_start{0}, num_prompt, bias_tokens, bias_start{0};

  // Empty lists still get non-null pointers (ValidateLogitsProcessArgs wants them with offsets).
  LogitsProcessArgs Args() {
    static int32_t no_token = 0;
    static float no_value = 0.0f;
    return {.logits = logits.data(),
            .batch = batch,
            .vocab_size = vocab,
            .repetition_penalty = rp.data(),
            .frequency_penalty = freq.data(),
            .presence_penalty = pres.data(),
            .history_tokens = history.empty() ? &no_token : history.data(),
            .history_start = history_start.data(),
            .num_prompt_history = num_prompt.data(),
            .bias_tokens = bias_tokens.empty() ? &no_token : bias_tokens.data(),
            .bias_values = bias_values.empty() ? &no_value : bias_values.data(),
            .bias_start = bias_start.data()};
  }
};

// A token id for row lists: mostly in [0, vocab) with 0 and vocab - 1 favoured, sometimes from a
// small pool (duplicates), sometimes outside the vocabulary when `bad` is set.
inline int32_t RandomToken(int64_t vocab, bool bad, std::mt19937_64& rng) {
  const int kind = static_cast<int>(rng() % 16);
  if (bad && kind == 0) {
    const int32_t outside[] = {-1, static_cast<int32_t>(vocab), INT32_MAX, INT32_MIN};
    return outside[rng() % 4];
  }
  if (kind == 1) return 0;
  if (kind == 2) return static_cast<int32_t>(vocab - 1);
  if (kind < 8) return static_cast<int32_t>(rng() % std::min<int64_t>(vocab, 13));  // repeats
  return static_cast<int32_t>(rng() % vocab);
}

// Row r of a random batch; kinds cycle through: nothing to do, repetition only, frequency only,
// presence only, bias only, everything, everything with a long repetitive prompt, lists with bad
// ids and a bad prompt count, and off-valued penalties with lists (a no-op).
inline void AddRandomRow(ProcessBatch& b, int64_t r, std::mt19937_64& rng) {
  const int kind = static_cast<int>(r % 9);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  const bool rep = kind == 1 || kind >= 5, fp = kind == 2 || kind >= 5, pp = kind == 3 || kind >= 5;
  b.rp.push_back(rep && kind != 8 ? 0.5f + 1.5f * unit(rng) : 1.0f);
  b.freq.push_back(fp && kind != 8 ? 2.0f * unit(rng) - 0.5f : 0.0f);
  b.pres.push_back(pp && kind != 8 ? 2.0f * unit(rng) - 0.5f : 0.0f);
  const bool bad = kind == 7;
  const int64_t prompt = kind == 0 || kind == 4 ? 0 : (kind == 6 ? 5000 : rng() % 40);
  const int64_t output = kind == 0 || kind == 4 ? 0 : rng() % 60;
  for (int64_t i = 0; i < prompt + output; ++i) b.history.push_back(RandomToken(b.vocab, bad, rng));
  b.history_start.push_back(static_cast<int32_t>(b.history.size()));
  int32_t np = static_cast<int32_t>(prompt);
  if (bad) np = (r / 9) % 2 == 0 ? -3 : static_cast<int32_t>(prompt + output + 7);
  b.num_prompt.push_back(np);
  const int64_t nbias = kind == 4 || kind >= 5 ? rng() % 12 : 0;
  for (int64_t j = 0; j < nbias; ++j) {
    b.bias_tokens.push_back(RandomToken(b.vocab, bad, rng));
    b.bias_values.push_back(j % 5 == 4 ? -kInf : 20.0f * unit(rng) - 10.0f);
  }
  b.bias_start.push_back(static_cast<int32_t>(b.bias_tokens.size()));
}

// Random logits N(0, 3^2) with special values sprinkled in: -inf, +-1e30, 0 and -0.
inline ProcessBatch MakeProcessBatch(int64_t batch, int64_t vocab, std::mt19937_64& rng) {
  ProcessBatch b;
  b.batch = batch, b.vocab = vocab;
  b.logits.resize(batch * vocab);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (float& x : b.logits) x = dist(rng);
  const float specials[] = {-kInf, 1e30f, -1e30f, 0.0f, -0.0f};
  for (int64_t r = 0; r < batch; ++r) {
    for (int i = 0; i < 5 && i < vocab; ++i) b.logits[r * vocab + rng() % vocab] = specials[i];
    AddRandomRow(b, r, rng);
  }
  return b;
}

// LogitsProcess written independently: for every token, scan the row's lists.
inline std::vector<float> NaiveLogitsProcess(const ProcessBatch& b) {
  std::vector<float> out = b.logits;
  for (int64_t r = 0; r < b.batch; ++r) {
    const int64_t hb = b.history_start[r], he = std::max(hb, int64_t{b.history_start[r + 1]});
    const int64_t split = hb + std::clamp<int64_t>(b.num_prompt[r], 0, he - hb);
    for (int64_t t = 0; t < b.vocab; ++t) {
      float& x = out[r * b.vocab + t];
      bool seen = false;
      float count = 0.0f;
      for (int64_t i = hb; i < he; ++i) {
        seen |= b.history[i] == t;
        if (i >= split && b.history[i] == t) count += 1.0f;
      }
      if (seen && b.rp[r] != 1.0f) x = x > 0.0f ? x / b.rp[r] : x * b.rp[r];
      if (count > 0.0f && (b.freq[r] != 0.0f || b.pres[r] != 0.0f)) {
        x = x - std::fma(b.freq[r], count, b.pres[r]);
      }
      for (int32_t j = b.bias_start[r]; j < b.bias_start[r + 1]; ++j) {
        if (b.bias_tokens[j] == t) x = x + b.bias_values[j];
      }
    }
  }
  return out;
}

// The naive logprobs of one row: every token in order (logit descending, lower id first; -0 ==
// +0 as the comparison makes them), and logsumexp in long double; defined is false for a NaN or
// +inf logit or an all -inf row.
struct NaiveLogprobRow {
  std::vector<int32_t> order;
  long double lse = 0;
  bool defined = false;
  double LogProb(float x) const { return static_cast<double>(x - lse); }
};

inline NaiveLogprobRow NaiveLogprobs(const float* x, int64_t vocab) {
  NaiveLogprobRow row;
  row.order.resize(vocab);
  std::iota(row.order.begin(), row.order.end(), 0);
  std::stable_sort(row.order.begin(), row.order.end(),
                   [&](int32_t a, int32_t b) { return x[a] > x[b]; });
  bool bad = false;
  long double m = -kInf;
  for (int64_t i = 0; i < vocab; ++i) {
    bad |= std::isnan(x[i]) || x[i] == kInf;
    if (!std::isnan(x[i])) m = std::max<long double>(m, x[i]);
  }
  if (bad || m == -kInf) return row;
  long double s = 0;
  for (int64_t i = 0; i < vocab; ++i) s += std::exp(static_cast<long double>(x[i]) - m);
  row.lse = m + std::log(s);
  row.defined = true;
  return row;
}

}  // namespace tandem::testing
