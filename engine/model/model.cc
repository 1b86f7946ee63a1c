// Model's defaults: a model that only computes logits (a test fake) samples them on the host
// with the same sampler the backends run (device_sampler.h over the reference ops).
#include "engine/model/model.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "base/status_macros.h"
#include "engine/model/device_sampler.h"
#include "kernels/logprobs/logprobs.h"

namespace tandem {

absl::StatusOr<StepOutput> SampleOnHost(const StepInputs& inputs, int64_t vocab_size,
                                        float* logits) {
  std::unique_ptr<Ops> ops = MakeRefOps();
  ASSIGN_OR_RETURN(const DeviceStep step, ops->BeginStep(inputs, KvLayout{}, 0));
  std::vector<uint8_t> block(SampledBlock::Bytes(step.num_rows));
  const SampledBlock out{block.data(), step.num_rows};
  RETURN_IF_ERROR(RunSampler(*ops, step, logits, vocab_size, out, /*every_stage=*/false));
  return ReadSampled(*ops, out, step.num_rows, inputs.AnyLogprobs());
}

KvLayout Model::KvPoolLayout(int page_size) const {
  const ModelConfig& c = config();
  KvLayout layout;
  layout.num_layers = c.num_layers;
  layout.page_size = page_size;
  layout.num_kv_heads = c.num_kv_heads;
  layout.head_dim = c.head_dim;
  // The kernels store the cache in fp32 or bf16; bf16 unless the model itself is fp32.
  layout.dtype = c.dtype == DType::kF32 ? DType::kF32 : DType::kBF16;
  return layout;
}

absl::Status PromptLogprobsViaLogits(Model& model, const StepInputs& inputs, const KvLayout& layout,
                                     void* kv_pool, int64_t rows_per_call, StepOutput* out) {
  const int64_t p = static_cast<int64_t>(inputs.prompt_logprob_rows.size());
  if (p == 0) return absl::OkStatus();
  const int64_t vocab = model.config().vocab_size;
  const int64_t k = kMaxTopLogprobs;
  out->prompt_token_logprobs.assign(p, 0.0f);
  out->prompt_top_tokens.assign(p * k, -1);
  out->prompt_top_logprobs.assign(p * k, 0.0f);
  rows_per_call = std::max<int64_t>(rows_per_call, 1);
  StepInputs sub = inputs;
  std::vector<float> logits;
  for (int64_t start = 0; start < p; start += rows_per_call) {
    const int64_t r = std::min(rows_per_call, p - start);
    sub.logits_rows.assign(inputs.prompt_logprob_rows.begin() + start,
                           inputs.prompt_logprob_rows.begin() + start + r);
    sub.sampling.assign(r, SamplingRow{});
    logits.resize(r * vocab);
    RETURN_IF_ERROR(model.ComputeLogits(sub, layout, kv_pool, logits.data()));
    LogprobsRef(LogprobsArgs{.logits = logits.data(),
                             .tokens = inputs.prompt_logprob_targets.data() + start,
                             .num_top = inputs.prompt_logprob_top.data() + start,
                             .token_logprob = out->prompt_token_logprobs.data() + start,
                             .top_tokens = out->prompt_top_tokens.data() + start * k,
                             .top_logprobs = out->prompt_top_logprobs.data() + start * k,
                             .batch = r,
                             .vocab_size = vocab});
  }
  return absl::OkStatus();
}

absl::StatusOr<StepOutput> Model::Step(const StepInputs& inputs, const KvLayout& layout,
                                       void* kv_pool) {
  std::vector<float> logits(inputs.logits_rows.size() * static_cast<size_t>(config().vocab_size));
  RETURN_IF_ERROR(ComputeLogits(inputs, layout, kv_pool, logits.data()));
  ASSIGN_OR_RETURN(StepOutput out, SampleOnHost(inputs, config().vocab_size, logits.data()));
  RETURN_IF_ERROR(PromptLogprobsViaLogits(*this, inputs, layout, kv_pool,
                                          static_cast<int64_t>(inputs.prompt_logprob_rows.size()),
                                          &out));
  return out;
}

absl::Status Model::Launch(const StepInputs& inputs, const KvLayout& layout, void* kv_pool) {
  if (launched_.has_value())
    return absl::FailedPreconditionError("a launched step is not collected");
  ASSIGN_OR_RETURN(StepOutput output, Step(inputs, layout, kv_pool));
  launched_ = std::move(output);
  return absl::OkStatus();
}

absl::StatusOr<StepOutput> Model::Collect() {
  if (!launched_.has_value()) return absl::FailedPreconditionError("no launched step to collect");
  StepOutput output = std::move(*launched_);
  launched_.reset();
  return output;
}

absl::StatusOr<StepOutput> Model::StepWithLayerHook(const StepInputs& inputs,
                                                    const KvLayout& layout, void* kv_pool,
                                                    const LayerStoredHook& hook) {
  ASSIGN_OR_RETURN(StepOutput out, Step(inputs, layout, kv_pool));
  for (int l = 0; l < layout.num_layers; ++l) hook(l, nullptr);
  return out;
}

}  // namespace tandem
