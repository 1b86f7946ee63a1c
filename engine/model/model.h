// Model: one step of a decoder over a ragged batch — the forward pass, reading and writing the
// paged KV cache, and the sampling of each logits row — on one backend. Implementations: the
// Llama-family decoder over engine/model/ops.h (CPU reference kernels or CUDA), and test fakes.
// Thread-compatible: one engine loop calls it at a time.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/model/model_config.h"
#include "engine/model/ops.h"
#include "engine/model/step_inputs.h"
#include "kernels/common/kv_layout.h"

namespace tandem {

// Called during a step after layer `layer`'s KV is stored (engine/kv_push.h): `event` is a
// backend completion marker recorded after the layer's KV store (CUDA: a cudaEvent_t on the
// compute stream), null when the store has already happened.
using LayerStoredHook = std::function<void(int layer, void* event)>;

// What the engine decides at start-up and the model prepares for once the KV pool exists.
struct ModelPrepareOptions {
  StepCapacity capacity;
  // Decode batch sizes to capture a CUDA graph for (ascending); empty: run every step eagerly.
  std::vector<int> cuda_graph_sizes;
  // Speculative decoding's 1 + k: for each size b above (b + 1 <= max_seqs and b * (1 + k) + 1
  // within the step capacity) a graph of verify steps is captured too, which replays any step
  // whose sequences sample every new token (decodes and verify chunks of up to 1 + k tokens);
  // 0: none.
  int verify_tokens_per_seq = 0;
};

// How a model is spread over ranks inside one worker group.
struct ParallelConfig {
  // Ranks the layers' heads and features are split over (parallel_model.h); CPU and CUDA.
  int tensor_parallel = 1;
  // Stages the layers are split over, each of tensor_parallel ranks; CPU and CUDA.
  int pipeline_parallel = 1;
  // With pipeline_parallel > 1: steps (micro-batches, of disjoint sequences) in flight at once,
  // so the stages overlap (parallel_model.h); 0: pipeline_parallel; 1: one at a time (the
  // stages run one after another).
  int micro_batches = 0;
  // CUDA: each rank's device, in rank order (empty: rank r on device r mod the visible count),
  // and whether ranks may share a GPU (device_placement.h).
  std::vector<int> devices = {};
  bool allow_device_sharing = false;
};

class Model {
 public:
  virtual ~Model() = default;

  virtual const ModelConfig& config() const = 0;
  virtual Backend backend() const { return Backend::kCpu; }
  // The page layout (kernels/common/kv_layout.h) of the KV pool the engine allocates for this
  // model, num_pages left 0 for the engine to size: the config's layers and KV heads, fp32
  // pages for an fp32 model and bf16 otherwise. A tensor-parallel group stacks its ranks'
  // pools as more layers of fewer heads (parallel_model.h).
  virtual KvLayout KvPoolLayout(int page_size) const;
  // Whether Step can run a pool of `dtype` pages (EngineOptions::kv_cache_dtype). The default:
  // only KvPoolLayout's own dtype.
  virtual bool SupportsKvDtype(DType dtype) const { return dtype == KvPoolLayout(1).dtype; }

  // Runs the decoder on `inputs` (storing each new token's K/V at its slot of `kv_pool`, laid out
  // as `layout`: kernels/common/kv_layout.h) and samples each logits row with inputs.sampling.
  // Only the tokens (and logprobs where asked) come back.
  //
  // Errors say whether the batch or the backend is at fault (IsBackendUnusable below):
  //   InvalidArgument (or any code but Internal): this batch cannot run — inconsistent inputs
  //     (a token id out of range, a slot outside the pool). The engine fails the batch's
  //     requests and keeps serving.
  //   Internal: the backend is unusable and every later call would fail too — a sticky device
  //     error (an illegal memory access poisons the CUDA context), a lost device. The engine
  //     stops (engine/engine.h, Step()). base/cuda_check.h returns Internal for every CUDA,
  //     cuBLAS and NCCL failure, so a backend that checks its calls with it gets this for free;
  //     a failure known to be confined to one batch must use another code.
  virtual absl::StatusOr<StepOutput> Step(const StepInputs& inputs, const KvLayout& layout,
                                          void* kv_pool);
  // Step in two halves, so that the host can prepare the next step while the device runs this
  // one (the engine's async scheduling): Launch queues the step of `inputs` and returns without
  // waiting for the device; Collect waits for the oldest launched step and returns what Step
  // would have. At most MaxStepsInFlight() launched steps are not yet collected; until a step
  // is, nothing may change the KV pages it reads or writes (those of its sequences), and steps
  // in flight together are of disjoint sequences (no step writes a page another one reads or
  // writes). Launch errors are Step's (a failed Launch queues nothing); Collect fails with
  // FailedPrecondition when nothing was launched. By default (backends that compute on the
  // host: SupportsAsyncSteps() false, nothing would overlap) Launch runs the whole step and
  // Collect hands its output over.
  virtual bool SupportsAsyncSteps() const { return false; }
  // More than 1: a pipeline of stages that overlap consecutive steps (ParallelModel with
  // pipeline_parallel > 1: one micro-batch per stage); the engine keeps that many in flight.
  virtual int MaxStepsInFlight() const { return 1; }
  virtual absl::Status Launch(const StepInputs& inputs, const KvLayout& layout, void* kv_pool);
  virtual absl::StatusOr<StepOutput> Collect();
  // Step, calling `hook` once per layer in order as that layer's KV is stored (never from a
  // CUDA graph: such a step runs eagerly). The default runs Step and then reports every layer
  // (a model that cannot report layers while it computes; its KV is stored when Step returns).
  virtual absl::StatusOr<StepOutput> StepWithLayerHook(const StepInputs& inputs,
                                                       const KvLayout& layout, void* kv_pool,
                                                       const LayerStoredHook& hook);

  // The forward pass only: fp32 logits of inputs.logits_rows into host `logits`,
  // [logits_rows.size(), vocab_size] row-major (tests and numerics checks). Errors as Step's.
  virtual absl::Status ComputeLogits(const StepInputs& inputs, const KvLayout& layout,
                                     void* kv_pool, float* logits) = 0;

  // Device memory for the KV pool (backends whose pool is not host memory; the engine allocates
  // host pools itself), and what the device has free (CPU: unknown, {0, 0}).
  virtual absl::StatusOr<std::unique_ptr<DeviceAllocation>> AllocateKvPool(int64_t bytes) {
    return absl::UnimplementedError("this model's KV pool lives in host memory");
  }
  virtual absl::StatusOr<DeviceMemoryInfo> MemoryInfo() { return DeviceMemoryInfo{}; }
  // Reserves the step buffers for the largest step (fixed addresses from then on); called before
  // the KV pool is sized, so that what it takes is not counted as free.
  virtual absl::Status ReserveStep(const StepCapacity& capacity) { return absl::OkStatus(); }
  // Whether Prepare captures CUDA graphs; false (pipeline stages, the CPU parallel group: every
  // step runs eagerly): the engine passes it no graph sizes.
  virtual bool SupportsCudaGraphs() const { return true; }
  // Once the KV pool exists: captures the CUDA graphs of options.cuda_graph_sizes over it.
  virtual absl::Status Prepare(const ModelPrepareOptions& options, const KvLayout& layout,
                               void* kv_pool) {
    return absl::OkStatus();
  }

 private:
  std::optional<StepOutput> launched_;  // the default Launch's output, until Collect
};

// Samples host logits rows ([inputs.logits_rows.size(), vocab_size]) with the CPU reference
// kernels, as the default Model::Step does after ComputeLogits; `logits` is processed in place.
absl::StatusOr<StepOutput> SampleOnHost(const StepInputs& inputs, int64_t vocab_size,
                                        float* logits);

// The prompt logprobs of inputs.prompt_logprob_rows (StepInputs) through ComputeLogits, at most
// `rows_per_call` rows per call (each call runs the forward pass again and stores the same KV),
// then the reference Logprobs into out->prompt_*: Model's default Step (a model that only
// computes logits), and the engine's steps sampled on the host (drawn proposals to verify).
absl::Status PromptLogprobsViaLogits(Model& model, const StepInputs& inputs, const KvLayout& layout,
                                     void* kv_pool, int64_t rows_per_call, StepOutput* out);

// True for a model (or sampler) error that means the backend can run nothing any more.
inline bool IsBackendUnusable(const absl::Status& status) {
  return status.code() == absl::StatusCode::kInternal;
}

// Loads config.json and the safetensors weights of the Hugging Face folder `dir`.
// NotFound / InvalidArgument / Unimplemented with a message naming the file or tensor at fault.
// With parallel.tensor_parallel or pipeline_parallel > 1 each rank reads only its slice of the
// weights (tensor_shard.h) and its stage's layers, and the model is a ParallelModel (on both
// backends). `quantization` (--quantization: "", "fp8", "int8" or
// "int4") is applied to an unquantized checkpoint at load time; a checkpoint with a
// quantization_config is read in its format either way (quant_config.h). Quantized weights run on
// both backends (CUDA: engine/cuda/cuda_ops.h, Gemm), with tensor and pipeline parallelism too
// (each rank reads and quantizes only its slices: quant_shard.h says where a format can be cut).
absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& dir, Backend backend,
                                                 const ParallelConfig& parallel = {},
                                                 const std::string& quantization = "");
absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& dir, Backend backend,
                                                 const std::string& quantization);

}  // namespace tandem
