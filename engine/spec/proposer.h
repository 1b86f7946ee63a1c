// Proposer: guesses the next tokens of running sequences for speculative decoding. The engine asks
// once per step, before scheduling, for every decoding sequence; the target then scores the
// guesses in one forward (q_len = 1 + proposals) and keeps the longest acceptable prefix
// (engine/spec/verify.h). Implementations: NgramProposer (prompt lookup, no model) and
// DraftProposer (a second, smaller model with its own KV pool). Owned by the engine loop thread.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/sched/sequence.h"

namespace tandem {

struct ProposalRequest {
  const Sequence* seq = nullptr;  // running, decoding: its last token is not computed yet
  int max_tokens = 0;             // at most this many proposals (>= 1)
};

struct Proposal {
  std::vector<int32_t> tokens;  // 0 .. max_tokens proposals for the tokens after seq->tokens
  // The distribution each proposal was drawn from ([tokens.size()][vocab]), for sampled rows of a
  // draft model; empty when the proposals are point masses (n-gram lookup, greedy drafts), for
  // which the lossless rule reduces to "the target's own sample equals the proposal".
  std::vector<std::vector<float>> probs;
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  // One proposal per request, in order. An error leaves the proposer consistent (its state for
  // the requests may be dropped); Internal means its backend is unusable (model/model.h).
  virtual absl::StatusOr<std::vector<Proposal>> Propose(
      absl::Span<const ProposalRequest> requests) = 0;
  // The sequence finished: drop whatever the proposer keeps for it (a draft's KV pages).
  virtual void Forget(const std::string& id) {}
  // A proposer's own KV pool (a draft model's), for stats and leak checks; 0 / 0 without one.
  virtual int num_pages_total() const { return 0; }
  virtual int num_pages_free() const { return 0; }
};

}  // namespace tandem
