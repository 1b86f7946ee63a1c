// ModelRunner: turns a ScheduleDecision into StepInputs (block tables, slot mapping, positions,
// query_start, seq_lens, logits_rows and each sampling row's parameters: planned once per step on
// the host) and runs the model's step over them, which returns one sampled token per sequence
// that samples this step.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/model.h"
#include "engine/model/step_inputs.h"
#include "engine/sched/schedule_policy.h"

namespace tandem {

// Builds the inputs of one step. Chunk c covers tokens [num_computed_tokens, + num_new_tokens)
// of its sequence, whose block table must already hold the pages for them. A chunk that
// reaches the end of its sequence's tokens samples: its last row is in logits_rows (in chunk
// order), its SamplingRow in sampling, and *sampling_chunks gets its index.
StepInputs BuildStepInputs(const ScheduleDecision& decision, int page_size,
                           const std::vector<int>& eos_token_ids,
                           std::vector<int>* sampling_chunks);

class ModelRunner {
 public:
  // `model` and `kv_cache` must outlive the runner.
  ModelRunner(Model* model, KvCache* kv_cache, std::vector<int> eos_token_ids)
      : model_(model), kv_cache_(kv_cache), eos_token_ids_(std::move(eos_token_ids)) {}

  struct StepResult {
    std::vector<int> sampling_chunks;  // indices into decision.chunks, one per sampled token
    StepOutput output;                 // tokens (and logprobs) in sampling_chunks order
  };

  // Runs the step of `decision` (non-empty).
  absl::StatusOr<StepResult> Run(const ScheduleDecision& decision);

 private:
  Model* model_;
  KvCache* kv_cache_;
  std::vector<int> eos_token_ids_;
};

}  // namespace tandem
