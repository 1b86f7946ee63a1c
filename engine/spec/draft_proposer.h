// DraftProposer: a draft model (a smaller checkpoint with the target's vocabulary) proposes k
// tokens per sequence by running k steps of its own: the first feeds whatever of the sequence its
// KV does not hold yet (the whole prompt the first time: the decode worker prefills the draft
// itself, also for a request that arrived from a prefill worker), the next ones one proposal each.
// It keeps, per target sequence, a mirror Sequence over its own KV pool (same page size, its own
// BlockAllocator): after the target's verification the mirror keeps the KV of the longest common
// prefix with the target's tokens and frees the pages past it.
//
// Rows sample with the request's own parameters: greedy rows propose the draft's argmax (a point
// mass, on the backend's sampler); sampled rows draw on the host from the draft's distribution
// (token_distribution.h) with the request's seed on a stream of their own (verify.h), and return
// that distribution for the lossless rule. Owned by the engine loop thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/model.h"
#include "engine/spec/proposer.h"

namespace tandem {

struct DraftOptions {
  StepCapacity capacity;           // of the draft's steps (max_tokens bounds the catch-up per step)
  KvLayout layout;                 // the draft's KV pool: its model's shape, the target's page size
  std::vector<int> graph_sizes;    // CUDA graphs for the draft's decode steps (empty: eager)
  std::vector<int> eos_token_ids;  // the target's (min_tokens bans, as the target applies them)
};

class DraftProposer final : public Proposer {
 public:
  // `draft` has its step buffers reserved for options.capacity (Model::ReserveStep: the engine
  // does it before sizing the KV pools); this allocates the draft's pool (host memory on the CPU
  // backend) and captures its graphs.
  static absl::StatusOr<std::unique_ptr<DraftProposer>> Create(std::unique_ptr<Model> draft,
                                                               const DraftOptions& options);

  absl::StatusOr<std::vector<Proposal>> Propose(
      absl::Span<const ProposalRequest> requests) override;
  void Forget(const std::string& id) override;
  int num_pages_total() const override { return kv_cache_->allocator().num_pages(); }
  int num_pages_free() const override { return kv_cache_->allocator().num_free(); }

 private:
  DraftProposer(std::unique_ptr<Model> draft, const DraftOptions& options,
                std::unique_ptr<KvCache> kv_cache);

  // The mirror of `target`, its KV cut back to the longest prefix it shares with the target's
  // tokens (and never past the last one, which it must feed to propose), its tokens the target's.
  Sequence* Sync(const Sequence& target);
  void Truncate(Sequence* mirror, int num_tokens);  // keeps the KV of the first num_tokens
  // One draft step over the mirrors in `active` (each feeds its uncomputed tokens, as far as the
  // token budget goes): appends each sampled proposal to its mirror's tokens and to `out`.
  absl::Status Round(const std::vector<int>& active, const std::vector<Sequence*>& mirrors,
                     std::vector<Proposal>* out, std::vector<bool>* sampled);
  void FreeAll(Sequence* mirror);

  std::unique_ptr<Model> model_;
  DraftOptions options_;
  std::unique_ptr<KvCache> kv_cache_;
  absl::flat_hash_map<std::string, std::unique_ptr<Sequence>> mirrors_;
};

}  // namespace tandem
