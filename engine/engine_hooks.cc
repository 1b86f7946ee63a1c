// EngineImpl: the disaggregation hooks (engine/engine.h) and stats.
#include <cstring>

#include "absl/strings/str_format.h"
#include "base/check.h"
#include "base/status_macros.h"
#include "engine/cuda/cuda_device.h"
#include "engine/engine_impl.h"

namespace tandem {

absl::StatusOr<std::vector<int32_t>> EngineImpl::ReservePages(const std::string& id,
                                                              int num_tokens) {
  if (!broken_.ok()) return BrokenError();
  if (sequences_.contains(id)) {
    return absl::AlreadyExistsError(absl::StrFormat("request '%s' already exists", id));
  }
  if (num_tokens < 1 || num_tokens >= max_model_len_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cannot reserve for %d tokens (context length %d)", num_tokens, max_model_len_));
  }
  // The prompt's KV plus the slot of the first decode token (the prefill worker's sample).
  ASSIGN_OR_RETURN(std::vector<int32_t> pages, kv_cache_->allocator().Reserve(PagesForTokens(
                                                   num_tokens + 1, options_.page_size)));
  auto seq = std::make_unique<Sequence>();
  seq->id = id;
  seq->status = SequenceStatus::kReserved;
  seq->num_prompt_tokens = num_tokens;
  seq->block_table = pages;
  sequences_.emplace(id, std::move(seq));
  return pages;
}

absl::Status EngineImpl::AddPrefilledRequest(EngineRequest request, int32_t first_token,
                                             bool first_token_finished) {
  if (!broken_.ok()) return BrokenError();
  auto it = sequences_.find(request.id);
  if (it == sequences_.end() || it->second->status != SequenceStatus::kReserved) {
    return absl::NotFoundError(absl::StrFormat("no reservation for request '%s'", request.id));
  }
  Sequence* reserved = it->second.get();
  if (static_cast<int>(request.prompt_tokens.size()) != reserved->num_prompt_tokens) {
    return absl::InvalidArgumentError(
        absl::StrFormat("request '%s' has %d prompt tokens; %d were reserved", request.id,
                        request.prompt_tokens.size(), reserved->num_prompt_tokens));
  }
  if (first_token < 0 || first_token >= model_->config().vocab_size) {
    return absl::InvalidArgumentError(absl::StrFormat("first token %d out of range", first_token));
  }
  if (first_token_finished && request.siblings.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "request '%s' finished at its first token and has no siblings: nothing to decode",
        request.id));
  }
  if (!first_token_finished && request.sampling.max_tokens < 2) {
    return absl::InvalidArgumentError("a prefilled request needs max_tokens >= 2");
  }
  RETURN_IF_ERROR(ValidateRequestBody(request));
  RETURN_IF_ERROR(ValidateSiblings(request));

  // The new sequence replaces the reservation's placeholder and takes over its pages.
  const std::vector<SiblingRequest> siblings = std::move(request.siblings);
  std::unique_ptr<Sequence> seq = NewSequence(std::move(request));
  Sequence* parent = seq.get();
  CHECK_OK(kv_cache_->allocator().Commit(reserved->block_table));
  seq->block_table = std::move(reserved->block_table);
  seq->abort_requested = reserved->abort_requested;
  seq->num_computed_tokens = seq->num_prompt_tokens;
  counters_.num_prompt_tokens_total += seq->num_prompt_tokens;
  it->second = std::move(seq);
  if (!siblings.empty()) {
    // Before the first token is appended: siblings copy the prompt only.
    AddSiblings(parent, siblings);
    Fork(parent);
  }
  parent->tokens.push_back(first_token);
  scheduler_.AddRunning(parent);
  if (first_token_finished) {
    Finish(parent);  // its references go; the siblings hold the shared pages
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> EngineImpl::KvPages(const std::string& id) const {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) {
    return absl::NotFoundError(absl::StrFormat("no live request '%s'", id));
  }
  return it->second->block_table;
}

absl::Status EngineImpl::ReleaseRequest(const std::string& id) {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) {
    return absl::NotFoundError(absl::StrFormat("no live request '%s'", id));
  }
  Sequence* seq = it->second.get();
  if (seq->status != SequenceStatus::kPrefillDone && seq->status != SequenceStatus::kReserved) {
    return absl::FailedPreconditionError(
        absl::StrFormat("request '%s' is neither prefilled nor reserved; use Abort", id));
  }
  Finish(seq);
  return absl::OkStatus();
}

absl::Status EngineImpl::CopyKvMemory(void* dst, const void* src, int64_t bytes) const {
  if (!kv_pool_on_device()) {
    if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }
  return CopyDeviceMemory(dst, src, bytes);
}

EngineStats EngineImpl::Stats() const {
  EngineStats stats = counters_;
  const BlockAllocator& allocator = kv_cache_->allocator();
  stats.num_running = scheduler_.num_running();
  stats.num_waiting = scheduler_.num_waiting();
  stats.num_pages_total = allocator.num_pages();
  stats.num_pages_free = allocator.num_free();
  stats.num_pages_reserved =
      allocator.num_in_state(PageState::kReserved) + allocator.num_in_state(PageState::kReceiving);
  stats.num_pages_owned = allocator.num_in_state(PageState::kOwned);
  stats.num_pages_cached = allocator.num_cached();
  stats.num_preemptions_total = scheduler_.num_preemptions();
  stats.prefix_cache_queries_total = scheduler_.num_prefix_cache_queries();
  stats.prefix_cache_hits_total = scheduler_.num_prefix_cache_hits();
  stats.num_batches_in_flight = static_cast<int>(launched_.size());
  stats.max_batches_in_flight = max_launched_;
  if (proposer_ != nullptr) {
    stats.num_draft_pages_total = proposer_->num_pages_total();
    stats.num_draft_pages_free = proposer_->num_pages_free();
  }
  return stats;
}

int EngineImpl::ResetPrefixCache() { return kv_cache_->allocator().ClearCache(); }

std::vector<uint64_t> EngineImpl::PrefixCacheHashes() const {
  return kv_cache_->allocator().Hashes();
}

uint64_t EngineImpl::prefix_cache_version() const {
  return kv_cache_->allocator().hashes_version();
}

}  // namespace tandem
