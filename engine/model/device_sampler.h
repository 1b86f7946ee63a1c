// The sampling half of a step, backend-neutral: per logits row, penalties and biases
// (LogitsProcess, in place), the draw (Sampling: temperature, top-k, top-p, min_p, the row's own
// seed and step), then the logprobs of the drawn token and its alternatives (Logprobs, over the
// processed logits, before temperature). Everything runs on the backend; ReadSampled copies back
// only the token ids, and the logprobs when a row asked for them.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "engine/model/ops.h"
#include "engine/model/step_inputs.h"

namespace tandem {

// The sampler's output block for `rows` logits rows, one backend buffer laid out as
//   tokens [rows] int32 | token_logprobs [rows] f32 | top_tokens [rows, kMaxTopLogprobs] int32 |
//   top_logprobs [rows, kMaxTopLogprobs] f32
// so that one copy brings back the tokens alone, or everything.
struct SampledBlock {
  void* base = nullptr;
  int64_t rows = 0;

  static int64_t Bytes(int64_t rows) { return rows * (2 + 2 * kMaxTopLogprobs) * 4; }
  int32_t* tokens() const { return static_cast<int32_t*>(base); }
  float* token_logprobs() const { return reinterpret_cast<float*>(tokens() + rows); }
  int32_t* top_tokens() const { return reinterpret_cast<int32_t*>(token_logprobs() + rows); }
  float* top_logprobs() const {
    return reinterpret_cast<float*>(top_tokens() + rows * kMaxTopLogprobs);
  }
};

// Samples the step's rows from `logits` ([step.num_rows, vocab_size] fp32 on the backend,
// processed in place) into `out`. `every_stage`: run the processing and logprobs kernels even if
// no row needs them (graphs are captured once for every step of their batch size).
absl::Status RunSampler(Ops& ops, const DeviceStep& step, float* logits, int64_t vocab_size,
                        const SampledBlock& out, bool every_stage);

// Copies the first `real_rows` rows back: tokens, and the logprobs when `with_logprobs`.
absl::StatusOr<StepOutput> ReadSampled(Ops& ops, const SampledBlock& out, int64_t real_rows,
                                       bool with_logprobs);

}  // namespace tandem
