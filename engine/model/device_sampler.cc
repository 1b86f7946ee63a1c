#include "engine/model/device_sampler.h"

#include <vector>

#include "base/status_macros.h"

namespace tandem {

absl::Status RunSampler(Ops& ops, const DeviceStep& step, float* logits, int64_t vocab_size,
                        const SampledBlock& out, bool every_stage) {
  const int64_t rows = step.num_rows;
  if (rows == 0) return absl::OkStatus();
  if (every_stage || step.any_processing) {
    RETURN_IF_ERROR(ops.LogitsProcess(LogitsProcessArgs{
        .logits = logits,
        .batch = rows,
        .vocab_size = vocab_size,
        .repetition_penalty = step.repetition_penalty,
        .frequency_penalty = step.frequency_penalty,
        .presence_penalty = step.presence_penalty,
        .history_tokens = step.history_tokens,
        .history_start = step.history_start,
        .num_prompt_history = step.num_prompt_history,
        .bias_tokens = step.bias_tokens,
        .bias_values = step.bias_values,
        .bias_start = step.bias_start,
    }));
  }
  SamplingArgs sampling;
  sampling.logits = logits;
  sampling.temperature = step.temperature;
  sampling.top_k = step.top_k;
  sampling.top_p = step.top_p;
  sampling.min_p = step.min_p;
  sampling.seeds = step.seeds;
  sampling.steps = step.steps;
  sampling.out_tokens = out.tokens();
  sampling.batch = rows;
  sampling.vocab_size = vocab_size;
  RETURN_IF_ERROR(ops.Sampling(sampling));
  if (every_stage || step.any_logprobs) {
    RETURN_IF_ERROR(ops.Logprobs(LogprobsArgs{.logits = logits,
                                              .tokens = out.tokens(),
                                              .num_top = step.num_logprobs,
                                              .token_logprob = out.token_logprobs(),
                                              .top_tokens = out.top_tokens(),
                                              .top_logprobs = out.top_logprobs(),
                                              .batch = rows,
                                              .vocab_size = vocab_size}));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepOutput> ReadSampled(Ops& ops, const SampledBlock& out, int64_t real_rows,
                                       bool with_logprobs) {
  StepOutput result;
  const int64_t n = out.rows;
  if (real_rows == 0) return result;
  if (!with_logprobs) {
    result.tokens.resize(real_rows);
    RETURN_IF_ERROR(ops.CopyToHost(result.tokens.data(), out.tokens(), real_rows * 4));
    return result;
  }
  std::vector<uint8_t> block(SampledBlock::Bytes(n));
  RETURN_IF_ERROR(ops.CopyToHost(block.data(), out.base, static_cast<int64_t>(block.size())));
  const SampledBlock host{block.data(), n};
  const int64_t k = kMaxTopLogprobs;
  result.tokens.assign(host.tokens(), host.tokens() + real_rows);
  result.token_logprobs.assign(host.token_logprobs(), host.token_logprobs() + real_rows);
  result.top_tokens.assign(host.top_tokens(), host.top_tokens() + real_rows * k);
  result.top_logprobs.assign(host.top_logprobs(), host.top_logprobs() + real_rows * k);
  return result;
}

}  // namespace tandem
