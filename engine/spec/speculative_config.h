// SpeculativeConfig: vLLM's `speculative_config` for one engine — which proposer guesses the next
// tokens (n-gram prompt lookup or a draft model), how many per step (k), and its own settings.
// The engine verifies the k guesses in one forward of the target (engine/spec/README.md).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

enum class SpecMethod {
  kNone,   // no speculation
  kNgram,  // prompt lookup: the tokens that followed the last n-gram's latest earlier occurrence
  kDraft,  // a smaller model sharing the target's vocabulary proposes k tokens autoregressively
};

// The acceptance rule of the verification. kLossless is the only one a user can choose;
// kAcceptAllForTesting accepts every proposal — wrong on purpose, so the distribution test can
// show that it catches a wrong rule (tests/engine/spec/).
enum class SpecAcceptance { kLossless, kAcceptAllForTesting };

struct SpeculativeConfig {
  SpecMethod method = SpecMethod::kNone;
  int num_speculative_tokens = 0;  // k: proposals per sequence and step, >= 1 when speculating
  std::string draft_model;         // kDraft: the draft checkpoint's folder
  // kNgram: n-gram sizes tried, longest first (vLLM's prompt_lookup_min / prompt_lookup_max).
  int prompt_lookup_min = 1;
  int prompt_lookup_max = 3;
  SpecAcceptance acceptance = SpecAcceptance::kLossless;

  bool enabled() const { return method != SpecMethod::kNone; }
};

// "none" (or ""), "ngram", "draft"; InvalidArgument otherwise.
absl::StatusOr<SpecMethod> ParseSpecMethod(absl::string_view name);
const char* SpecMethodName(SpecMethod method);

// InvalidArgument naming the field: k outside [1, 16] while speculating, ngram sizes outside
// 1 <= min <= max <= 64, a draft method without a draft model.
absl::Status ValidateSpeculativeConfig(const SpeculativeConfig& config);

// The most proposals a step may verify per sequence.
inline constexpr int kMaxSpeculativeTokens = 16;

}  // namespace tandem
