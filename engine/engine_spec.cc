// EngineImpl: speculative decoding — the proposals asked for before a step is scheduled, and the
// verification of a verify chunk after the step (engine/spec/README.md).
#include <algorithm>
#include <utility>

#include "base/check.h"
#include "base/status_macros.h"
#include "engine/engine_impl.h"
#include "engine/spec/token_distribution.h"
#include "engine/spec/verify.h"
#include "kernels/logprobs/logprobs.h"

namespace tandem {
namespace {

// Logprobs of `token` and the `n` most likely tokens over processed logits (before temperature),
// as the backend's Logprobs kernel computes them.
TokenLogprobs HostLogprobs(const std::vector<float>& processed, int32_t token, int n) {
  const int32_t num_top = n;
  float token_logprob = 0.0f;
  std::vector<int32_t> top_tokens(kMaxTopLogprobs);
  std::vector<float> top_logprobs(kMaxTopLogprobs);
  LogprobsArgs a;
  a.logits = processed.data();
  a.tokens = &token;
  a.num_top = &num_top;
  a.token_logprob = &token_logprob;
  a.top_tokens = top_tokens.data();
  a.top_logprobs = top_logprobs.data();
  a.batch = 1;
  a.vocab_size = static_cast<int64_t>(processed.size());
  LogprobsRef(a);
  TokenLogprobs lp;
  lp.logprob = token_logprob;
  for (int i = 0; i < n; ++i) lp.top.emplace_back(top_tokens[i], top_logprobs[i]);
  return lp;
}

}  // namespace

absl::Status EngineImpl::Propose() {
  std::vector<Sequence*> seqs;
  for (auto& [id, seq] : sequences_) {
    seq->spec_tokens.clear();
    seq->spec_probs.clear();
    if (seq->status == SequenceStatus::kRunning && seq->is_decode() && !seq->prefill_only &&
        !seq->abort_requested) {
      seqs.push_back(seq.get());
    }
  }
  if (seqs.empty()) return absl::OkStatus();
  std::sort(seqs.begin(), seqs.end(),
            [](const Sequence* a, const Sequence* b) { return a->arrival < b->arrival; });
  std::vector<ProposalRequest> requests;
  std::vector<Sequence*> asked;
  for (Sequence* seq : seqs) {
    // Every token a verify step emits stays within max_tokens (and so within max_model_len and
    // the pages the request was admitted for): at most max_tokens - outputs - 1 proposals.
    const int room = seq->sampling.max_tokens - seq->num_output_tokens() - 1;
    const int k = std::min(options_.speculative.num_speculative_tokens, room);
    if (k < 1) continue;
    requests.push_back({seq, k});
    asked.push_back(seq);
  }
  if (requests.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<Proposal> proposals, proposer_->Propose(requests));
  CHECK_EQ(proposals.size(), asked.size());
  for (size_t i = 0; i < asked.size(); ++i) {
    CHECK_LE(static_cast<int>(proposals[i].tokens.size()), requests[i].max_tokens);
    CHECK(proposals[i].probs.empty() || proposals[i].probs.size() == proposals[i].tokens.size());
    asked[i]->spec_tokens = std::move(proposals[i].tokens);
    asked[i]->spec_probs = std::move(proposals[i].probs);
  }
  return absl::OkStatus();
}

RequestOutput EngineImpl::VerifyChunk(const ScheduledChunk& chunk,
                                      const ModelRunner::StepResult& result, size_t row) {
  Sequence* seq = chunk.seq;
  const int m = chunk.num_spec_tokens;
  const bool drawn = !seq->spec_probs.empty();
  const int64_t vocab = model_->config().vocab_size;
  const StepOutput& output = result.output;

  VerifyInput in;
  in.proposals = absl::MakeConstSpan(seq->spec_tokens).first(m);
  in.target_tokens = absl::MakeConstSpan(output.tokens).subspan(row, m + 1);
  in.seed = seq->seed;
  in.first_step = static_cast<uint64_t>(seq->num_output_tokens());
  in.rule = options_.speculative.acceptance;
  std::vector<std::vector<float>> p, processed;
  if (drawn) {
    CHECK(!result.logits.empty()) << seq->id;
    p.resize(m);
    processed.resize(m);
    for (int i = 0; i < m; ++i) {
      p[i] = TokenDistribution(result.logits.data() + (row + i) * vocab, vocab, result.inputs,
                               row + i, &processed[i]);
    }
    in.q = absl::MakeConstSpan(seq->spec_probs).first(m);
    in.p = p;
  }
  const VerifyResult verified = Verify(in);
  ++counters_.spec_decode_num_drafts;
  counters_.spec_decode_num_draft_tokens += m;
  counters_.spec_decode_num_accepted_tokens += verified.num_accepted;

  // The KV of the last token and of the accepted proposals is in the cache; the rest is
  // overwritten by the next step (its pages are freed below when nothing valid is left on them).
  seq->num_computed_tokens += 1 + verified.num_accepted;
  seq->spec_tokens.clear();
  seq->spec_probs.clear();
  RequestOutput out;
  out.id = seq->id;
  bool done = false;
  for (size_t e = 0; e < verified.tokens.size() && !done; ++e) {
    const int32_t token = verified.tokens[e];
    const size_t r = row + e;
    TokenLogprobs lp;
    if (seq->sampling.logprobs >= 0) {
      if (token == output.tokens[r]) {
        lp.logprob = output.token_logprobs[r];
        for (int i = 0; i < seq->sampling.logprobs; ++i) {
          const size_t at = r * kMaxTopLogprobs + i;
          lp.top.emplace_back(output.top_tokens[at], output.top_logprobs[at]);
        }
      } else {
        // Only drawn proposals (and their residual draws) differ from the target's own sample
        // (and the accept-all test rule, whose tests ask for no logprobs).
        CHECK(drawn && e < processed.size()) << seq->id;
        lp = HostLogprobs(processed[e], token, seq->sampling.logprobs);
      }
    }
    ++counters_.spec_decode_num_emitted_tokens;
    done = Emit(seq, token, std::move(lp), &out);  // `seq` is gone when it finished
  }
  if (!done) {
    const size_t keep = PagesForTokens(seq->num_computed_tokens, options_.page_size);
    if (seq->block_table.size() > keep) {
      CHECK_OK(kv_cache_->allocator().Free(absl::MakeConstSpan(seq->block_table).subspan(keep)));
      seq->block_table.resize(keep);
    }
  }
  return out;
}

}  // namespace tandem
