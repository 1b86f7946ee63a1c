#include "engine/spec/ngram_proposer.h"

#include <algorithm>

namespace tandem {

std::vector<int32_t> NgramLookup(absl::Span<const int32_t> tokens, int min_n, int max_n,
                                 int max_tokens) {
  const int len = static_cast<int>(tokens.size());
  for (int n = std::min(max_n, len - 1); n >= min_n; --n) {
    const absl::Span<const int32_t> suffix = tokens.subspan(len - n);
    // Latest start s < len - n whose n tokens equal the suffix (s + n <= len - 1 so at least one
    // token follows it).
    for (int s = len - n - 1; s >= 0; --s) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + s)) continue;
      const int from = s + n;
      const int count = std::min(max_tokens, len - from);
      return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + from + count);
    }
  }
  return {};
}

absl::StatusOr<std::vector<Proposal>> NgramProposer::Propose(
    absl::Span<const ProposalRequest> requests) {
  std::vector<Proposal> out(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    out[i].tokens = NgramLookup(requests[i].seq->tokens, min_n_, max_n_, requests[i].max_tokens);
  }
  return out;
}

}  // namespace tandem
