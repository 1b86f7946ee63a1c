#include "engine/spec/speculative_config.h"

#include "absl/strings/str_cat.h"

namespace tandem {

absl::StatusOr<SpecMethod> ParseSpecMethod(absl::string_view name) {
  if (name.empty() || name == "none") return SpecMethod::kNone;
  if (name == "ngram") return SpecMethod::kNgram;
  if (name == "draft") return SpecMethod::kDraft;
  return absl::InvalidArgumentError(
      absl::StrCat("speculative method '", name, "' is not one of none, ngram, draft"));
}

const char* SpecMethodName(SpecMethod method) {
  switch (method) {
    case SpecMethod::kNone:
      return "none";
    case SpecMethod::kNgram:
      return "ngram";
    case SpecMethod::kDraft:
      return "draft";
  }
  return "?";
}

absl::Status ValidateSpeculativeConfig(const SpeculativeConfig& c) {
  if (!c.enabled()) return absl::OkStatus();
  if (c.num_speculative_tokens < 1 || c.num_speculative_tokens > kMaxSpeculativeTokens) {
    return absl::InvalidArgumentError(absl::StrCat("num_speculative_tokens must be in [1, ",
                                                   kMaxSpeculativeTokens, "], got ",
                                                   c.num_speculative_tokens));
  }
  if (c.method == SpecMethod::kNgram &&
      !(c.prompt_lookup_min >= 1 && c.prompt_lookup_min <= c.prompt_lookup_max &&
        c.prompt_lookup_max <= 64)) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt_lookup_min / prompt_lookup_max must satisfy 1 <= min <= max <= 64, "
                     "got ",
                     c.prompt_lookup_min, " / ", c.prompt_lookup_max));
  }
  if (c.method == SpecMethod::kDraft && c.draft_model.empty()) {
    return absl::InvalidArgumentError("speculative method 'draft' needs a draft model folder");
  }
  return absl::OkStatus();
}

}  // namespace tandem
