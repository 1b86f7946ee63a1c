// CPU reference of logits processing; the semantics (logits_process.h) are defined here. Per row:
// the history's distinct tokens and the output tokens' counts by sorting, then the three steps
// over the whole row in order (each token's steps therefore compose a, b, c as the header says).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "base/check.h"
#include "base/thread_pool.h"
#include "kernels/logits_process/logits_process.h"

namespace tandem {
namespace {

// [begin, end) of row r in a flat list with offsets `start`; empty when the offsets are bad.
struct Span {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

Span RowSpan(const int32_t* start, int64_t r) {
  if (start == nullptr) return {};
  const int64_t b = start[r], e = start[r + 1];
  if (b < 0 || e <= b) return {};
  return {b, e};
}

// The valid token ids (in [0, vocab)) of tokens[begin, end), sorted.
std::vector<int32_t> SortedValid(const int32_t* tokens, int64_t begin, int64_t end, int64_t vocab) {
  std::vector<int32_t> out;
  out.reserve(end - begin);
  for (int64_t i = begin; i < end; ++i) {
    if (tokens[i] >= 0 && tokens[i] < vocab) out.push_back(tokens[i]);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void ProcessRow(const LogitsProcessArgs& args, int64_t r) {
  float* logits = args.logits + r * args.vocab_size;
  const float rp = args.repetition_penalty != nullptr ? args.repetition_penalty[r] : 1.0f;
  const float freq = args.frequency_penalty != nullptr ? args.frequency_penalty[r] : 0.0f;
  const float pres = args.presence_penalty != nullptr ? args.presence_penalty[r] : 0.0f;
  const Span hist = RowSpan(args.history_start, r);
  const int64_t prompt = args.num_prompt_history == nullptr
                             ? 0
                             : std::clamp<int64_t>(args.num_prompt_history[r], 0, hist.size());
  // a. Repetition penalty over the distinct history tokens.
  if (rp != 1.0f && hist.size() > 0) {
    std::vector<int32_t> all =
        SortedValid(args.history_tokens, hist.begin, hist.end, args.vocab_size);
    all.erase(std::unique(all.begin(), all.end()), all.end());
    for (int32_t t : all) logits[t] = logits[t] > 0.0f ? logits[t] / rp : logits[t] * rp;
  }
  // b. Frequency and presence penalties over the distinct output tokens, with exact counts.
  if ((freq != 0.0f || pres != 0.0f) && hist.size() > prompt) {
    const std::vector<int32_t> out =
        SortedValid(args.history_tokens, hist.begin + prompt, hist.end, args.vocab_size);
    for (size_t i = 0; i < out.size();) {
      size_t j = i;
      while (j < out.size() && out[j] == out[i]) ++j;
      const float c = static_cast<float>(j - i);
      logits[out[i]] -= std::fma(freq, c, pres);
      i = j;
    }
  }
  // c. Bias, in list order.
  const Span bias = RowSpan(args.bias_start, r);
  for (int64_t j = bias.begin; j < bias.end; ++j) {
    const int32_t t = args.bias_tokens[j];
    if (t >= 0 && t < args.vocab_size) logits[t] += args.bias_values[j];
  }
}

}  // namespace

absl::Status ValidateLogitsProcessArgs(const LogitsProcessArgs& args) {
  if (args.batch < 0) return absl::InvalidArgumentError("LogitsProcess: negative batch");
  if (args.batch == 0) return absl::OkStatus();
  if (args.vocab_size <= 0 || args.vocab_size > INT32_MAX) {
    return absl::InvalidArgumentError("LogitsProcess: vocab_size must be in [1, 2^31)");
  }
  if (args.logits == nullptr) return absl::InvalidArgumentError("LogitsProcess: null logits");
  if (args.history_start != nullptr && args.history_tokens == nullptr) {
    return absl::InvalidArgumentError("LogitsProcess: history_start without history_tokens");
  }
  if (args.bias_start != nullptr && (args.bias_tokens == nullptr || args.bias_values == nullptr)) {
    return absl::InvalidArgumentError("LogitsProcess: bias_start without bias tokens or values");
  }
  return absl::OkStatus();
}

void LogitsProcessRef(const LogitsProcessArgs& args) {
  const absl::Status valid = ValidateLogitsProcessArgs(args);
  CHECK(valid.ok()) << valid.message();
  ParallelFor(args.batch, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) ProcessRow(args, r);
  });
}

}  // namespace tandem
