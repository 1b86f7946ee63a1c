// ModelRunner: turns a ScheduleDecision into StepInputs (block tables, slot mapping, positions,
// query_start, seq_lens, logits_rows and each sampling row's parameters: planned once per step on
// the host) and runs the model's step over them, which returns one sampled token per sequence
// that samples this step.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/model.h"
#include "engine/model/step_inputs.h"
#include "engine/sched/schedule_policy.h"

namespace tandem {

// Builds the inputs of one step. Chunk c covers tokens [num_computed_tokens, + num_new_tokens)
// of its sequence (then its first num_spec_tokens proposals, spec_tokens), whose block table must
// already hold the pages for them. A chunk that reaches the end of its sequence's tokens samples:
// its last row is in logits_rows (in chunk order), its SamplingRow in sampling, and
// *sampling_chunks gets its index. A verify chunk (num_spec_tokens = m > 0) samples all its
// 1 + m rows, row i as if proposals 0 .. i-1 had been emitted; *sampling_chunks gets its index
// 1 + m times.
// With `prompt_rows` (the target model's steps; a draft model's pass none): a chunk of a request
// with prompt_logprobs >= 0 scores each of its prompt positions p < num_prompt_tokens - 1
// (StepInputs::prompt_logprob_rows, target tokens[p + 1]), and *prompt_rows gets its
// {chunk index, p}, one per prompt row.
struct PromptRow {
  int chunk = 0;
  int position = 0;
};
StepInputs BuildStepInputs(const ScheduleDecision& decision, int page_size,
                           const std::vector<int>& eos_token_ids, std::vector<int>* sampling_chunks,
                           std::vector<PromptRow>* prompt_rows = nullptr);

class ModelRunner {
 public:
  // `model` and `kv_cache` must outlive the runner.
  ModelRunner(Model* model, KvCache* kv_cache, std::vector<int> eos_token_ids)
      : model_(model), kv_cache_(kv_cache), eos_token_ids_(std::move(eos_token_ids)) {}

  struct StepResult {
    std::vector<int> sampling_chunks;    // indices into decision.chunks, one per sampled token
    std::vector<PromptRow> prompt_rows;  // one per output.prompt_token_logprobs entry
    StepOutput output;                   // tokens (and logprobs) in sampling_chunks order
    // Steps with a verify chunk whose proposals were drawn (Sequence::spec_probs): the step's
    // inputs and the logits of every row ([rows, vocab], unprocessed), from which the lossless
    // rule computes the target's distributions (engine/spec/verify.h). Empty otherwise.
    StepInputs inputs;
    std::vector<float> logits;
  };

  // Runs the step of `decision` (non-empty). `layer_hook` (optional): reported each layer as its
  // KV is stored (Model::StepWithLayerHook).
  absl::StatusOr<StepResult> Run(const ScheduleDecision& decision,
                                 const LayerStoredHook* layer_hook = nullptr);

  // Run in two halves (Model::Launch / Collect), for a decision that CanLaunch: Launch queues
  // the step, Collect waits for the oldest launched one (up to Model::MaxStepsInFlight in
  // flight). Between the two, `decision`'s sequences must not change.
  static bool CanLaunch(const ScheduleDecision& decision);  // no drawn proposals to verify
  absl::Status Launch(const ScheduleDecision& decision);
  absl::StatusOr<StepResult> Collect();

 private:
  Model* model_;
  KvCache* kv_cache_;
  std::vector<int> eos_token_ids_;
  struct Launched {
    std::vector<int> sampling_chunks;
    std::vector<PromptRow> prompt_rows;
  };
  std::deque<Launched> launched_;  // the launched steps', oldest first
};

}  // namespace tandem
