// Ops: the backend seam of a step. The Llama-family model is written once against this
// interface; RefOps runs the CPU reference kernels (kernels/*/<op>_ref.cc) on host memory, and
// CudaOps (engine/cuda/) runs the CUDA kernels on device memory with the same args structs.
//
// Every pointer handed to an op is "device" memory of this backend: a weight adopted with
// AdoptWeight, a Buffer, the step's inputs from BeginStep, or the KV pool. For RefOps, device
// memory is host memory.
//
// A step on any backend (plan once per step, run once per layer):
//   BeginStep(inputs)      one upload of the step's index arrays and sampling rows; attention plan
//   Embedding ... Gemm     the layers, each op a kernel on the backend's stream
//   LogitsProcess, Logprobs, Sampling    on the device: only token ids come back
//   CopyToHost             the sampled tokens (the only synchronisation of a step)
// On backends with graphs the ops between BeginStep and CopyToHost can be captured once per
// batch size (BeginCapture / EndCapture) and replayed (Replay) with the next step's inputs:
// every address they use is fixed after ReserveStep.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/model/step_inputs.h"
#include "engine/model/weights.h"
#include "kernels/common/kv_layout.h"
#include "kernels/embedding/embedding.h"
#include "kernels/gemm/gemm.h"
#include "kernels/logits_process/logits_process.h"
#include "kernels/logprobs/logprobs.h"
#include "kernels/paged_attention/paged_attention.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rope_kv_store/rope_kv_store.h"
#include "kernels/sampling/sampling.h"
#include "kernels/silu_mul/silu_mul.h"

namespace tandem {

// The most a step may hold; a backend reserves its step buffers for this once (ReserveStep).
struct StepCapacity {
  int64_t max_tokens = 0;  // new tokens per step (max_num_batched_tokens, >= max_seqs)
  int max_seqs = 0;        // sequences per step
  // Logits rows per step: max_seqs, or more when a speculative verify step samples 1 + k rows
  // per sequence (engine/spec). 0 means max_seqs.
  int max_rows = 0;
  int max_pages_per_seq = 0;       // block-table stride: ceil(max_model_len / page_size)
  int64_t max_history_tokens = 0;  // penalty histories, all rows together
  int64_t max_bias_entries = 0;    // logit biases, all rows together
  // The model's heads (the attention plans are built for them).
  int num_q_heads = 0;
  int num_kv_heads = 0;
};

// A step's inputs where the backend put them: device pointers (host pointers on RefOps) that
// stay valid until the next BeginStep. Arrays have the padded sizes (num_tokens, num_rows);
// block_tables has a fixed stride on backends with graphs.
inline int64_t MaxRows(const StepCapacity& c) { return c.max_rows > 0 ? c.max_rows : c.max_seqs; }

struct DeviceStep {
  int num_seqs = 0;         // the real sequences (attention is planned for these)
  int num_decode_seqs = 0;  // the first num_decode_seqs have one new token each
  int64_t num_tokens = 0;   // activation rows, padding included
  int64_t num_rows = 0;     // logits rows, padding included
  int block_table_stride = 0;
  const int32_t* token_ids = nullptr;     // [num_tokens]
  const int32_t* positions = nullptr;     // [num_tokens]
  const int32_t* slot_mapping = nullptr;  // [num_tokens]; -1 on padding: nothing stored
  const int32_t* query_start = nullptr;   // [num_seqs + 1]
  const int32_t* seq_lens = nullptr;      // [num_seqs]
  const int32_t* block_tables = nullptr;  // [num_seqs, block_table_stride]
  const int32_t* logits_rows = nullptr;   // [num_rows]
  // Sampling rows, structure of arrays [num_rows] (padding rows: greedy, nothing else).
  const float* temperature = nullptr;
  const int32_t* top_k = nullptr;
  const float* top_p = nullptr;
  const float* min_p = nullptr;
  const uint64_t* seeds = nullptr;
  const uint64_t* steps = nullptr;
  const float* repetition_penalty = nullptr;
  const float* frequency_penalty = nullptr;
  const float* presence_penalty = nullptr;
  const int32_t* num_logprobs = nullptr;
  const int32_t* history_tokens = nullptr;
  const int32_t* history_start = nullptr;       // [num_rows + 1]
  const int32_t* num_prompt_history = nullptr;  // [num_rows]
  const int32_t* bias_tokens = nullptr;
  const float* bias_values = nullptr;
  const int32_t* bias_start = nullptr;  // [num_rows + 1]
  // Host-side facts about the rows (eager steps skip what no row needs; graphs run everything).
  bool any_processing = false;
  bool any_logprobs = false;
  bool any_top_k = false;
};

// Device memory of a backend, freed with the object.
class DeviceAllocation {
 public:
  virtual ~DeviceAllocation() = default;
  virtual void* data() = 0;
  virtual int64_t bytes() const = 0;
};

struct DeviceMemoryInfo {
  int64_t free_bytes = 0;  // on the device now, whoever else uses it
  int64_t total_bytes = 0;
  // What this backend holds: its allocations (weights, step buffers, plans, library
  // workspaces) and an allowance for its CUDA context and loaded modules. Other processes on
  // the same GPU (a prefill and a decode worker sharing one) are not counted.
  int64_t own_bytes = 0;
};

class Ops {
 public:
  virtual ~Ops() = default;

  // The dtype of activations and adopted weights this backend computes in.
  virtual DType compute_dtype() const = 0;

  // Takes ownership of a host weight tensor and returns its device address, valid for the
  // lifetime of this Ops (RefOps keeps the host bytes; CUDA copies them and frees the host copy).
  virtual absl::StatusOr<const void*> AdoptWeight(HostTensor tensor) = 0;
  // Scratch buffer number `id`, at least `bytes` long. Grows on demand (contents then lost) until
  // Freeze(); after it, a buffer keeps its address and asking for more is InternalError (a step
  // beyond the capacity reserved at start-up is a bug).
  virtual absl::StatusOr<void*> Buffer(int id, int64_t bytes) = 0;
  virtual void Freeze() = 0;
  virtual absl::Status CopyToDevice(void* dst, const void* src, int64_t bytes) = 0;
  // Waits for the backend's work so far, then copies (the step's one synchronisation).
  virtual absl::Status CopyToHost(void* dst, const void* src, int64_t bytes) = 0;

  // Memory for the KV pool (zero-filled), and what the device has (RefOps: {0, 0}: unknown).
  virtual absl::StatusOr<std::unique_ptr<DeviceAllocation>> Allocate(int64_t bytes) = 0;
  virtual absl::StatusOr<DeviceMemoryInfo> MemoryInfo() = 0;

  // --- one step ---
  // Reserves the step buffers for `capacity` (fixed addresses from then on).
  virtual absl::Status ReserveStep(const StepCapacity& capacity) = 0;
  // Moves `inputs` (already validated) to the device, padded to `pad_seqs` decode sequences
  // when pad_seqs > inputs.num_seqs (a graph's batch size: each padding sequence has one token
  // that stores nothing and one greedy logits row), and plans this step's attention.
  virtual absl::StatusOr<DeviceStep> BeginStep(const StepInputs& inputs, const KvLayout& layout,
                                               int pad_seqs) = 0;

  virtual absl::Status Embedding(const EmbeddingArgs& args) = 0;
  virtual absl::Status RmsNorm(const RmsNormArgs& args) = 0;
  virtual absl::Status Gemm(const GemmArgs& args) = 0;
  // Whether Gemm() takes GemmArgs::a_norm_weight (the RMSNorm fused into the GEMM) for `rows`
  // activation rows; the model then runs no separate RmsNorm before QKV and gate-up. CUDA: the
  // batch-1 skinny GEMM (TANDEM_FUSED_NORM=1), and FP8 W8A8 steps of more than 4 tokens
  // (TANDEM_FUSED_ACT_QUANT=1: the norm and the e4m3 quantization as one kernel).
  virtual bool FusesNormIntoGemm(int64_t rows) const { return false; }
  virtual absl::Status RopeKvStore(const RopeKvStoreArgs& args) = 0;
  // Over the sequences of the last BeginStep (its plan).
  virtual absl::Status PagedAttention(const PagedAttentionArgs& args) = 0;
  virtual absl::Status SiluMul(const SiluMulArgs& args) = 0;
  virtual absl::Status LogitsProcess(const LogitsProcessArgs& args) = 0;
  virtual absl::Status Logprobs(const LogprobsArgs& args) = 0;
  virtual absl::Status Sampling(const SamplingArgs& args) = 0;

  // --- graphs (backends that have them) ---
  // Layer-wise KV push (engine/kv_push.h): a completion marker for everything enqueued so far
  // (the KV store of layer `layer`), or null when it has already run (the CPU reference). CUDA:
  // a cudaEvent_t recorded on the compute stream, one per layer, re-recorded step after step.
  virtual absl::StatusOr<void*> RecordKvEvent(int layer) { return nullptr; }
  virtual bool SupportsGraphs() const { return false; }
  // True when the step begun last must run op by op even if a graph could replay it (the CUDA
  // backend's op profile, TANDEM_OP_PROFILE, times each op of the steps it samples).
  virtual bool WantsEagerStep() const { return false; }
  // Ops called between BeginCapture and EndCapture are recorded, not run; EndCapture returns a
  // handle for Replay. Graphs live as long as this Ops.
  virtual absl::Status BeginCapture() { return absl::UnimplementedError("no graphs"); }
  virtual absl::StatusOr<int> EndCapture() { return absl::UnimplementedError("no graphs"); }
  virtual absl::Status Replay(int graph) { return absl::UnimplementedError("no graphs"); }
};

// The CPU reference backend: fp32 activations, ops multi-threaded through ParallelFor.
std::unique_ptr<Ops> MakeRefOps();
// The CUDA backend on the current device (engine/cuda/): bf16 activations and weights.
// Unimplemented in a build without CUDA; FailedPrecondition without a device.
absl::StatusOr<std::unique_ptr<Ops>> MakeCudaOps();

}  // namespace tandem
