// LoadModel: config.json + safetensors weights of a Hugging Face folder → a Model on a backend.
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "engine/model/hf_tensors.h"
#include "engine/model/llama_model.h"
#include "engine/model/model.h"
#include "engine/model/safetensors.h"
#include "engine/model/weights.h"

namespace tandem {
namespace {

// The CPU backend holds every weight as fp32: refuse up front what cannot fit in RAM, rather
// than dying in an allocation halfway through the load.
absl::Status CheckFitsInMemory(const ModelConfig& config, const std::string& dir) {
  int64_t elems = 0;
  for (const HfTensor& t : HfTensors(config)) elems += t.spec.NumElements();
  const int64_t need = elems * int64_t{sizeof(float)};
  const int64_t have = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  if (have > 0 && need > have * 9 / 10) {
    return absl::ResourceExhaustedError(
        absl::StrCat(dir, ": the CPU backend needs ", need >> 20, " MiB for fp32 weights, this ",
                     "machine has ", have >> 20, " MiB; use the CUDA backend or a smaller model"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& dir, Backend backend) {
  if (backend == Backend::kCuda) {
    return absl::UnimplementedError("LoadModel: the CUDA backend is not implemented yet");
  }
  ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::Load(dir));
  RETURN_IF_ERROR(CheckFitsInMemory(config, dir));
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
