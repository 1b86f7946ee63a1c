// TensorParallelModel: a Model whose layers are split over the ranks of one worker group,
// Megatron style (tensor_shard.h says which slice each rank holds; llama_model.h how a rank's
// forward pass all-reduces the residual stream after o_proj and down_proj). The engine sees
// one Model; inside, each step runs on one thread per rank in lockstep (rank_threads.h), over
// an in-process communicator (comm/group/thread_communicator.h). CPU backend only for now.
//
// Sampling: rank 0 alone computes the final norm, the lm_head (loaded on rank 0 only) and the
// tokens; the others stop after the last layer. Embeddings are replicated on every rank.
//
// KV pool: each rank has its own pool of its KV heads (its slice, or the one head it shares
// with TP / Hkv - 1 other ranks when TP > Hkv), with the same page ids. The engine allocates the
// ranks' pools as one, stacked:
//     [rank][layer][page][K|V][kv head of the rank][page_size][head_dim]
// which is exactly the KvLayout of num_layers = TP · L and num_kv_heads = the rank's heads
// (KvPoolLayout): rank r's pool starts at layer r · L. A page id names the same page of every
// rank, the allocator and prefix cache need nothing else, and a KV transfer between groups of
// the same TP moves every rank's page bytes; groups of different TP have different page shapes
// and the transport refuses the pair (comm/kv_wire.h SamePageShape).
//
// Failures: a step's inputs are validated once before any rank starts (a bad batch is
// InvalidArgument, the group stays usable). A rank that fails after that aborts the group's
// communicator, so no peer waits in a collective; the step then returns Internal (the backend
// is unusable: the engine ends every request) and so does every later step.
//
// Thread-compatible: one engine loop calls it.
#pragma once

#include <memory>
#include <vector>

#include "comm/group/communicator.h"
#include "comm/group/thread_communicator.h"
#include "engine/model/model.h"
#include "engine/model/rank_threads.h"

namespace tandem {

class TensorParallelModel final : public Model {
 public:
  // `ranks[r]` is rank r's decoder (ShardConfig's heads; rank 0 samples), built over
  // `comms[r]`, rank r's communicator of `group`.
  TensorParallelModel(const ModelConfig& config, std::shared_ptr<ThreadCommGroup> group,
                      std::vector<std::unique_ptr<Communicator>> comms,
                      std::vector<std::unique_ptr<Model>> ranks);
  ~TensorParallelModel() override;

  const ModelConfig& config() const override { return config_; }
  Backend backend() const override { return Backend::kCpu; }
  KvLayout KvPoolLayout(int page_size) const override;
  absl::StatusOr<StepOutput> Step(const StepInputs& inputs, const KvLayout& layout,
                                  void* kv_pool) override;
  absl::Status ComputeLogits(const StepInputs& inputs, const KvLayout& layout, void* kv_pool,
                             float* logits) override;
  absl::Status ReserveStep(const StepCapacity& capacity) override;
  absl::Status Prepare(const ModelPrepareOptions& options, const KvLayout& layout,
                       void* kv_pool) override;

  int tensor_parallel() const { return static_cast<int>(ranks_.size()); }

 private:
  // Checks the group's layout and the inputs, and gives rank r's layout.
  absl::StatusOr<KvLayout> RankLayout(const StepInputs& inputs, const KvLayout& layout) const;
  void* RankPool(void* kv_pool, const KvLayout& rank_layout, int rank) const;
  // Runs fn(rank) on every rank; a rank that fails aborts the group. Internal when any failed.
  absl::Status RunRanks(const std::function<absl::Status(int)>& fn);

  ModelConfig config_;        // the whole model's
  ModelConfig shard_config_;  // one rank's (ShardConfig)
  std::shared_ptr<ThreadCommGroup> group_;
  std::vector<std::unique_ptr<Communicator>> comms_;  // [rank]; outlive ranks_
  std::vector<std::unique_ptr<Model>> ranks_;
  RankThreads threads_;  // last: joined first
};

// Builds a TP = group->size() model of the checkpoint in `dir` on the CPU backend over `group`
// (tests pass a group they inject faults into; LoadModel makes a fresh one). Each rank reads
// only its slices. InvalidArgument when the model does not split over that many ranks.
absl::StatusOr<std::unique_ptr<Model>> LoadTensorParallelModel(
    const std::string& dir, std::shared_ptr<ThreadCommGroup> group);

}  // namespace tandem
