// NgramProposer: vLLM's `ngram` method (prompt lookup decoding). For n from prompt_lookup_max down
// to prompt_lookup_min, it looks for the latest earlier occurrence of the sequence's last n tokens
// (prompt and output) and proposes the tokens that followed it, up to max_tokens; the first n
// that matches wins. Where those tokens run into the end of the sequence (the match overlaps the
// suffix: the text loops with period p), the loop is continued, so a repeating phrase yields
// max_tokens proposals rather than the few before the end (vLLM stops there). No model, no
// state: proposals are point masses. Thread-compatible.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "engine/spec/proposer.h"

namespace tandem {

// The lookup on a token list: `max_tokens` tokens following the latest earlier match of the last
// n tokens (continued periodically past the end), for the largest n in [min_n, max_n] that has
// one; empty if none does.
std::vector<int32_t> NgramLookup(absl::Span<const int32_t> tokens, int min_n, int max_n,
                                 int max_tokens);

class NgramProposer final : public Proposer {
 public:
  NgramProposer(int min_n, int max_n) : min_n_(min_n), max_n_(max_n) {}
  absl::StatusOr<std::vector<Proposal>> Propose(
      absl::Span<const ProposalRequest> requests) override;

 private:
  int min_n_;
  int max_n_;
};

}  // namespace tandem
