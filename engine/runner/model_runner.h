// ModelRunner: turns a ScheduleDecision into StepInputs (block tables, slot mapping, positions,
// query_start, seq_lens, logits_rows: planned once per step on the host) and runs the model's
// forward pass over them, returning one row of logits per sequence that samples this step.
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
// order) and *sampling_chunks gets its index.
StepInputs BuildStepInputs(const ScheduleDecision& decision, int page_size,
                           std::vector<int>* sampling_chunks);

class ModelRunner {
 public:
  // `model` and `kv_cache` must outlive the runner.
  ModelRunner(Model* model, KvCache* kv_cache) : model_(model), kv_cache_(kv_cache) {}

  struct StepResult {
    std::vector<int> sampling_chunks;  // indices into decision.chunks, one per logits row
    // [sampling_chunks.size(), vocab_size] fp32, owned by the runner: valid until the next Run.
    const float* logits = nullptr;
  };

  // Runs the forward pass of `decision` (non-empty).
  absl::StatusOr<StepResult> Run(const ScheduleDecision& decision);

 private:
  Model* model_;
  KvCache* kv_cache_;
  std::vector<float> logits_;  // reused across steps (rows * vocab can be large)
};

}  // namespace tandem
