// EngineImpl: the parts of Step() after scheduling — sampling, stop checks, finishing, and
// stopping for good when the backend is unusable.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/check.h"
#include "base/logging.h"
#include "base/page_hash.h"
#include "engine/engine_impl.h"

namespace tandem {

void EngineImpl::Finish(Sequence* seq) {
  // A push may still read the pages (engine/kv_push.h): it lets go of them first.
  if (seq->kv_push_announced) push_listener_->BeforeFree(seq->id);
  if (seq->status == SequenceStatus::kForkWaiting) {
    // No pages yet: it only leaves its parent's list.
    std::vector<Sequence*>& siblings = seq->fork_parent->fork_children;
    siblings.erase(std::find(siblings.begin(), siblings.end(), seq));
  } else if (seq->status == SequenceStatus::kWaiting || seq->status == SequenceStatus::kRunning) {
    scheduler_.Remove(seq);
  } else {
    // kPrefillDone (owned pages) or kReserved (reserved or receiving pages).
    CHECK_OK(kv_cache_->allocator().Free(seq->block_table));
    seq->block_table.clear();
  }
  // Siblings still waiting for this prompt's KV compute it themselves.
  if (!seq->fork_children.empty()) OrphanSiblings(seq);
  seq->status = SequenceStatus::kFinished;
  if (seq->abort_requested) --num_abort_requested_;
  if (proposer_ != nullptr) proposer_->Forget(seq->id);
  CHECK_EQ(sequences_.erase(seq->id), 1u) << seq->id;
}

bool EngineImpl::AnnouncePushes(const ScheduleDecision& decision) {
  if (push_listener_ == nullptr) return false;
  std::vector<KvPush> pushes;
  const int page_size = options_.page_size;
  for (const ScheduledChunk& chunk : decision.chunks) {
    Sequence* seq = chunk.seq;
    if (!seq->prefill_only || seq->num_output_tokens() != 0 ||
        seq->num_computed_tokens + chunk.num_new_tokens != seq->num_prompt_tokens) {
      continue;  // not the final chunk of a prefill-only prompt
    }
    const size_t prompt_pages =
        static_cast<size_t>(PagesForTokens(seq->num_prompt_tokens, page_size));
    CHECK_GE(seq->block_table.size(), prompt_pages) << seq->id;
    pushes.push_back(KvPush{
        seq->id,
        std::vector<int32_t>(seq->block_table.begin(), seq->block_table.begin() + prompt_pages),
        seq->num_prompt_tokens});
    seq->kv_push_announced = true;
  }
  if (pushes.empty()) return false;
  push_listener_->OnPushBegin(pushes);
  return true;
}

std::vector<RequestOutput> EngineImpl::FinishAborted() {
  std::vector<RequestOutput> outputs;
  if (num_abort_requested_ == 0) return outputs;
  std::vector<Sequence*> aborted;
  for (auto& [id, seq] : sequences_) {
    // One in a launched step ends once that step is collected (its pages are in use).
    if (seq->abort_requested && !seq->in_flight) aborted.push_back(seq.get());
  }
  for (Sequence* seq : aborted) {
    RequestOutput out;
    out.id = seq->id;
    out.finish_reason = FinishReason::kAbort;
    outputs.push_back(std::move(out));
    Finish(seq);
  }
  return outputs;
}

void EngineImpl::ExtendPageHashes(Sequence* seq) const {
  if (!seq->cache_prefix) return;
  const int page_size = options_.page_size;
  const absl::Span<const int32_t> tokens(seq->tokens);
  for (size_t i = seq->page_hashes.size(); (i + 1) * page_size <= tokens.size(); ++i) {
    const uint64_t parent = i == 0 ? kPageHashSeed : seq->page_hashes[i - 1];
    seq->page_hashes.push_back(ChainPageHash(parent, tokens.subspan(i * page_size, page_size)));
  }
}

void EngineImpl::RegisterFullPages(Sequence* seq) {
  if (!seq->cache_prefix) return;
  // A page is hashed once all its tokens are known and their KV computed. During a verify
  // chunk's emission the computed tokens run ahead of the known ones (the accepted proposals'
  // KV is written before they are appended); rejected proposals never count as computed
  // (VerifyChunk advances num_computed_tokens by the accepted ones only), so a page holding
  // their KV never counts as full and is never hashed: the next step overwrites that KV first.
  const int full = std::min(seq->num_computed_tokens / options_.page_size,
                            static_cast<int>(seq->page_hashes.size()));
  CHECK_LE(seq->num_computed_tokens,
           seq->num_tokens() + options_.speculative.num_speculative_tokens)
      << seq->id;
  CHECK_LE(full, static_cast<int>(seq->block_table.size())) << seq->id;
  for (; seq->num_hashed_pages < full; ++seq->num_hashed_pages) {
    const int i = seq->num_hashed_pages;
    // False when another page already holds this prefix (computed twice concurrently): this
    // copy then stays unhashed and goes back to free when its request ends.
    CHECK_OK(kv_cache_->allocator().Register(seq->block_table[i], seq->page_hashes[i]).status());
  }
}

RequestOutput EngineImpl::AppendToken(Sequence* seq, const StepOutput& output, size_t row) {
  RequestOutput out;
  out.id = seq->id;
  TokenLogprobs lp;
  if (seq->sampling.logprobs >= 0) {
    lp.logprob = output.token_logprobs[row];
    for (int i = 0; i < seq->sampling.logprobs; ++i) {
      const size_t at = row * kMaxTopLogprobs + i;
      lp.top.emplace_back(output.top_tokens[at], output.top_logprobs[at]);
    }
  }
  Emit(seq, output.tokens[row], std::move(lp), &out);
  return out;
}

bool EngineImpl::Emit(Sequence* seq, int32_t token, TokenLogprobs logprobs, RequestOutput* out) {
  if (seq->num_output_tokens() == 0) {
    out->num_cached_tokens = std::max(seq->num_cached_tokens, 0);
    if (seq->sampling.prompt_logprobs >= 0) out->prompt_logprobs = std::move(seq->prompt_logprobs);
  }
  seq->tokens.push_back(token);
  ExtendPageHashes(seq);
  // Before the stop check, which may finish the sequence and free its pages into the cache: a
  // verify chunk's accepted proposals fill pages as they are emitted.
  RegisterFullPages(seq);
  ++counters_.num_generated_tokens_total;
  out->new_tokens.push_back(token);
  if (seq->sampling.logprobs >= 0) out->logprobs.push_back(std::move(logprobs));
  out->finish_reason = stop_checker_.Check(seq->sampling, token, seq->num_output_tokens(),
                                           seq->num_tokens(), max_model_len_);
  if (out->finish_reason != FinishReason::kNone && seq->keep_kv_when_finished) {
    out->prefill_finish_reason = out->finish_reason;  // the pages stay for the transfer
  } else if (out->finish_reason != FinishReason::kNone) {
    Finish(seq);
    return true;
  }
  if (seq->prefill_only) {
    // The prompt's KV stays in the pages for the transfer until ReleaseRequest().
    out->finish_reason = FinishReason::kPrefillDone;
    scheduler_.Detach(seq);
    seq->status = SequenceStatus::kPrefillDone;
    return true;
  }
  return false;
}

void EngineImpl::PostProcess(const ScheduleDecision& decision,
                             const ModelRunner::StepResult& result,
                             std::vector<RequestOutput>* outputs) {
  CHECK_EQ(result.sampling_chunks.size(), result.output.tokens.size());
  CHECK_EQ(result.prompt_rows.size(), result.output.prompt_token_logprobs.size());
  // Prompt logprobs first: a chunk that completes the prompt may fork siblings (which copy
  // them) and emit the first token (which carries them).
  for (size_t i = 0; i < result.prompt_rows.size(); ++i) {
    Sequence* seq = decision.chunks[result.prompt_rows[i].chunk].seq;
    // A prompt recomputed after a preemption scores its positions again: kept once.
    if (result.prompt_rows[i].position != static_cast<int>(seq->prompt_logprobs.size())) continue;
    TokenLogprobs lp;
    lp.logprob = result.output.prompt_token_logprobs[i];
    for (int k = 0; k < seq->sampling.prompt_logprobs; ++k) {
      const size_t at = i * kMaxTopLogprobs + k;
      lp.top.emplace_back(result.output.prompt_top_tokens[at],
                          result.output.prompt_top_logprobs[at]);
    }
    seq->prompt_logprobs.push_back(std::move(lp));
  }
  for (const ScheduledChunk& chunk : decision.chunks) {
    // A verify chunk's computed tokens depend on how many proposals it accepts (VerifyChunk).
    if (chunk.num_spec_tokens > 0) continue;
    Sequence* seq = chunk.seq;
    counters_.num_prompt_tokens_computed_total +=
        std::clamp(seq->num_prompt_tokens - seq->num_computed_tokens, 0, chunk.num_new_tokens);
    seq->num_computed_tokens += chunk.num_new_tokens;
    // Before AppendToken, which may finish the sequence and free its pages into the cache.
    RegisterFullPages(seq);
    // The prompt's KV is complete: its waiting siblings fork from it (before AppendToken, which
    // may finish this sequence).
    if (!seq->fork_children.empty() && seq->num_computed_tokens >= seq->num_prompt_tokens) {
      Fork(seq);
    }
  }
  for (size_t i = 0; i < result.sampling_chunks.size();) {
    const ScheduledChunk& chunk = decision.chunks[result.sampling_chunks[i]];
    if (chunk.num_spec_tokens == 0) {
      outputs->push_back(AppendToken(chunk.seq, result.output, i));
      ++i;
    } else {
      outputs->push_back(VerifyChunk(chunk, result, i));
      i += 1 + chunk.num_spec_tokens;
    }
  }
}

void EngineImpl::FailBatch(const ScheduleDecision& decision, const absl::Status& error,
                           std::vector<RequestOutput>* outputs) {
  LOG(ERROR) << "step failed, finishing its " << decision.chunks.size() << " requests: " << error;
  for (const ScheduledChunk& chunk : decision.chunks) {
    RequestOutput out;
    out.id = chunk.seq->id;
    out.finish_reason = FinishReason::kError;
    out.error = error.ToString();
    outputs->push_back(std::move(out));
    Finish(chunk.seq);
  }
}

absl::Status EngineImpl::Break(const absl::Status& error) {
  LOG(ERROR) << "the backend is unusable; ending all " << sequences_.size()
             << " requests and refusing new ones: " << error;
  broken_ = error;
  // Steps still in flight write into pages about to be freed: they end first (a group whose
  // rank failed fails them all quickly, its communicators aborted).
  DrainLaunched();
  std::vector<Sequence*> all;
  all.reserve(sequences_.size());
  for (auto& [id, seq] : sequences_) all.push_back(seq.get());
  for (Sequence* seq : all) Finish(seq);
  // Nothing the backend wrote can be trusted, nor will anything read it again.
  kv_cache_->allocator().ClearCache();
  return broken_;
}

absl::Status EngineImpl::BrokenError() const {
  return absl::FailedPreconditionError(
      absl::StrCat("the engine stopped after a backend failure: ", broken_.message()));
}

}  // namespace tandem
