#include "engine/model/tensor_parallel_model.h"

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "base/status_macros.h"
#include "engine/model/step_validation.h"
#include "engine/model/tensor_shard.h"

namespace tandem {

TensorParallelModel::TensorParallelModel(const ModelConfig& config,
                                         std::shared_ptr<ThreadCommGroup> group,
                                         std::vector<std::unique_ptr<Communicator>> comms,
                                         std::vector<std::unique_ptr<Model>> ranks)
    : config_(config),
      shard_config_(ShardConfig(config, static_cast<int>(ranks.size()))),
      group_(std::move(group)),
      comms_(std::move(comms)),
      ranks_(std::move(ranks)),
      threads_(static_cast<int>(ranks_.size())) {
  CHECK_EQ(comms_.size(), ranks_.size());
  CHECK_EQ(group_->size(), tensor_parallel());
}

TensorParallelModel::~TensorParallelModel() = default;

KvLayout TensorParallelModel::KvPoolLayout(int page_size) const {
  KvLayout layout = Model::KvPoolLayout(page_size);
  layout.num_layers = config_.num_layers * tensor_parallel();
  layout.num_kv_heads = shard_config_.num_kv_heads;
  return layout;
}

absl::StatusOr<KvLayout> TensorParallelModel::RankLayout(const StepInputs& in,
                                                         const KvLayout& layout) const {
  const KvLayout want = KvPoolLayout(layout.page_size);
  if (layout.num_layers != want.num_layers || layout.num_kv_heads != want.num_kv_heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step inputs: KV layout (layers ", layout.num_layers, ", kv heads ", layout.num_kv_heads,
        ") is not the tensor-parallel group's (", want.num_layers, ", ", want.num_kv_heads, ")"));
  }
  KvLayout rank = layout;
  rank.num_layers = config_.num_layers;
  RETURN_IF_ERROR(ValidateStep(in, shard_config_, rank));
  return rank;
}

void* TensorParallelModel::RankPool(void* kv_pool, const KvLayout& rank_layout, int r) const {
  return static_cast<uint8_t*>(kv_pool) + int64_t{r} * rank_layout.PoolBytes();
}

absl::Status TensorParallelModel::RunRanks(const std::function<absl::Status(int)>& fn) {
  if (absl::Status s = group_->status(); !s.ok()) {
    return absl::InternalError(absl::StrCat("tensor-parallel group is down: ", s.message()));
  }
  const std::vector<absl::Status> results = threads_.Run([&](int r) {
    absl::Status s = fn(r);
    // Peers may be waiting for this rank in a collective: abort them now.
    if (!s.ok()) comms_[r]->Abort(s);
    return s;
  });
  for (int r = 0; r < tensor_parallel(); ++r) {
    if (results[r].ok()) continue;
    // The group's first failure is the cause; the other ranks' errors are its echo.
    const absl::Status cause = group_->status().ok() ? results[r] : group_->status();
    return absl::InternalError(
        absl::StrCat("tensor-parallel rank failed (the group is down): ", cause.ToString()));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepOutput> TensorParallelModel::Step(const StepInputs& in, const KvLayout& layout,
                                                     void* kv_pool) {
  ASSIGN_OR_RETURN(const KvLayout rank_layout, RankLayout(in, layout));
  RETURN_IF_ERROR(ValidateSampling(in, config_));
  StepOutput out;
  RETURN_IF_ERROR(RunRanks([&](int r) -> absl::Status {
    ASSIGN_OR_RETURN(StepOutput o,
                     ranks_[r]->Step(in, rank_layout, RankPool(kv_pool, rank_layout, r)));
    if (r == 0) out = std::move(o);
    return absl::OkStatus();
  }));
  return out;
}

absl::Status TensorParallelModel::ComputeLogits(const StepInputs& in, const KvLayout& layout,
                                                void* kv_pool, float* logits) {
  ASSIGN_OR_RETURN(const KvLayout rank_layout, RankLayout(in, layout));
  // Only rank 0 writes `logits`.
  return RunRanks([&](int r) {
    return ranks_[r]->ComputeLogits(in, rank_layout, RankPool(kv_pool, rank_layout, r), logits);
  });
}

absl::Status TensorParallelModel::ReserveStep(const StepCapacity& capacity) {
  StepCapacity rank = capacity;
  rank.num_q_heads = shard_config_.num_q_heads;
  rank.num_kv_heads = shard_config_.num_kv_heads;
  for (std::unique_ptr<Model>& m : ranks_) RETURN_IF_ERROR(m->ReserveStep(rank));
  return absl::OkStatus();
}

absl::Status TensorParallelModel::Prepare(const ModelPrepareOptions& options,
                                          const KvLayout& layout, void* kv_pool) {
  if (!options.cuda_graph_sizes.empty()) {
    return absl::InvalidArgumentError("a tensor-parallel group runs eagerly (no graphs)");
  }
  return absl::OkStatus();
}

}  // namespace tandem
