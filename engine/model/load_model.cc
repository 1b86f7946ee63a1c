// LoadModel: config.json + safetensors weights of a Hugging Face folder → a Model on a backend;
// and the parallel groups' loaders (parallel_model.h): CPU ranks over thread communicators,
// CUDA ranks over NCCL or the in-process peer communicator (cuda_rank_groups.h; pipeline stages
// on CUDA: load_cuda_pipeline.cc).
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "engine/cuda/cuda_group.h"
#include "engine/model/cuda_rank_groups.h"
#include "engine/model/device_placement.h"
#include "engine/model/hf_tensors.h"
#include "engine/model/llama_model.h"
#include "engine/model/model.h"
#include "engine/model/parallel_model.h"
#include "engine/model/quant_config.h"
#include "engine/model/safetensors.h"
#include "engine/model/tensor_shard.h"
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

absl::StatusOr<std::unique_ptr<Model>> LoadCudaParallelModel(const std::string& dir,
                                                             const ParallelConfig& parallel,
                                                             const CudaGroupOptions& options,
                                                             const std::string& quantization) {
  const int tp = parallel.tensor_parallel;
  if (parallel.pipeline_parallel != 1) {
    return LoadCudaPipelineModel(dir, parallel, options, quantization);
  }
  ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::Load(dir));
  RETURN_IF_ERROR(CheckCudaSupports(config, dir));
  RETURN_IF_ERROR(CheckTensorParallel(config, tp));
  ASSIGN_OR_RETURN(const QuantConfig quant, QuantConfig::Resolve(dir, quantization));
  ASSIGN_OR_RETURN(
      const std::vector<int> devices,
      PlaceRanksOnDevices(tp, parallel.devices, CudaDeviceCount(), parallel.allow_device_sharing));
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsCheckpoint> checkpoint,
                   SafetensorsCheckpoint::Open(dir));
  const absl::Time start = Clock::Real()->Now();
  std::vector<CudaRankOps> ops(tp);
  for (int r = 0; r < tp; ++r) {
    ASSIGN_OR_RETURN(ops[r], MakeCudaRankOps(devices[r]));
  }
  std::vector<void*> streams;
  for (const CudaRankOps& o : ops) streams.push_back(o.stream);
  ASSIGN_OR_RETURN(
      DeviceGroup group,
      MakeDeviceGroup(devices, streams, options, "tensor-parallel ranks", options.on_peer_group));
  const ModelConfig rank_config = ShardConfig(config, tp);
  std::vector<ParallelModel::Rank> ranks;
  for (int r = 0; r < tp; ++r) {
    const int device = devices[r];
    RETURN_IF_ERROR(SetCudaDevice(device));  // rank r's weights go to its GPU
    ParallelModel::Rank out;
    out.num_layers = config.num_layers;
    out.device = device;
    out.enter = [device] { return SetCudaDevice(device); };
    out.tp_comm = std::move(group.comms[r]);
    const GroupRank place{.tp_comm = out.tp_comm.get(), .samples = r == 0};
    ASSIGN_OR_RETURN(ModelWeights weights, LoadWeights(*checkpoint, config, DType::kBF16,
                                                       TensorShard{r, tp}, StageLayers{}, quant));
    ASSIGN_OR_RETURN(out.model, LlamaModel::Create(rank_config, std::move(weights),
                                                   std::move(ops[r].ops), Backend::kCuda, place));
    ranks.push_back(std::move(out));
  }
  RETURN_IF_ERROR(SetCudaDevice(devices[0]));
  LOG(INFO) << "loaded " << dir << " on the cuda backend, tensor_parallel " << tp << " on GPUs ["
            << absl::StrJoin(devices, ", ") << "], in "
            << absl::FormatDuration(
                   absl::Trunc(Clock::Real()->Now() - start, absl::Milliseconds(1)))
            << ": " << config.model_type
            << (quant.quantized() ? ", weights " + quant.Describe() : std::string());
  auto model = std::make_unique<ParallelModel>(
      config, parallel, Backend::kCuda, std::vector<CommGroupHandle>{std::move(group.handle)},
      std::move(ranks));
  if (!OnOneDevice(devices) || options.split_kv_pool) {
    model->SetSplitPoolAllocator([devices](const std::vector<int64_t>& slices) {
      return AllocateSplitDevicePool(devices, slices);
    });
  }
  return std::unique_ptr<Model>(std::move(model));
}

absl::StatusOr<std::unique_ptr<Model>> LoadParallelModel(const std::string& dir,
                                                         const ParallelConfig& parallel,
                                                         ParallelGroups groups,
                                                         const std::string& quantization) {
  const int tp = parallel.tensor_parallel, pp = parallel.pipeline_parallel;
  if (static_cast<int>(groups.stages.size()) != pp || groups.world == nullptr ||
      groups.world->size() != tp * pp) {
    return absl::InvalidArgumentError("parallel groups do not match the parallel config");
  }
  if (parallel.micro_batches < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline micro_batches ", parallel.micro_batches, " must be >= 0"));
  }
  ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::Load(dir));
  RETURN_IF_ERROR(CheckTensorParallel(config, tp));
  RETURN_IF_ERROR(CheckPipelineParallel(config, pp));
  RETURN_IF_ERROR(CheckFitsInMemory(config, dir));
  ASSIGN_OR_RETURN(const QuantConfig quant, QuantConfig::Resolve(dir, quantization));
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsCheckpoint> checkpoint,
                   SafetensorsCheckpoint::Open(dir));
  const absl::Time start = Clock::Real()->Now();
  std::vector<ParallelModel::Rank> ranks;
  for (int s = 0; s < pp; ++s) {
    const StageLayers stage = StageOf(config.num_layers, pp, s);
    ModelConfig rank_config = ShardConfig(config, tp);
    rank_config.num_layers = stage.count;
    for (int r = 0; r < tp; ++r) {
      const int rank = s * tp + r;
      ParallelModel::Rank out;
      out.num_layers = stage.count;
      if (tp > 1) out.tp_comm = groups.stages[s]->ForRank(r);
      if (pp > 1) out.world_comm = groups.world->ForRank(rank);
      const GroupRank place{.tp_comm = out.tp_comm.get(),
                            .samples = stage.last_stage && r == 0,
                            .pp_comm = out.world_comm.get(),
                            .prev_stage_rank = stage.first_stage ? -1 : rank - tp,
                            .next_stage_rank = stage.last_stage ? -1 : rank + tp};
      std::unique_ptr<Ops> ops = MakeRefOps();
      ASSIGN_OR_RETURN(ModelWeights weights, LoadWeights(*checkpoint, config, ops->compute_dtype(),
                                                         TensorShard{r, tp}, stage, quant));
      ASSIGN_OR_RETURN(out.model, LlamaModel::Create(rank_config, std::move(weights),
                                                     std::move(ops), Backend::kCpu, place));
      ranks.push_back(std::move(out));
    }
  }
  LOG(INFO) << "loaded " << dir << " on the cpu backend, tensor_parallel " << tp
            << " x pipeline_parallel " << pp << ", in "
            << absl::FormatDuration(
                   absl::Trunc(Clock::Real()->Now() - start, absl::Milliseconds(1)))
            << ": " << config.model_type
            << (quant.quantized() ? ", weights " + quant.Describe() : std::string());
  std::vector<CommGroupHandle> handles = groups.Handles();
  return std::unique_ptr<Model>(std::make_unique<ParallelModel>(
      config, parallel, Backend::kCpu, std::move(handles), std::move(ranks)));
}

absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& dir, Backend backend,
                                                 const std::string& quantization) {
  return LoadModel(dir, backend, ParallelConfig{}, quantization);
}

absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& dir, Backend backend,
                                                 const ParallelConfig& parallel,
                                                 const std::string& quantization) {
  if (parallel.tensor_parallel < 1 || parallel.pipeline_parallel < 1) {
    return absl::InvalidArgumentError(absl::StrCat("tensor_parallel ", parallel.tensor_parallel,
                                                   " and pipeline_parallel ",
                                                   parallel.pipeline_parallel, " must be >= 1"));
  }
  if (parallel.micro_batches < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline micro_batches ", parallel.micro_batches, " must be >= 0"));
  }
  if (parallel.tensor_parallel > 1 || parallel.pipeline_parallel > 1) {
    if (backend == Backend::kCuda) return LoadCudaParallelModel(dir, parallel, {}, quantization);
    ASSIGN_OR_RETURN(ParallelGroups groups, ParallelGroups::Create(parallel));
    return LoadParallelModel(dir, parallel, std::move(groups), quantization);
  }
  ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::Load(dir));
  ASSIGN_OR_RETURN(const QuantConfig quant, QuantConfig::Resolve(dir, quantization));
  std::unique_ptr<Ops> ops;
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
