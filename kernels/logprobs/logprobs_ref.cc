// CPU reference of logprobs; the semantics (logprobs.h) are defined here.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "base/check.h"
#include "base/thread_pool.h"
#include "kernels/logprobs/logprobs.h"

namespace tandem {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// logsumexp of a row as (m, log(s)); `defined` is false for a NaN or +inf logit or an all -inf row.
struct RowLse {
  double m = 0.0;
  double log_s = 0.0;
  bool defined = false;
  float LogProb(float x) const { return static_cast<float>((double{x} - m) - log_s); }
};

RowLse LogSumExp(const float* x, int64_t vocab) {
  float m = -kInf;
  for (int64_t i = 0; i < vocab; ++i) {
    if (std::isnan(x[i])) return {};
    m = std::max(m, x[i]);
  }
  if (!std::isfinite(m)) return {};  // +inf present, or every logit -inf
  double s = 0.0;
  for (int64_t i = 0; i < vocab; ++i) s += std::exp(x[i] - m);
  return {m, std::log(s), true};
}

void RowLogprobs(const LogprobsArgs& args, int64_t r) {
  const int32_t want = args.num_top[r];
  if (want < 0) return;
  const int n = std::min(want, kMaxTopLogprobs);
  const int64_t vocab = args.vocab_size;
  const float* x = args.logits + r * vocab;
  const RowLse lse = LogSumExp(x, vocab);
  const int32_t token = args.tokens[r];
  const bool token_ok = token >= 0 && token < vocab;
  args.token_logprob[r] = lse.defined && token_ok ? lse.LogProb(x[token]) : kNaN;
  if (n == 0) return;
  int32_t* top_tokens = args.top_tokens + r * kMaxTopLogprobs;
  float* top_logprobs = args.top_logprobs + r * kMaxTopLogprobs;
  if (!lse.defined) {
    std::fill(top_tokens, top_tokens + n, -1);
    std::fill(top_logprobs, top_logprobs + n, kNaN);
    return;
  }
  const int64_t kept = std::min<int64_t>(n, vocab);
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + kept, ids.end(),
                    [&](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
  for (int i = 0; i < n; ++i) {
    top_tokens[i] = i < kept ? ids[i] : -1;
    top_logprobs[i] = i < kept ? lse.LogProb(x[ids[i]]) : -kInf;
  }
}

}  // namespace

absl::Status ValidateLogprobsArgs(const LogprobsArgs& args) {
  if (args.batch < 0) return absl::InvalidArgumentError("Logprobs: negative batch");
  if (args.batch == 0) return absl::OkStatus();
  if (args.vocab_size <= 0 || args.vocab_size > INT32_MAX) {
    return absl::InvalidArgumentError("Logprobs: vocab_size must be in [1, 2^31)");
  }
  if (args.logits == nullptr || args.tokens == nullptr || args.num_top == nullptr ||
      args.token_logprob == nullptr || args.top_tokens == nullptr || args.top_logprobs == nullptr) {
    return absl::InvalidArgumentError("Logprobs: null pointer");
  }
  return absl::OkStatus();
}

void LogprobsRef(const LogprobsArgs& args) {
  const absl::Status valid = ValidateLogprobsArgs(args);
  CHECK(valid.ok()) << valid.message();
  ParallelFor(args.batch, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) RowLogprobs(args, r);
  });
}

}  // namespace tandem
