// CudaOps: the CUDA backend behind engine/model/ops.h. One stream per engine; weights in bf16,
// uploaded once (quantized linear weights in the canonical layout of
// kernels/quant_gemm/quant_gemm.h: see Gemm below); every buffer the step uses (activations, the
// step's input arrays, the attention plans, the sampler's outputs) allocated once for the largest
// step (ReserveStep), so a CUDA graph captured over one step replays with the next. Every CUDA call
// is checked: a CUDA error is absl::StatusCode::kInternal (the backend is unusable after a sticky
// error; the engine stops).
//
// A step's inputs travel in one host-to-device copy (cuda_step.cc): BeginStep packs the index
// arrays, the sampling rows and both attention plans (decode kernel for the leading one-token
// sequences, prefill kernel for the rest) into a pinned buffer (two, alternating, so the next
// step can be packed while this one's copy is in flight), copies it, and one Unpack kernel
// (kernels/unpack/) scatters it into the fixed arrays.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <set>
#include <vector>

#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "engine/cuda/fused_act_quant.h"
#include "engine/cuda/quant_tc_mode.h"
#include "engine/model/ops.h"
#include "kernels/paged_attention/attention_plan.h"
#include "kernels/quant_gemm/fp8_gemm_lt.h"
#include "kernels/quant_gemm/quant_gemm.h"
#include "kernels/unpack/unpack.h"

namespace tandem {

// The one place the CUDA backend decides whether an FP8 W8A8 GEMM of m rows on a weight the
// cuBLASLt FP8 path covers (Fp8LtCovers, at adoption) runs there (Fp8GemmLt: e4m3 activations,
// FP8 tensor cores, scales in cuBLASLt's epilogue) instead of the paths of CudaOps::Gemm below:
// every m the skinny kernel does not serve (m > kQuantSkinnyMaxM, or a shape it does not cover).
// Tune here (e.g. from kb_bench's fp8 section, which times both sides at m = 1..8192).
inline bool UseFp8Lt(int64_t m, bool skinny_covers) {
  return m > kQuantSkinnyMaxM || !skinny_covers;
}

class CudaOps final : public Ops {
 public:
  static absl::StatusOr<std::unique_ptr<CudaOps>> Create();
  ~CudaOps() override;

  DType compute_dtype() const override { return DType::kBF16; }
  // The stream every op and copy of this backend runs on (created on the device current at
  // Create; a tensor-parallel rank's communicator orders its collectives on it).
  cudaStream_t stream() const { return stream_; }
  absl::StatusOr<const void*> AdoptWeight(HostTensor tensor) override;
  absl::StatusOr<void*> Buffer(int id, int64_t bytes) override;
  void Freeze() override { frozen_ = true; }
  absl::Status CopyToDevice(void* dst, const void* src, int64_t bytes) override;
  absl::Status CopyToHost(void* dst, const void* src, int64_t bytes) override;
  absl::StatusOr<std::unique_ptr<DeviceAllocation>> Allocate(int64_t bytes) override;
  absl::StatusOr<DeviceMemoryInfo> MemoryInfo() override;

  absl::Status ReserveStep(const StepCapacity& capacity) override;
  absl::StatusOr<DeviceStep> BeginStep(const StepInputs& inputs, const KvLayout& layout,
                                       int pad_seqs) override;

  absl::Status Embedding(const EmbeddingArgs& args) override;
  absl::Status RmsNorm(const RmsNormArgs& args) override;
  // A quantized weight (AdoptWeight of a HostTensor with `quant`: codes, fp32 scales and uint4
  // zero points uploaded as they are; its address is that of its codes) runs
  //   FP8 W8A8 on a weight Fp8LtCovers, where UseFp8Lt says so (prefill): Fp8GemmLt
  //     (cuda_ops_fp8.cc; its scales packed and uploaded at adoption, its scratch reserved in
  //     ReserveStep; a cuBLASLt refusal falls back to the paths below, logged once per weight;
  //     TANDEM_FP8_LT=0 turns it off, an A/B switch; TANDEM_FP8_LT=require makes an uncovered
  //     FP8 W8A8 weight or a refusal an error instead, for tests); otherwise
  //   FP8 with dynamic activation scales: QuantizeActivations of a into a scratch buffer first
  //     (W8A8's rounding of the activations; the product itself then runs with bf16 inputs);
  //   with TANDEM_QUANT_GEMV=1 (off by default: measured slower), INT8 / UINT4 at 1 <= m <=
  //     kQuantGemvMaxM on a shape QuantGemvCovers: the tensor-core GEMV (persistent blocks
  //     streaming the codes; quant_tc_mode.h); otherwise
  //   INT8 / UINT4 at kQuantTcMinMDefault (2) <= m <= kQuantTcMaxM (TANDEM_QUANT_TC_MIN_M moves
  //     the lower end, 1 to 5) on a shape QuantGemmTcCovers: the
  //     mixed-input tensor-core GEMM (codes read once, dequantized in registers into the mma
  //     operands, split-K across blocks into its workspace where n gives too few blocks;
  //     quant_tc_mode.h). TANDEM_QUANT_TC=0 turns it off (A/B: the paths below), =1 on (the
  //     default), =require makes such a step it does not cover an error (tests);
  //   m <= kQuantSkinnyMaxM (decode) on a shape QuantGemmSkinny covers: that kernel (dequant
  //     fused; reads only the quantized bytes);
  //   otherwise (prefill, or a shape none covers): QuantDequantize of the whole weight into
  //     a bf16 scratch buffer, then the bf16 Gemm. Correct, not fast: the weight's bytes are read
  //     once more and 2 bytes per weight written and read again.
  // Both scratch buffers are allocated in ReserveStep (the largest quantized weight; max_tokens
  // rows of the largest k), so steps with them capture into graphs.
  absl::Status Gemm(const GemmArgs& args) override;
  // TANDEM_FUSED_NORM=1: batch-1 decode runs the RMSNorm inside the skinny GEMM
  // (GemmArgs::a_norm_weight) instead of as its own kernel. Off by default: measured slower in a
  // graph-replayed step (kernels/gemm/WORKLOG.md, step 8): the one-block norm kernel is where the
  // next GEMM prefetches its first weights on idle SMs. Kept as an A/B switch, like
  // TANDEM_OP_PROFILE.
  // Never with quantized weights on that switch (the skinny quantized kernel takes no
  // a_norm_weight).
  // TANDEM_FUSED_ACT_QUANT=1 (fused_act_quant.h; 0 off, the default until measured faster,
  // "require" for tests): steps of more than kQuantSkinnyMaxM tokens on FP8 W8A8 weights run the
  // norm inside the QKV and gate-up GEMMs, as one RMSNorm + e4m3 quantization kernel writing the
  // cuBLASLt FP8 GEMM's scratch (kernels/rmsnorm/rmsnorm_quant.h) instead of RmsNorm + the
  // GEMM's own quantizer; a GEMM given the norm on another path runs it into the activation
  // scratch first (the same numbers).
  bool FusesNormIntoGemm(int64_t rows) const override {
    return (fuse_norm_ && quant_.empty() && GemmFusesNorm(rows)) ||
           FusesNormForFp8Activations(fused_act_quant_, !fp8_lt_.empty(), act_scratch_ != nullptr,
                                      rows);
  }
  absl::Status RopeKvStore(const RopeKvStoreArgs& args) override;
  absl::Status PagedAttention(const PagedAttentionArgs& args) override;
  absl::Status SiluMul(const SiluMulArgs& args) override;
  absl::Status LogitsProcess(const LogitsProcessArgs& args) override;
  absl::Status Logprobs(const LogprobsArgs& args) override;
  absl::Status Sampling(const SamplingArgs& args) override;

  absl::StatusOr<void*> RecordKvEvent(int layer) override;
  bool SupportsGraphs() const override { return true; }
  bool WantsEagerStep() const override { return profiling_; }
  absl::Status BeginCapture() override;
  absl::StatusOr<int> EndCapture() override;
  absl::Status Replay(int graph) override;

 private:
  // The fixed device homes of a step's inputs (DeviceStep points into these).
  struct StepArrays {
    int32_t* token_ids = nullptr;  // [max_tokens]
    int32_t* positions = nullptr;
    int32_t* slot_mapping = nullptr;
    int32_t* query_start = nullptr;   // [max_seqs + 1]
    int32_t* seq_lens = nullptr;      // [max_seqs]
    int32_t* block_tables = nullptr;  // [max_seqs, max_pages_per_seq]
    int32_t* logits_rows = nullptr;   // [max_seqs]
    float* temperature = nullptr;     // [max_seqs] each, down to bias_start
    int32_t* top_k = nullptr;
    float* top_p = nullptr;
    float* min_p = nullptr;
    uint64_t* seeds = nullptr;
    uint64_t* steps = nullptr;
    float* repetition_penalty = nullptr;
    float* frequency_penalty = nullptr;
    float* presence_penalty = nullptr;
    int32_t* num_logprobs = nullptr;
    int32_t* history_tokens = nullptr;  // [max_history_tokens]
    int32_t* history_start = nullptr;   // [max_seqs + 1]
    int32_t* num_prompt_history = nullptr;
    int32_t* bias_tokens = nullptr;  // [max_bias_entries]
    float* bias_values = nullptr;
    int32_t* bias_start = nullptr;  // [max_seqs + 1]
  };

  CudaOps() = default;
  absl::StatusOr<void*> DeviceAlloc(int64_t bytes);  // freed with this object
  absl::Status AllocateStepArrays();
  // Packs the step into builder_ (cuda_step.cc).
  absl::Status Pack(const StepInputs& in, int page_size, int pad_seqs, int num_decode,
                    DeviceStep* d);
  absl::Status Upload();
  absl::StatusOr<const void*> AdoptQuantized(const QuantizedWeight& w);
  absl::Status QuantGemm(const GemmArgs& args, const QuantGemmArgs& w);
  // cuda_ops_fp8.cc: the cuBLASLt FP8 path's adoption, scratch and call (true: done; false:
  // take the other paths).
  absl::Status AdoptFp8Lt(const QuantizedWeight& host, const QuantGemmArgs& device);
  absl::Status ReserveFp8Lt(int64_t max_tokens);
  // With args.a_norm_weight: the fused RMSNorm + quantization (rmsnorm_quant.h) fills the scratch
  // (false when it does not cover the norm: the caller runs NormIntoScratch first).
  absl::StatusOr<bool> TryFp8Lt(const GemmArgs& args, const QuantGemmArgs& w);
  // A GEMM given a_norm_weight on a path that does not fuse it: the RMSNorm of args.a into the
  // activation scratch (the bf16 values RmsNorm writes), and args pointing at it without the norm.
  absl::StatusOr<GemmArgs> NormIntoScratch(const GemmArgs& args);

  // Op profile: with TANDEM_OP_PROFILE=N, every N-th step runs op by op with a CUDA event pair
  // around each op, and its table (per op and shape: count, total time, share of the step) is
  // logged when the step's tokens are read back.
  // `name()` is called only while profiling (the hot path builds no strings).
  template <typename N, typename F>
  absl::Status Timed(N&& name, F&& launch);
  void LogProfile();

  bool fuse_norm_ = false;
  FusedActQuant fused_act_quant_ = kFusedActQuantDefault;
  QuantTc quant_tc_ = kQuantTcDefault;
  int64_t quant_tc_min_m_ = kQuantTcMinMDefault;  // TANDEM_QUANT_TC_MIN_M
  int quant_tc_splits_ = 0;              // QuantGemmArgs::tc_splits from TANDEM_QUANT_TC_SPLIT
  bool quant_gemv_ = kQuantGemvDefault;  // TANDEM_QUANT_GEMV
  int profile_every_ = 0;
  int64_t num_steps_ = 0;
  bool profiling_ = false;
  struct OpEvents {
    std::string name;
    cudaEvent_t start = nullptr, end = nullptr;
  };
  std::vector<OpEvents> op_events_;  // reused step after step
  size_t num_op_events_ = 0;         // used this step

  // Device memory this backend allocated (weights, buffers, step arrays, the upload buffer),
  // for MemoryInfo().own_bytes.
  int64_t allocated_bytes_ = 0;

  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> kv_events_;  // RecordKvEvent's, one per layer (created on first use)
  std::vector<void*> allocations_;      // weights and step arrays
  std::map<int, std::pair<void*, int64_t>> buffers_;  // id -> (address, bytes)
  bool frozen_ = false;
  StepCapacity capacity_;
  StepArrays arrays_;
  std::unique_ptr<AttentionPlan> decode_plan_;
  std::unique_ptr<AttentionPlan> prefill_plan_;
  // The current step's split (BeginStep): sequences [0, num_decode_) run the decode kernel,
  // [num_decode_, num_seqs_) the prefill kernel.
  int num_seqs_ = 0;
  int num_decode_ = 0;
  UnpackBuilder builder_;
  // Pinned staging, two slots used in turn; a slot is refilled once its copy has completed.
  uint8_t* staging_[2] = {nullptr, nullptr};
  int64_t staging_bytes_[2] = {0, 0};
  cudaEvent_t staging_done_[2] = {nullptr, nullptr};
  int next_slot_ = 0;
  void* upload_ = nullptr;  // device copy of the packed buffer (grows; never captured)
  int64_t upload_bytes_ = 0;
  std::vector<cudaGraphExec_t> graphs_;

  // Quantized weights by the device address of their codes (scales, zeros: device pointers).
  std::map<const void*, QuantGemmArgs> quant_;
  int64_t quant_max_weight_elems_ = 0;  // the largest n * k among them (dequant scratch)
  int64_t quant_max_act_k_ = 0;         // the largest k among those with act_quant
  void* dequant_scratch_ = nullptr;     // [quant_max_weight_elems_] bf16 (ReserveStep)
  void* act_scratch_ = nullptr;         // [max_tokens, quant_max_act_k_] bf16 (ReserveStep)
  // QuantGemmTc's split-K workspace (quant_gemm.h): sized at adoption for every automatic plan of
  // every INT8 / UINT4 weight at m <= kQuantTcMaxM, allocated in ReserveStep (counters zeroed).
  int64_t quant_tc_partial_floats_ = 0;
  int64_t quant_tc_counters_ = 0;
  QuantTcWorkspace quant_tc_workspace_ = {};
  int64_t act_scratch_rows_ = 0;
  // FP8 weights the cuBLASLt FP8 path serves, by the address of their codes (packed scales).
  bool fp8_lt_enabled_ = true;
  bool fp8_lt_required_ = false;
  std::map<const void*, Fp8LtWeight> fp8_lt_;
  std::set<const void*> fp8_lt_refused_;  // weights whose fallback was logged
  int64_t fp8_lt_max_n_ = 0, fp8_lt_max_k_ = 0;
  void* fp8_lt_scratch_ = nullptr;  // Fp8LtScratchBytes(max_tokens, max k, max n) (ReserveStep)
  int64_t fp8_lt_scratch_bytes_ = 0;
};

// Runs `launch`; while profiling, between a pair of events named `name()` on the stream.
template <typename N, typename F>
inline absl::Status CudaOps::Timed(N&& name, F&& launch) {
  if (!profiling_) return launch();
  if (num_op_events_ == op_events_.size()) {
    OpEvents e;
    CUDA_RETURN_IF_ERROR(cudaEventCreate(&e.start));
    CUDA_RETURN_IF_ERROR(cudaEventCreate(&e.end));
    op_events_.push_back(e);
  }
  OpEvents& e = op_events_[num_op_events_++];
  e.name = name();
  CUDA_RETURN_IF_ERROR(cudaEventRecord(e.start, stream_));
  RETURN_IF_ERROR(launch());
  CUDA_RETURN_IF_ERROR(cudaEventRecord(e.end, stream_));
  return absl::OkStatus();
}

}  // namespace tandem
