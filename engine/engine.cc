#include "engine/engine.h"

#include "base/status_macros.h"
#include "engine/engine_impl.h"
#include "tokenizer/tokenizer.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  RETURN_IF_ERROR(ValidateSpeculativeConfig(options.speculative));
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                   LoadModel(options.model_dir, options.backend,
                             ParallelConfig{.tensor_parallel = options.tensor_parallel,
                                            .pipeline_parallel = options.pipeline_parallel,
                                            .micro_batches = options.pipeline_micro_batches,
                                            .devices = options.devices,
                                            .allow_device_sharing = options.allow_device_sharing},
                             options.quantization));
  std::vector<int> eos_token_ids = model->config().eos_token_ids;
  if (eos_token_ids.empty()) {
    ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, Tokenizer::Load(options.model_dir));
    if (tokenizer->eos_id().has_value()) eos_token_ids.push_back(*tokenizer->eos_id());
  }
  std::unique_ptr<Model> draft;
  if (options.speculative.method == SpecMethod::kDraft) {
    ASSIGN_OR_RETURN(draft, LoadModel(options.speculative.draft_model, options.backend));
  }
  ASSIGN_OR_RETURN(
      std::unique_ptr<EngineImpl> engine,
      EngineImpl::Create(options, std::move(model), std::move(eos_token_ids), std::move(draft)));
  return std::unique_ptr<Engine>(std::move(engine));
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::CreateWithModel(const EngineOptions& options,
                                                                std::unique_ptr<Model> model,
                                                                std::unique_ptr<Model> draft) {
  if (model == nullptr) return absl::InvalidArgumentError("engine needs a model");
  RETURN_IF_ERROR(ValidateSpeculativeConfig(options.speculative));
  std::vector<int> eos_token_ids = model->config().eos_token_ids;
  if (options.speculative.method == SpecMethod::kDraft && draft == nullptr) {
    ASSIGN_OR_RETURN(draft, LoadModel(options.speculative.draft_model, options.backend));
  }
  ASSIGN_OR_RETURN(
      std::unique_ptr<EngineImpl> engine,
      EngineImpl::Create(options, std::move(model), std::move(eos_token_ids), std::move(draft)));
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace tandem
