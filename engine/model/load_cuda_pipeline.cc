// LoadCudaPipelineModel (cuda_rank_groups.h): pipeline stages of tensor-parallel ranks on the
// CUDA backend — the CPU loader's layout (LoadParallelModel, load_model.cc) over CUDA ranks, each
// on its device with its own CudaOps, reading only its stage's layers and its slices of them.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "engine/cuda/cuda_group.h"
#include "engine/model/cuda_rank_groups.h"
#include "engine/model/device_placement.h"
#include "engine/model/llama_model.h"
#include "engine/model/quant_config.h"
#include "engine/model/safetensors.h"
#include "engine/model/tensor_shard.h"
#include "engine/model/weights.h"

namespace tandem {
namespace {

// A group's communicators: every group (kept alive with the model, aborted together), and each
// rank's share of them, [rank].
struct RankComms {
  std::vector<CommGroupHandle> handles;
  std::vector<std::unique_ptr<Communicator>> tp;     // its stage's TP group; null at TP 1
  std::vector<std::unique_ptr<Communicator>> world;  // the stage-to-stage transfers
};

absl::StatusOr<RankComms> MakeRankComms(const ParallelConfig& p, const std::vector<int>& devices,
                                        const std::vector<void*>& streams,
                                        const CudaGroupOptions& options) {
  const int tp = p.tensor_parallel, pp = p.pipeline_parallel;
  RankComms c;
  c.tp.resize(static_cast<size_t>(tp) * pp);
  for (int s = 0; s < pp && tp > 1; ++s) {
    const std::vector<int> stage_devices(devices.begin() + s * tp, devices.begin() + (s + 1) * tp);
    const std::vector<void*> stage_streams(streams.begin() + s * tp,
                                           streams.begin() + (s + 1) * tp);
    ASSIGN_OR_RETURN(DeviceGroup g,
                     MakeDeviceGroup(stage_devices, stage_streams, options,
                                     absl::StrCat("stage ", s, "'s tensor-parallel ranks"),
                                     options.on_peer_group));
    for (int r = 0; r < tp; ++r) c.tp[s * tp + r] = std::move(g.comms[r]);
    c.handles.push_back(std::move(g.handle));
  }
  ASSIGN_OR_RETURN(DeviceGroup world, MakeDeviceGroup(devices, streams, options,
                                                      "pipeline stages' ranks (stage to stage)",
                                                      options.on_peer_world_group));
  c.world = std::move(world.comms);
  c.handles.push_back(std::move(world.handle));
  return c;
}

// Rank `rank` (stage rank / TP, TP rank rank % TP) on `device`, its weights (its stage's layers,
// its slices, in `quant`'s format) read onto it.
absl::StatusOr<ParallelModel::Rank> LoadRank(const SafetensorsCheckpoint& checkpoint,
                                             const ModelConfig& config, const QuantConfig& quant,
                                             const ParallelConfig& p, int rank, int device,
                                             CudaRankOps ops, RankComms& comms) {
  const int tp = p.tensor_parallel;
  const StageLayers stage = StageOf(config.num_layers, p.pipeline_parallel, rank / tp);
  ModelConfig rank_config = ShardConfig(config, tp);
  rank_config.num_layers = stage.count;
  RETURN_IF_ERROR(SetCudaDevice(device));  // the rank's weights go to its GPU
  ParallelModel::Rank out;
  out.num_layers = stage.count;
  out.device = device;
  out.enter = [device] { return SetCudaDevice(device); };
  out.tp_comm = std::move(comms.tp[rank]);
  out.world_comm = std::move(comms.world[rank]);
  const GroupRank place{.tp_comm = out.tp_comm.get(),
                        .samples = stage.last_stage && rank % tp == 0,
                        .pp_comm = out.world_comm.get(),
                        .prev_stage_rank = stage.first_stage ? -1 : rank - tp,
                        .next_stage_rank = stage.last_stage ? -1 : rank + tp};
  ASSIGN_OR_RETURN(ModelWeights weights, LoadWeights(checkpoint, config, DType::kBF16,
                                                     TensorShard{rank % tp, tp}, stage, quant));
  ASSIGN_OR_RETURN(out.model, LlamaModel::Create(rank_config, std::move(weights),
                                                 std::move(ops.ops), Backend::kCuda, place));
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> LoadCudaPipelineModel(const std::string& dir,
                                                             const ParallelConfig& parallel,
                                                             const CudaGroupOptions& options,
                                                             const std::string& quantization) {
  const int tp = parallel.tensor_parallel, pp = parallel.pipeline_parallel, n = tp * pp;
  if (parallel.micro_batches < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline micro_batches ", parallel.micro_batches, " must be >= 0"));
  }
  ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::Load(dir));
  RETURN_IF_ERROR(CheckCudaSupports(config, dir));
  RETURN_IF_ERROR(CheckTensorParallel(config, tp));
  RETURN_IF_ERROR(CheckPipelineParallel(config, pp));
  ASSIGN_OR_RETURN(const QuantConfig quant, QuantConfig::Resolve(dir, quantization));
  ASSIGN_OR_RETURN(
      const std::vector<int> devices,
      PlaceRanksOnDevices(n, parallel.devices, CudaDeviceCount(), parallel.allow_device_sharing));
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsCheckpoint> checkpoint,
                   SafetensorsCheckpoint::Open(dir));
  const absl::Time start = Clock::Real()->Now();
  std::vector<CudaRankOps> ops(n);
  std::vector<void*> streams;
  for (int r = 0; r < n; ++r) {
    ASSIGN_OR_RETURN(ops[r], MakeCudaRankOps(devices[r]));
    streams.push_back(ops[r].stream);
  }
  ASSIGN_OR_RETURN(RankComms comms, MakeRankComms(parallel, devices, streams, options));
  std::vector<ParallelModel::Rank> ranks;
  for (int r = 0; r < n; ++r) {
    ASSIGN_OR_RETURN(ParallelModel::Rank rank, LoadRank(*checkpoint, config, quant, parallel, r,
                                                        devices[r], std::move(ops[r]), comms));
    ranks.push_back(std::move(rank));
  }
  RETURN_IF_ERROR(SetCudaDevice(devices[0]));
  LOG(INFO) << "loaded " << dir << " on the cuda backend, tensor_parallel " << tp
            << " x pipeline_parallel " << pp << " on GPUs [" << absl::StrJoin(devices, ", ")
            << "], in "
            << absl::FormatDuration(
                   absl::Trunc(Clock::Real()->Now() - start, absl::Milliseconds(1)))
            << ": " << config.model_type
            << (quant.quantized() ? ", weights " + quant.Describe() : std::string());
  auto model = std::make_unique<ParallelModel>(config, parallel, Backend::kCuda,
                                               std::move(comms.handles), std::move(ranks));
  if (!OnOneDevice(devices) || options.split_kv_pool) {
    model->SetSplitPoolAllocator([devices](const std::vector<int64_t>& slices) {
      return AllocateSplitDevicePool(devices, slices);
    });
  }
  return std::unique_ptr<Model>(std::move(model));
}

}  // namespace tandem
