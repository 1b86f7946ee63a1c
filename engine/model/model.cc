// Model's defaults: a model that only computes logits (a test fake) samples them on the host
// with the same sampler the backends run (device_sampler.h over the reference ops).
#include "engine/model/model.h"

#include <memory>
#include <utility>
#include <vector>

#include "base/status_macros.h"
#include "engine/model/device_sampler.h"

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

absl::StatusOr<StepOutput> Model::Step(const StepInputs& inputs, const KvLayout& layout,
                                       void* kv_pool) {
  std::vector<float> logits(inputs.logits_rows.size() * static_cast<size_t>(config().vocab_size));
  RETURN_IF_ERROR(ComputeLogits(inputs, layout, kv_pool, logits.data()));
  return SampleOnHost(inputs, config().vocab_size, logits.data());
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
