// LoadModel: config.json + safetensors weights of a Hugging Face folder → a Model on a backend.
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "engine/model/hf_tensors.h"
#include "engine/model/llama_model.h"
#include "engine/model/model.h"
#include "engine/model/quant_config.h"
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

// What the CUDA kernels cover (kernels/*/README.md); anything else runs on the CPU backend.
absl::Status CheckCudaSupports(const ModelConfig& c, const std::string& dir) {
  if (c.head_dim != 64 && c.head_dim != 128) {
    return absl::UnimplementedError(absl::StrCat(
        dir, ": head_dim ", c.head_dim, " is not supported by the CUDA attention kernels (64 or ",
        "128); use --backend cpu"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& dir, Backend backend) {
  return LoadModel(dir, backend, "");
}

absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& dir, Backend backend,
                                                 const std::string& quantization) {
  ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::Load(dir));
  ASSIGN_OR_RETURN(const QuantConfig quant, QuantConfig::Resolve(dir, quantization));
  std::unique_ptr<Ops> ops;
  if (backend == Backend::kCuda && quant.quantized()) {
    return absl::UnimplementedError(absl::StrCat(dir, ": quantized weights (", quant.Describe(),
                                                 ") run on the CPU backend only so far; ",
                                                 "use --backend cpu"));
  }
  if (backend == Backend::kCuda) {
    RETURN_IF_ERROR(CheckCudaSupports(config, dir));
    ASSIGN_OR_RETURN(ops, MakeCudaOps());
  } else {
    RETURN_IF_ERROR(CheckFitsInMemory(config, dir));
    ops = MakeRefOps();
  }
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsCheckpoint> checkpoint,
                   SafetensorsCheckpoint::Open(dir));
  const absl::Time start = Clock::Real()->Now();
  ASSIGN_OR_RETURN(ModelWeights weights,
                   LoadWeights(*checkpoint, config, ops->compute_dtype(), quant));
  ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model,
                   LlamaModel::Create(config, std::move(weights), std::move(ops), backend));
  LOG(INFO) << "loaded " << dir << " on the " << BackendName(backend) << " backend in "
            << absl::FormatDuration(
                   absl::Trunc(Clock::Real()->Now() - start, absl::Milliseconds(1)))
            << ": " << config.model_type << ", " << config.num_layers << " layers, hidden "
            << config.hidden_size << ", vocab " << config.vocab_size
            << (quant.quantized() ? ", weights " + quant.Describe() : std::string());
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace tandem
