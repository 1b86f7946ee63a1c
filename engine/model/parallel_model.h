// ParallelModel: a Model spread over the ranks of one worker group — tensor parallelism
// (Megatron style: tensor_shard.h says which slice each rank holds, llama_model.h how a rank
// all-reduces the residual stream after o_proj and down_proj) and pipeline parallelism (stage s
// holds a contiguous range of layers, StageOf; the residual stream goes from each stage's TP
// rank r to the next stage's rank r). The engine sees one Model; inside, each step runs on one
// thread per rank, each rank running the queued steps in order (rank_threads.h), over in-process
// communicators (comm/group/thread_communicator.h): one per stage for its TP ranks, one group-wide
// for the stage-to-stage transfers. Rank numbering: stage s, TP rank r is rank s · TP + r.
//
// CUDA ranks (LoadCudaParallelModel; pipeline stages: LoadCudaPipelineModel, cuda_rank_groups.h):
// each rank is a LlamaModel over its own CudaOps on its own device (device_placement.h: TP · PP
// ranks over the devices, several sharing one GPU only when the user allows it), its thread
// keeping that device current (Rank::enter before every call, setup calls included: ReserveStep,
// MemoryInfo, AllocateKvPool), its weights (its stage's layers, its slices of them) read onto it.
// Each communicator group (a stage's TP ranks; the group-wide one of the stage-to-stage
// transfers) is NCCL (comm/group/nccl_communicator.h, blocking calls on the ranks' compute
// streams) when each of its ranks has a GPU of its own, else the in-process peer communicator
// (comm/group/peer_communicator.h: enqueue-only all-reduces, bitwise the CPU group's sums, and
// Send / Recv through staging slots and per-pair FIFO mailboxes, so a stage's thread enqueues
// micro-batch k + 1 without waiting for the next stage to take micro-batch k). TP alone runs one
// step at a time, PP keeps micro-batches in flight as below.
//
// CUDA graphs (TP alone, PP = 1): each rank's KV pool and CUDA graphs are its own. Prepare runs
// every rank's LlamaModel::Prepare at once, each on its thread, so each rank captures its own
// decode (and verify) graphs over its slice of the pool, the captured all-reduces rendezvousing
// with the peers' captures (Communicator::EnqueueAllReduceSum: NCCL's enqueue-only call, or the
// peer communicator's device barriers, kernels/peer_barrier/, whose epochs the kernel advances
// itself so a replay takes no host argument). The buffers a graph all-reduces are each rank's
// fixed step buffers (ReserveStep reserved them once, before Prepare), so the addresses the
// peer group exchanged at capture hold at every replay. The ranks decide graph or eager from
// the same inputs, so they replay in the same steps (Step checks they did, GraphSteps counts
// them); the sampling rank's graph samples, the others' end after their last layer. A replay
// is bracketed by the communicator's BeginGraphReplay (a failed group, or an injected fault due
// among the graph's collectives: the rank does not replay, fails, and the group's abort
// releases the peers' spinning barriers) and EndGraphReplay (NCCL: the stream waited for under
// the deadline; the peer group: the barriers' error words). After every step the group's status
// is checked again (a barrier that gave up fails the step and every later one). Pipeline stages
// (PP > 1) stay eager: SupportsCudaGraphs is false and Prepare refuses graph sizes, because the
// stage-to-stage Send / Recv go through host-side mailboxes consulted per message (the peer
// group) or blocking NCCL calls; capturing them needs a device-side mailbox, not built. The CPU
// backend has no graphs.
//
// A caveat of the peer group's replays: between one rank's replay launch and its peers', that
// rank's barrier spins on the device. A device-wide synchronising call from another thread in
// that window (cudaDeviceSynchronize, an implicitly synchronising cudaFree) waits for the peers'
// launches; nothing in a step makes one, and at worst the barrier's deadline ends the wait.
//
// Sampling: TP rank 0 of the last stage alone computes the final norm, the lm_head (loaded on
// that rank only) and the tokens; the other ranks stop after their last layer. Embeddings are
// on every rank of the first stage (and on the sampling rank for tied embeddings).
//
// Micro-batches in flight (PP > 1): Launch queues a step on every rank (RankThreads::Submit)
// and returns; up to MaxStepsInFlight() (ParallelConfig::micro_batches, default PP) launched
// steps are queued at once, each rank running them in launch order, so stage s runs micro-batch
// k + 1 while stage s + 1 runs micro-batch k (the residual stream of each goes through the
// group-wide communicator's per-pair FIFO mailboxes, so the transfers of consecutive
// micro-batches cannot cross). Collect returns the oldest. The engine only puts disjoint
// sequences into steps in flight together (engine/engine_impl.h); a synchronous Step or
// ComputeLogits queues behind them. TP alone (PP 1) runs every step synchronously.
//
// KV pool: each rank has its own pool of its stage's layers and its KV heads (its slice, or the
// one head it shares with TP / Hkv - 1 other ranks when TP > Hkv), with the same page ids. The
// engine allocates the ranks' pools as one, stacked in rank order:
//     [rank][layer of its stage][page][K|V][kv head of the rank][page_size][head_dim]
// which is exactly the KvLayout of num_layers = TP · L and num_kv_heads = the rank's heads
// (KvPoolLayout). CUDA ranks on one GPU: the pool is one allocation on it, each rank's slice in
// its stacked place; ranks on several GPUs: one address range whose slices live on their ranks'
// GPUs (a split pool, AllocateSplitDevicePool in engine/cuda/cuda_group.h), so the engine, the
// allocator and the KV transports still see one pool of the stacked layout. A page id names the
// same page of every rank, the allocator and prefix cache need nothing else, and a KV transfer
// between groups of the same TP and PP moves every rank's page bytes; between groups of different
// TP or PP the TCP transport maps pages by layers and KV-head ranges (comm/kv_head_map.h mirrors
// this stacking: keep the two in step).
//
// Failures: a step's inputs are validated once before any rank starts (a bad batch is
// InvalidArgument, the group stays usable). A rank that fails after that aborts every
// communicator of the group, so no peer waits in a collective or a receive; the step then
// returns Internal (the backend is unusable: the engine ends every request) and so does every
// later step. A fault with several micro-batches in flight fails every one of them (their
// ranks find the communicators aborted): each Collect returns Internal.
//
// Thread-compatible: one engine loop calls it.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "comm/group/communicator.h"
#include "comm/group/peer_communicator.h"
#include "comm/group/thread_communicator.h"
#include "engine/model/model.h"
#include "engine/model/rank_threads.h"

namespace tandem {

// One communicator group of a parallel group, whatever its kind: kept alive with the model, and
// aborted with the others when a rank fails.
struct CommGroupHandle {
  std::shared_ptr<void> owner;
  std::function<void(const absl::Status&)> abort;
  std::function<absl::Status()> status;

  template <typename Group>
  static CommGroupHandle Of(std::shared_ptr<Group> group) {
    Group* g = group.get();
    return CommGroupHandle{std::move(group), [g](const absl::Status& s) { g->Abort(s); },
                           [g] { return g->status(); }};
  }
};

// A group's communicators: one per stage for its TP ranks (each of TP ranks), one for the
// whole group (PP · TP ranks) for the stage-to-stage transfers. Tests inject faults into them.
// In-process threads (CPU backend); CUDA ranks get NCCL or peer groups from
// LoadCudaParallelModel instead.
struct ParallelGroups {
  std::vector<std::shared_ptr<ThreadCommGroup>> stages;  // [stage]
  std::shared_ptr<ThreadCommGroup> world;

  // Fresh groups for `parallel` (every size >= 1).
  static absl::StatusOr<ParallelGroups> Create(const ParallelConfig& parallel,
                                               ThreadCommOptions options = {});
  std::vector<CommGroupHandle> Handles() const;
};

class ParallelModel final : public Model {
 public:
  // One rank of the group: its decoder (ShardConfig's heads, its stage's layers) and the
  // communicators it was built over (they outlive it).
  struct Rank {
    std::unique_ptr<Communicator> tp_comm;
    std::unique_ptr<Communicator> world_comm;
    std::unique_ptr<Model> model;
    int num_layers = 0;  // of its stage
    int device = -1;     // CUDA: its GPU; CPU: -1
    // Run on the rank's thread before each call on `model` (CUDA: makes `device` current); null:
    // nothing to do.
    std::function<absl::Status()> enter;
  };
  // `ranks` in rank order (stage s, TP rank r at s · tp + r), all on `backend`; `groups`: every
  // communicator group the ranks' communicators belong to.
  ParallelModel(const ModelConfig& config, const ParallelConfig& parallel, Backend backend,
                std::vector<CommGroupHandle> groups, std::vector<Rank> ranks);
  ~ParallelModel() override;

  const ModelConfig& config() const override { return config_; }
  Backend backend() const override { return backend_; }
  KvLayout KvPoolLayout(int page_size) const override;
  bool SupportsKvDtype(DType dtype) const override {
    return ranks_.front().model->SupportsKvDtype(dtype);
  }
  absl::StatusOr<StepOutput> Step(const StepInputs& inputs, const KvLayout& layout,
                                  void* kv_pool) override;
  bool SupportsAsyncSteps() const override { return parallel_.pipeline_parallel > 1; }
  int MaxStepsInFlight() const override;
  absl::Status Launch(const StepInputs& inputs, const KvLayout& layout, void* kv_pool) override;
  absl::StatusOr<StepOutput> Collect() override;
  absl::Status ComputeLogits(const StepInputs& inputs, const KvLayout& layout, void* kv_pool,
                             float* logits) override;
  // CUDA ranks: one pool on their GPU, or the split pool (SetSplitPoolAllocator), the ranks'
  // slices stacked (the file comment). CPU: the engine allocates host memory.
  absl::StatusOr<std::unique_ptr<DeviceAllocation>> AllocateKvPool(int64_t bytes) override;
  // The ranks' devices combined (CombineRankMemory, device_placement.h).
  absl::StatusOr<DeviceMemoryInfo> MemoryInfo() override;
  absl::Status ReserveStep(const StepCapacity& capacity) override;
  // CUDA tensor parallelism alone (PP 1) over capturable communicators (NCCL, the peer group):
  // each rank captures and replays its own graphs (the file comment). CPU, and PP > 1: eager.
  bool SupportsCudaGraphs() const override;
  absl::Status Prepare(const ModelPrepareOptions& options, const KvLayout& layout,
                       void* kv_pool) override;

  // How the pool of CUDA ranks on several GPUs is allocated, from each rank's slice bytes
  // ([rank]); once set it is used even for ranks on one GPU. Set before the engine is made.
  using SplitPoolAllocator = std::function<absl::StatusOr<std::unique_ptr<DeviceAllocation>>(
      const std::vector<int64_t>& slice_bytes)>;
  void SetSplitPoolAllocator(SplitPoolAllocator allocate) { split_pool_ = std::move(allocate); }

  // Test hooks. `hook` is called on TP rank 0 of each stage as it starts its part of a launched
  // step (micro-batch ids count launches from 0), after the stage is marked busy; a test may
  // block in it to hold a stage. Set before the first step.
  using StageHook = std::function<void(int stage, int64_t micro_batch)>;
  void SetStageStartHookForTesting(StageHook hook) { stage_hook_ = std::move(hook); }
  // The most stages seen running distinct micro-batches (launched steps) at the same time.
  int MaxBusyStages() const;
  // Steps that every rank ran as a CUDA graph replay.
  int64_t GraphSteps() const;

 private:
  struct Flight;  // a launched step
  // Checks the group's layout and the inputs (InvalidArgument).
  absl::Status Validate(const StepInputs& inputs, const KvLayout& layout) const;
  // Rank r's layout and pool within the group's.
  KvLayout RankLayout(const KvLayout& layout, int rank) const;
  void* RankPool(void* kv_pool, const KvLayout& layout, int rank) const;
  // The rank that samples: TP rank 0 of the last stage.
  int sampling_rank() const {
    return (parallel_.pipeline_parallel - 1) * parallel_.tensor_parallel;
  }
  // Runs fn(rank) on every rank; a rank that fails aborts the group. Internal when any failed.
  absl::Status RunRanks(const std::function<absl::Status(int)>& fn);
  // Runs fn(rank) on every rank's thread for set-up (nothing aborted); the first rank's error.
  absl::Status OnEveryRank(const std::function<absl::Status(int)>& fn);
  absl::Status Enter(int rank) const;
  absl::Status GroupStatus() const;
  void AbortAll(const absl::Status& reason);
  // The group-wide error of failed ranks' `results` (OK when all succeeded).
  absl::Status RanksStatus(const std::vector<absl::Status>& results) const;
  void MarkStage(int stage, int64_t micro_batch);  // -1: idle

  ModelConfig config_;        // the whole model's
  ModelConfig shard_config_;  // one TP rank's heads (ShardConfig)
  ParallelConfig parallel_;
  Backend backend_;
  std::vector<CommGroupHandle> groups_;
  std::vector<Rank> ranks_;
  std::vector<int64_t> first_layer_;  // [rank]: where its pool starts, in the stacked layout
  std::deque<std::shared_ptr<Flight>> launched_;  // oldest first
  int64_t next_micro_batch_ = 0;
  StageHook stage_hook_;
  SplitPoolAllocator split_pool_;
  mutable absl::Mutex stage_mu_;
  std::vector<int64_t> stage_busy_ ABSL_GUARDED_BY(stage_mu_);  // [stage]: micro-batch, or -1
  int max_busy_stages_ ABSL_GUARDED_BY(stage_mu_) = 0;
  int64_t graph_steps_ ABSL_GUARDED_BY(stage_mu_) = 0;
  RankThreads threads_;  // last: joined first
};

// What LoadCudaParallelModel takes beside the ParallelConfig.
struct CudaGroupOptions {
  // How long a rank waits for its peers in a collective (the communicators' deadline).
  absl::Duration timeout = absl::Seconds(60);
  // Tests: called with each tensor-parallel group's peer communicator group once it is made (to
  // inject faults; with pipeline stages, once per stage in stage order); not called for NCCL
  // groups.
  std::function<void(PeerCommGroup&)> on_peer_group = nullptr;
  // Tests: the same for the group-wide communicator of the stage-to-stage transfers
  // (pipeline_parallel > 1).
  std::function<void(PeerCommGroup&)> on_peer_world_group = nullptr;
  // Tests: use the peer communicator even when every rank has a GPU of its own.
  bool force_peer_comm = false;
  // Tests: allocate the KV pool as for ranks on several GPUs (a split pool) even on one.
  bool split_kv_pool = false;
};

// Builds the `parallel` layout of the checkpoint in `dir` on the CUDA backend: rank r on its
// device (PlaceRanksOnDevices over TP · PP ranks with parallel.devices,
// parallel.allow_device_sharing), each reading only its stage's layers and its slices onto its
// GPU (pipeline_parallel > 1: LoadCudaPipelineModel). Quantized weights (the checkpoint's format,
// or `quantization` as LoadModel's) are sliced in their format (quant_shard.h) and uploaded by the
// rank's own CudaOps. InvalidArgument when the model or its quantized weights do not split that
// way (heads, layers, blocks) or the placement is refused; FailedPrecondition without a GPU.
absl::StatusOr<std::unique_ptr<Model>> LoadCudaParallelModel(const std::string& dir,
                                                             const ParallelConfig& parallel,
                                                             const CudaGroupOptions& options = {},
                                                             const std::string& quantization = "");

// Builds the `parallel` layout of the checkpoint in `dir` on the CPU backend over `groups`
// (sizes matching `parallel`; tests pass groups they inject faults into, LoadModel fresh ones).
// Each rank reads only its slices, quantized ones included (`quantization` as LoadModel's;
// quant_shard.h). InvalidArgument when the model or its quantized weights do not split that way.
absl::StatusOr<std::unique_ptr<Model>> LoadParallelModel(const std::string& dir,
                                                         const ParallelConfig& parallel,
                                                         ParallelGroups groups,
                                                         const std::string& quantization = "");

}  // namespace tandem
