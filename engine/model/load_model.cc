// LoadModel: config.json + safetensors weights of a Hugging Face folder → a Model on a backend.
#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "engine/model/llama_model.h"
#include "engine/model/model.h"
#include "engine/model/safetensors.h"
#include "engine/model/weights.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& dir, Backend backend) {
  if (backend == Backend::kCuda) {
    return absl::UnimplementedError("LoadModel: the CUDA backend is not implemented yet");
  }
  ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::Load(dir));
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsCheckpoint> checkpoint,
                   SafetensorsCheckpoint::Open(dir));
  std::unique_ptr<Ops> ops = MakeRefOps();
  ASSIGN_OR_RETURN(ModelWeights weights, LoadWeights(*checkpoint, config, ops->compute_dtype()));
  LOG(INFO) << "loaded " << dir << ": " << config.model_type << ", " << config.num_layers
            << " layers, hidden " << config.hidden_size << ", vocab " << config.vocab_size;
  ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model,
                   LlamaModel::Create(config, std::move(weights), std::move(ops)));
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace tandem
