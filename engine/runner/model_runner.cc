#include "engine/runner/model_runner.h"

#include <algorithm>
#include <utility>

#include "base/check.h"
#include "base/status_macros.h"
#include "engine/runner/sampling_rows.h"

namespace tandem {

StepInputs BuildStepInputs(const ScheduleDecision& decision, int page_size,
                           const std::vector<int>& eos_token_ids, std::vector<int>* sampling_chunks,
                           std::vector<PromptRow>* prompt_rows) {
  StepInputs in;
  in.num_seqs = static_cast<int>(decision.chunks.size());
  in.query_start.push_back(0);
  in.history_start.push_back(0);
  in.bias_start.push_back(0);
  for (const ScheduledChunk& chunk : decision.chunks) {
    in.max_pages_per_seq =
        std::max(in.max_pages_per_seq, static_cast<int>(chunk.seq->block_table.size()));
  }
  in.block_tables.assign(static_cast<size_t>(in.num_seqs) * in.max_pages_per_seq, 0);
  sampling_chunks->clear();
  if (prompt_rows != nullptr) prompt_rows->clear();
  for (int c = 0; c < in.num_seqs; ++c) {
    const Sequence& seq = *decision.chunks[c].seq;
    const int begin = seq.num_computed_tokens;
    const int end = begin + decision.chunks[c].num_new_tokens;
    const int num_spec = decision.chunks[c].num_spec_tokens;
    CHECK_LE(num_spec, static_cast<int>(seq.spec_tokens.size())) << seq.id;
    CHECK_LE(end, seq.num_tokens() + num_spec) << seq.id;
    CHECK(num_spec == 0 || end == seq.num_tokens() + num_spec) << seq.id;
    CHECK_LE(end, static_cast<int64_t>(seq.block_table.size()) * page_size) << seq.id;
    // Once the first token went out (with the prompt logprobs), a recomputation after a
    // preemption scores nothing again.
    if (prompt_rows != nullptr && seq.sampling.prompt_logprobs >= 0 &&
        seq.num_output_tokens() == 0) {
      const int first_row = static_cast<int>(in.token_ids.size());
      for (int pos = begin; pos < std::min(end, seq.num_prompt_tokens - 1); ++pos) {
        in.prompt_logprob_rows.push_back(first_row + pos - begin);
        in.prompt_logprob_targets.push_back(seq.tokens[pos + 1]);
        in.prompt_logprob_top.push_back(seq.sampling.prompt_logprobs);
        prompt_rows->push_back(PromptRow{c, pos});
      }
    }
    for (int pos = begin; pos < end; ++pos) {
      in.token_ids.push_back(pos < seq.num_tokens() ? seq.tokens[pos]
                                                    : seq.spec_tokens[pos - seq.num_tokens()]);
      in.positions.push_back(pos);
      in.slot_mapping.push_back(seq.block_table[pos / page_size] * page_size + pos % page_size);
    }
    in.query_start.push_back(static_cast<int32_t>(in.token_ids.size()));
    in.seq_lens.push_back(end);
    std::copy(seq.block_table.begin(), seq.block_table.end(),
              in.block_tables.begin() + static_cast<size_t>(c) * in.max_pages_per_seq);
    if (end == seq.num_tokens() + num_spec) {
      for (int i = 0; i <= num_spec; ++i) {
        in.logits_rows.push_back(in.query_start.back() - 1 - num_spec + i);
        AppendSamplingRow(seq, eos_token_ids, &in, i);
        sampling_chunks->push_back(c);
      }
    }
  }
  in.num_tokens = static_cast<int64_t>(in.token_ids.size());
  return in;
}

bool ModelRunner::CanLaunch(const ScheduleDecision& decision) {
  for (const ScheduledChunk& chunk : decision.chunks) {
    if (chunk.num_spec_tokens > 0 && !chunk.seq->spec_probs.empty()) return false;
  }
  return true;
}

absl::Status ModelRunner::Launch(const ScheduleDecision& decision) {
  CHECK(CanLaunch(decision));
  Launched launched;
  const StepInputs inputs = BuildStepInputs(decision, kv_cache_->layout().page_size, eos_token_ids_,
                                            &launched.sampling_chunks, &launched.prompt_rows);
  RETURN_IF_ERROR(model_->Launch(inputs, kv_cache_->layout(), kv_cache_->pool()));
  launched_.push_back(std::move(launched));
  return absl::OkStatus();
}

absl::StatusOr<ModelRunner::StepResult> ModelRunner::Collect() {
  if (launched_.empty()) return absl::FailedPreconditionError("no launched step to collect");
  StepResult result;
  result.sampling_chunks = std::move(launched_.front().sampling_chunks);
  result.prompt_rows = std::move(launched_.front().prompt_rows);
  launched_.pop_front();
  ASSIGN_OR_RETURN(result.output, model_->Collect());
  return result;
}

absl::StatusOr<ModelRunner::StepResult> ModelRunner::Run(const ScheduleDecision& decision,
                                                         const LayerStoredHook* layer_hook) {
  StepResult result;
  const StepInputs inputs = BuildStepInputs(decision, kv_cache_->layout().page_size, eos_token_ids_,
                                            &result.sampling_chunks, &result.prompt_rows);
  if (CanLaunch(decision)) {
    if (layer_hook != nullptr) {
      ASSIGN_OR_RETURN(result.output, model_->StepWithLayerHook(inputs, kv_cache_->layout(),
                                                                kv_cache_->pool(), *layer_hook));
    } else {
      ASSIGN_OR_RETURN(result.output, model_->Step(inputs, kv_cache_->layout(), kv_cache_->pool()));
    }
    return result;
  }
  // The lossless rule needs the target's distributions: the logits come back to the host and
  // every row is sampled there (the same sampler semantics as the backend's).
  const int64_t vocab = model_->config().vocab_size;
  result.logits.resize(inputs.logits_rows.size() * static_cast<size_t>(vocab));
  RETURN_IF_ERROR(
      model_->ComputeLogits(inputs, kv_cache_->layout(), kv_cache_->pool(), result.logits.data()));
  std::vector<float> scratch = result.logits;
  // ComputeLogits returned with the logits on the host: every layer's KV is stored.
  for (int l = 0; layer_hook != nullptr && l < kv_cache_->layout().num_layers; ++l) {
    (*layer_hook)(l, nullptr);
  }
  ASSIGN_OR_RETURN(result.output, SampleOnHost(inputs, vocab, scratch.data()));
  // Prompt rows in the same step (rare: a prompt chunk next to a drawn verify chunk): a pass
  // over the forward per batch of rows, as many rows as the step has sequences (within the
  // model's logits rows).
  RETURN_IF_ERROR(PromptLogprobsViaLogits(*model_, inputs, kv_cache_->layout(), kv_cache_->pool(),
                                          inputs.num_seqs, &result.output));
  result.inputs = inputs;
  return result;
}

}  // namespace tandem
