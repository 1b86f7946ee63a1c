// LlamaModel: the Llama-family decoder (Llama 2/3.x, Mistral, Qwen2/2.5, Qwen3) as a Model, on
// any Ops backend. Per layer, for the T new tokens of a step (activations in the backend's
// compute dtype; CPU: fp32, CUDA: bf16):
//
//   h        = RmsNorm(residual, input_layernorm)              (layer 0: residual = embed)
//   qkv      = h · qkv_projᵀ (+ qkv_bias)                     [T, (Hq + 2 Hkv) D]
//   RopeKvStore: QK-norm (Qwen3), rotary on Q and K, K/V stored at slot_mapping
//   attn     = PagedAttention(Q, cache)                        [T, Hq D]
//   residual += attn · o_projᵀ                                 (the GEMM adds in place)
//   h        = RmsNorm(residual, post_attention_layernorm)
//   residual += SiluMul(h · gate_up_projᵀ) · down_projᵀ
//
// where the backend fuses the norm into the GEMM that follows it (Ops::FusesNormIntoGemm: the
// CUDA skinny GEMM at batch 1, opt-in), h is never stored; then h = RmsNorm(residual, norm), and
// logits = h[logits_rows] · lm_headᵀ (fp32) only for the rows asked for, which the sampler
// (device_sampler.h) turns into tokens on the backend.
//
// Steps that are all decodes (one token per sequence) up to the largest captured batch size
// replay a CUDA graph of the whole step — forward and sampling — captured at Prepare for the
// next size up (padding sequences store nothing and sample greedily); other steps (prefill
// chunks, mixed batches, the CPU backend, --enforce-eager) run op by op.
//
// Tensor parallelism (parallel_model.h): a LlamaModel is then one rank, built with its
// slice of the weights and ShardConfig's head counts (tensor_shard.h). The residual stream is
// replicated: after o_proj and after down_proj every rank holds a partial sum over its heads /
// features, rank 0 adding it into the residual and the others writing it over theirs, and one
// in-place all-reduce of the residual gives every rank residual + Σ partials. Only the sampling
// rank computes the final norm, the logits and the tokens; the others end after the last layer.
// A tensor-parallel rank captures its own graphs (ParallelModel::Prepare runs every rank's
// Prepare at once, on its thread): the warm-up run's all-reduces are ordinary calls, the
// captured run's go through Communicator::EnqueueAllReduceSum (NCCL's enqueue-only call, or the
// peer group's device barriers: comm/group/peer_communicator.h), so a replay all-reduces the
// same fixed step buffers with the peers' replays of the same graph; the sampling rank's graph
// samples, the others' end after the last layer. Each replay is bracketed by the
// communicator's BeginGraphReplay (the group's status, the graph's collectives counted as calls)
// and EndGraphReplay (what the device reported). A pipeline stage's rank runs eagerly (Prepare
// refuses graph sizes there: Send / Recv go through a host mailbox).
// Pipeline parallelism: a LlamaModel is then one stage's rank, holding the layers of its stage
// (config.num_layers of them); a stage after the first receives the residual stream instead of
// embedding the tokens, a stage before the last sends it on after its last layer.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "comm/group/communicator.h"
#include "engine/model/device_sampler.h"
#include "engine/model/model.h"
#include "engine/model/ops.h"
#include "engine/model/weights.h"

namespace tandem {

// A rank's place in its worker group (parallel_model.h); the default is a model of its own.
// Communicators outlive the model.
struct GroupRank {
  Communicator* tp_comm = nullptr;  // its tensor-parallel group's; null at TP 1
  bool samples = true;              // computes the logits and samples them
  // Pipeline parallelism: the group-wide communicator, and the ranks this stage receives the
  // residual stream from and sends it to (-1: the first / last stage, which embeds / samples).
  Communicator* pp_comm = nullptr;
  int prev_stage_rank = -1;
  int next_stage_rank = -1;
};

class LlamaModel final : public Model {
 public:
  // Hands every weight to `ops` (AdoptWeight) and builds the rotary inverse frequencies.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(const ModelConfig& config,
                                                            ModelWeights weights,
                                                            std::unique_ptr<Ops> ops,
                                                            Backend backend, GroupRank tp = {});

  const ModelConfig& config() const override { return config_; }
  Backend backend() const override { return backend_; }
  // CPU: fp32, bf16 and fp8 pools; CUDA: bf16 and fp8 (the kernels' cache dtypes).
  bool SupportsKvDtype(DType dtype) const override {
    return dtype == DType::kBF16 || dtype == DType::kF8E4M3 ||
           (dtype == DType::kF32 && backend_ == Backend::kCpu);
  }
  absl::StatusOr<StepOutput> Step(const StepInputs& inputs, const KvLayout& layout,
                                  void* kv_pool) override;
  // On CUDA a launched step is queued on the backend's stream (Model::Launch); Collect reads the
  // sampled block back, which waits for it.
  bool SupportsAsyncSteps() const override { return backend_ == Backend::kCuda; }
  absl::Status Launch(const StepInputs& inputs, const KvLayout& layout, void* kv_pool) override;
  absl::StatusOr<StepOutput> Collect() override;
  // Eager (no graph), calling `hook` after each layer's KV store (Ops::RecordKvEvent).
  absl::StatusOr<StepOutput> StepWithLayerHook(const StepInputs& inputs, const KvLayout& layout,
                                               void* kv_pool, const LayerStoredHook& hook) override;
  absl::Status ComputeLogits(const StepInputs& inputs, const KvLayout& layout, void* kv_pool,
                             float* logits) override;
  absl::StatusOr<std::unique_ptr<DeviceAllocation>> AllocateKvPool(int64_t bytes) override;
  absl::StatusOr<DeviceMemoryInfo> MemoryInfo() override { return ops_->MemoryInfo(); }
  absl::Status ReserveStep(const StepCapacity& capacity) override;
  absl::Status Prepare(const ModelPrepareOptions& options, const KvLayout& layout,
                       void* kv_pool) override;

  // Batch sizes with a captured graph (ascending).
  std::vector<int> graph_sizes() const;
  // Steps that replayed a graph so far (a rank that does not sample counts its replays too).
  int64_t graph_replays() const { return graph_replays_; }

 private:
  // Device addresses of one layer's weights (null where absent).
  struct Layer {
    const void* qkv_proj = nullptr;
    const void* qkv_bias = nullptr;
    const void* o_proj = nullptr;
    const void* q_norm = nullptr;
    const void* k_norm = nullptr;
    const void* gate_up_proj = nullptr;
    const void* down_proj = nullptr;
    const void* input_layernorm = nullptr;
    const void* post_attention_layernorm = nullptr;
  };
  // The activation buffers of a step of `tokens` rows and `rows` logits rows.
  struct Activations {
    void* residual;  // [T, H] the residual stream (o_proj and down_proj add into it in place)
    void* hidden;    // [T, H] normalised input of the next projection (unless the norm is fused)
    void* qkv;       // [T, (Hq + 2 Hkv) D]
    void* attn;      // [T, Hq D]
    void* gate_up;   // [T, 2 I]
    void* act;       // [T, I]
    void* gathered;  // [R, H] final hidden states of the logits rows
    float* logits;   // [R, V] fp32
  };
  // A decode graph replays steps of up to `batch` one-token sequences, padded by the backend to
  // batch; a verify graph (verify = true) steps of up to `batch` sequences that sample each of
  // their at most tokens_per_seq new tokens, padded on the host (step_padding.h) to `seqs`
  // sequences and `tokens` tokens.
  struct Graph {
    int batch = 0;
    int handle = 0;
    bool verify = false;
    int tokens_per_seq = 1;
    int seqs = 0;
    int64_t tokens = 0;
    int64_t collectives = 0;  // tensor-parallel all-reduces captured in it
  };
  // The prompt logprob rows of a step (StepInputs::prompt_logprob_rows) on the backend: `in`
  // holds rows | targets | top counts ([3, rows] int32), `out` the results, laid out as
  //   token_logprobs [rows] f32 | top_tokens [rows, kMaxTopLogprobs] i32 |
  //   top_logprobs [rows, kMaxTopLogprobs] f32
  struct PromptBlock {
    int32_t* in = nullptr;
    void* out = nullptr;
    int64_t rows = 0;

    static int64_t OutBytes(int64_t rows) { return rows * (1 + 2 * kMaxTopLogprobs) * 4; }
    float* token_logprobs() const { return static_cast<float*>(out); }
    int32_t* top_tokens() const { return reinterpret_cast<int32_t*>(token_logprobs() + rows); }
    float* top_logprobs() const {
      return reinterpret_cast<float*>(top_tokens() + rows * kMaxTopLogprobs);
    }
  };
  // A step launched and not yet collected: where its sampled block is and what to read back.
  struct Launched {
    SampledBlock out;
    int64_t rows = 0;  // real logits rows
    bool logprobs = false;
    bool graph_replayed = false;
    PromptBlock prompt;  // rows 0: none
  };

  LlamaModel(const ModelConfig& config, std::unique_ptr<Ops> ops, Backend backend, GroupRank tp)
      : config_(config), ops_(std::move(ops)), backend_(backend), tp_(tp) {}
  absl::Status AdoptWeights(ModelWeights weights);
  absl::StatusOr<Activations> GetActivations(int64_t tokens, int64_t rows);
  absl::StatusOr<SampledBlock> GetSampledBlock(int64_t rows);
  absl::StatusOr<PromptBlock> GetPromptBlock(int64_t rows);
  // Prompt logprobs: the step's prompt rows copied to the backend (before its forward pass, so
  // that the copy's synchronisation waits for nothing; rows 0 when it has none, or on a rank
  // that does not sample); after the forward pass (and the sampler, whose logits buffers it
  // reuses), the log-softmax of those rows' raw logits (Logprobs of the targets, with their top
  // alternatives); and the results read back.
  absl::StatusOr<PromptBlock> UploadPromptRows(const StepInputs& inputs);
  absl::Status PromptLogprobs(const DeviceStep& step, const PromptBlock& prompt);
  absl::Status ReadPromptLogprobs(const PromptBlock& prompt, StepOutput* out);

  // The forward pass over a step already on the device: returns its logits rows.
  absl::StatusOr<float*> Forward(const DeviceStep& step, const KvLayout& layout, void* kv_pool);
  // fused_norm: the layer's norms run inside the QKV / gate-up GEMMs (Ops::FusesNormIntoGemm).
  absl::Status Attention(int layer, const DeviceStep& step, const Activations& b,
                         const KvLayout& layout, void* kv_pool, bool fused_norm);
  absl::Status Mlp(int layer, int64_t num_tokens, const Activations& b, bool fused_norm);
  absl::Status Logits(const DeviceStep& step, const Activations& b);
  // A row-parallel projection into the residual stream: GEMM, then (TP > 1) the all-reduce.
  absl::Status RowParallel(GemmArgs gemm, int64_t num_tokens);
  GemmArgs Linear(const void* a, const void* w, void* c, int64_t m, int64_t n, int64_t k) const;
  // Makes `gemm` read the residual stream and normalise it on the fly with `norm_weight`.
  void FuseNorm(GemmArgs& gemm, const void* residual, const void* norm_weight) const;
  RmsNormArgs Norm(const void* input, void* residual, const void* weight, void* out,
                   int64_t rows) const;

  // The graph that runs `inputs`, or null (eager).
  const Graph* GraphFor(const StepInputs& inputs, const KvLayout& layout, void* kv_pool) const;
  absl::Status CaptureGraph(int batch, const KvLayout& layout, void* kv_pool);
  // Captures the step begun as `d` (after one eager run of it) into graph->handle, counting its
  // collectives.
  absl::Status Capture(const DeviceStep& d, const KvLayout& layout, void* kv_pool, Graph* graph);
  // Replays `graph`; a tensor-parallel rank checks its group around it (communicator.h).
  absl::Status ReplayGraph(const Graph& graph);
  const Graph* VerifyGraphFor(const StepInputs& inputs, const KvLayout& layout,
                              void* kv_pool) const;
  absl::Status CaptureVerifyGraph(int batch, int tokens_per_seq, const KvLayout& layout,
                                  void* kv_pool);

  ModelConfig config_;
  std::unique_ptr<Ops> ops_;
  // Set only for the duration of a StepWithLayerHook: Forward reports each layer to it.
  const LayerStoredHook* layer_hook_ = nullptr;
  Backend backend_;
  GroupRank tp_;
  const void* embed_tokens_ = nullptr;
  const void* norm_ = nullptr;
  const void* lm_head_ = nullptr;  // == embed_tokens_ when tied
  std::vector<Layer> layers_;
  const float* inv_freq_ = nullptr;  // device, [head_dim / 2]
  StepCapacity capacity_;            // zero until ReserveStep
  // Graphs, ascending by batch, all captured over graph_pool_ / graph_layout_.
  std::vector<Graph> graphs_;
  std::vector<Graph> verify_graphs_;  // ascending by batch
  StepInputs padded_;                 // the last verify-padded step (outlives its BeginStep)
  void* graph_pool_ = nullptr;
  KvLayout graph_layout_;
  int64_t graph_replays_ = 0;
  int64_t collectives_ = 0;  // all-reduces made so far (RowParallel), captured ones included
  bool capturing_ = false;   // RowParallel enqueues its all-reduce for a capture
  std::optional<Launched> launched_;
};

}  // namespace tandem
