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
      // The tokens after the match are tokens[from + i]; where that runs past the end (a match
      // overlapping the suffix, as in a loop of period p = len - from), the loop continues:
      // token len + i is predicted as token len + i - p, i.e. tokens[from + i % p].
      const int from = s + n;
      const int period = len - from;
      std::vector<int32_t> out(std::max(max_tokens, 0));
      for (int i = 0; i < max_tokens; ++i) out[i] = tokens[from + i % period];
      return out;
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
