// EngineImpl: the siblings of a request (EngineRequest::siblings, OpenAI `n` / `best_of`). The
// prompt's KV is computed once, by the parent; when its last prompt token is computed each
// waiting sibling forks from it, sharing the parent's full pages up to the page that holds the
// last prompt token (reference counted, never written again: a page is only written at slots past
// its holder's computed tokens) and recomputing the tokens of that last page into a page of its
// own, so that it samples its own first token from its own last logits row. Recomputing that
// page (1 to page_size tokens per sibling) rather than copying it keeps the fork a host-only
// bookkeeping step: no KV is copied on any backend.
#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "base/check.h"
#include "engine/engine_impl.h"
#include "engine/sample/sampler.h"

namespace tandem {

absl::Status EngineImpl::ValidateSiblings(const EngineRequest& request) const {
  absl::flat_hash_set<std::string> ids = {request.id};
  for (const SiblingRequest& sibling : request.siblings) {
    if (sibling.id.empty()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("request '%s': a sibling has an empty id", request.id));
    }
    if (!ids.insert(sibling.id).second) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "request '%s': the sibling id '%s' is used twice", request.id, sibling.id));
    }
    if (sequences_.contains(sibling.id)) {
      return absl::AlreadyExistsError(absl::StrFormat("request '%s' already exists", sibling.id));
    }
  }
  return absl::OkStatus();
}

void EngineImpl::AddSiblings(Sequence* parent, const std::vector<SiblingRequest>& siblings) {
  for (const SiblingRequest& sibling : siblings) {
    auto child = std::make_unique<Sequence>();
    child->id = sibling.id;
    child->arrival = next_arrival_++;
    child->tokens = parent->tokens;
    child->num_prompt_tokens = parent->num_prompt_tokens;
    child->sampling = parent->sampling;
    child->sampling.seed = sibling.seed;
    child->seed = sibling.seed.value_or(SeedFromRequestId(child->id));
    child->prefill_only = parent->prefill_only;
    child->cache_prefix = parent->cache_prefix;
    child->page_hashes = parent->page_hashes;
    child->status = SequenceStatus::kForkWaiting;
    child->fork_parent = parent;
    parent->fork_children.push_back(child.get());
    sequences_.emplace(child->id, std::move(child));
  }
}

void EngineImpl::Fork(Sequence* parent) {
  CHECK_GE(parent->num_computed_tokens, parent->num_prompt_tokens) << parent->id;
  const int page_size = options_.page_size;
  // The pages before the one holding the last prompt token are full and final; that last page is
  // recomputed by each sibling (it must produce its own logits row for the last position).
  const int shared = (parent->num_prompt_tokens - 1) / page_size;
  CHECK_GE(static_cast<int>(parent->block_table.size()), shared) << parent->id;
  const absl::Span<const int32_t> pages(parent->block_table.data(), shared);
  for (Sequence* child : parent->fork_children) {
    CHECK(child->block_table.empty()) << child->id;
    CHECK_OK(kv_cache_->allocator().AddRef(pages));
    child->block_table.assign(pages.begin(), pages.end());
    child->num_computed_tokens = shared * page_size;
    child->num_hashed_pages = std::min(parent->num_hashed_pages, shared);
    child->num_cached_tokens = parent->num_cached_tokens;
    child->prompt_logprobs = parent->prompt_logprobs;  // complete: the prompt is computed
    child->fork_parent = nullptr;
    scheduler_.AddRunning(child);
    ++counters_.num_forked_sequences_total;
  }
  parent->fork_children.clear();
}

void EngineImpl::OrphanSiblings(Sequence* parent) {
  for (Sequence* child : parent->fork_children) {
    child->fork_parent = nullptr;
    scheduler_.AddWaiting(child);
  }
  parent->fork_children.clear();
}

}  // namespace tandem
