// CudaOps (cuda_ops.h): device memory, kernels on the engine's stream, CUDA graphs.
#include "engine/cuda/cuda_ops.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/cuda_check.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "engine/cuda/cuda_device.h"

namespace tandem {
namespace {

class CudaAllocation final : public DeviceAllocation {
 public:
  CudaAllocation(void* data, int64_t bytes) : data_(data), bytes_(bytes) {}
  ~CudaAllocation() override { cudaFree(data_); }  // nothing to report to from a destructor
  void* data() override { return data_; }
  int64_t bytes() const override { return bytes_; }

 private:
  void* data_;
  int64_t bytes_;
};

absl::Status OutOfMemory(int64_t bytes, const char* what) {
  size_t free = 0, total = 0;
  cudaMemGetInfo(&free, &total);
  return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes >> 20, " MiB for ",
                                                   what, " (", free >> 20, " of ", total >> 20,
                                                   " MiB free on the device)"));
}

}  // namespace

bool CudaDeviceAvailable() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return count > 0;
}

absl::Status CopyDeviceMemory(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault));
  return absl::OkStatus();
}

absl::Status WaitKvEvent(void* event) {
  if (event == nullptr) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Ops>> MakeCudaOps() {
  ASSIGN_OR_RETURN(std::unique_ptr<CudaOps> ops, CudaOps::Create());
  return std::unique_ptr<Ops>(std::move(ops));
}

absl::StatusOr<std::unique_ptr<CudaOps>> CudaOps::Create() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear the error the query left
    return absl::FailedPreconditionError("the cuda backend needs a CUDA device; none is visible");
  }
  std::unique_ptr<CudaOps> ops(new CudaOps());
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&ops->stream_, cudaStreamNonBlocking));
  for (cudaEvent_t& e : ops->staging_done_) {
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  // cuBLASLt's handle and workspace: allocation is not allowed under graph capture.
  RETURN_IF_ERROR(GemmInitDevice());
  if (const char* every = std::getenv("TANDEM_OP_PROFILE"); every != nullptr) {
    ops->profile_every_ = std::max(0, std::atoi(every));
  }
  if (const char* fuse = std::getenv("TANDEM_FUSED_NORM"); fuse != nullptr) {
    ops->fuse_norm_ = std::string_view(fuse) == "1";
  }
  ASSIGN_OR_RETURN(ops->fused_act_quant_,
                   ParseFusedActQuant(std::getenv("TANDEM_FUSED_ACT_QUANT")));
  ASSIGN_OR_RETURN(ops->quant_tc_, ParseQuantTc(std::getenv("TANDEM_QUANT_TC")));
  ASSIGN_OR_RETURN(ops->quant_tc_min_m_, ParseQuantTcMinM(std::getenv("TANDEM_QUANT_TC_MIN_M")));
  ASSIGN_OR_RETURN(ops->quant_tc_splits_, ParseQuantTcSplit(std::getenv("TANDEM_QUANT_TC_SPLIT")));
  ASSIGN_OR_RETURN(ops->quant_gemv_, ParseQuantGemv(std::getenv("TANDEM_QUANT_GEMV")));
  if (const char* lt = std::getenv("TANDEM_FP8_LT"); lt != nullptr) {
    ops->fp8_lt_enabled_ = std::string_view(lt) != "0";
    ops->fp8_lt_required_ = std::string_view(lt) == "require";
  }
  ASSIGN_OR_RETURN(ops->decode_plan_, AttentionPlan::Create({}));
  ASSIGN_OR_RETURN(ops->prefill_plan_, AttentionPlan::Create({}));
  return ops;
}

CudaOps::~CudaOps() {
  // Destructors cannot return a Status; failures here mean the context is already gone.
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  for (cudaGraphExec_t g : graphs_) cudaGraphExecDestroy(g);
  for (cudaEvent_t e : kv_events_) cudaEventDestroy(e);
  for (OpEvents& e : op_events_) {
    cudaEventDestroy(e.start);
    cudaEventDestroy(e.end);
  }
  for (void* p : allocations_) cudaFree(p);
  for (auto& [id, buffer] : buffers_) cudaFree(buffer.first);
  cudaFree(upload_);
  for (int i = 0; i < 2; ++i) {
    cudaFreeHost(staging_[i]);
    if (staging_done_[i] != nullptr) cudaEventDestroy(staging_done_[i]);
  }
  decode_plan_.reset();
  prefill_plan_.reset();
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::StatusOr<void*> CudaOps::DeviceAlloc(int64_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 16))) != cudaSuccess) {
    cudaGetLastError();
    return OutOfMemory(bytes, "model state");
  }
  allocations_.push_back(p);
  allocated_bytes_ += std::max<int64_t>(bytes, 16);
  return p;
}

absl::StatusOr<const void*> CudaOps::AdoptWeight(HostTensor tensor) {
  if (tensor.quant != nullptr) return AdoptQuantized(*tensor.quant);
  const int64_t bytes = static_cast<int64_t>(tensor.bytes.size());
  ASSIGN_OR_RETURN(void* p, DeviceAlloc(bytes));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(p, tensor.bytes.data(), bytes, cudaMemcpyHostToDevice));
  return static_cast<const void*>(p);
}

absl::StatusOr<const void*> CudaOps::AdoptQuantized(const QuantizedWeight& w) {
  const int64_t groups = w.num_groups();
  if (w.n < 1 || w.k < 1 || w.group_size < 1 ||
      static_cast<int64_t>(w.codes.size()) != w.n * QuantRowBytes(w.code, w.k) ||
      static_cast<int64_t>(w.scales.size()) != w.n * groups ||
      (!w.zeros.empty() && static_cast<int64_t>(w.zeros.size()) != w.n * groups)) {
    return absl::InvalidArgumentError(absl::StrCat("quantized weight [", w.n, ", ", w.k,
                                                   "]: codes, scales or zeros of the wrong size"));
  }
  auto upload = [&](const void* src, int64_t bytes) -> absl::StatusOr<void*> {
    ASSIGN_OR_RETURN(void* p, DeviceAlloc(bytes));  // cudaMalloc: 256-byte aligned
    CUDA_RETURN_IF_ERROR(cudaMemcpy(p, src, bytes, cudaMemcpyHostToDevice));
    return p;
  };
  ASSIGN_OR_RETURN(void* codes, upload(w.codes.data(), static_cast<int64_t>(w.codes.size())));
  ASSIGN_OR_RETURN(void* scales, upload(w.scales.data(), w.n * groups * int64_t{sizeof(float)}));
  void* zeros = nullptr;
  if (!w.zeros.empty()) {
    ASSIGN_OR_RETURN(zeros, upload(w.zeros.data(), static_cast<int64_t>(w.zeros.size())));
  }
  QuantGemmArgs args = w.Args();
  args.w = static_cast<const uint8_t*>(codes);
  args.scales = static_cast<const float*>(scales);
  args.zeros = static_cast<const uint8_t*>(zeros);
  quant_[codes] = args;
  RETURN_IF_ERROR(AdoptFp8Lt(w, args));
  quant_max_weight_elems_ = std::max(quant_max_weight_elems_, w.n * w.k);
  quant_tc_partial_floats_ =
      std::max(quant_tc_partial_floats_, QuantGemmTcWorkspaceFloats(args, kQuantTcMaxM));
  quant_tc_counters_ = std::max(quant_tc_counters_, QuantGemmTcWorkspaceCounters(w.n));
  if (w.act_quant != ActQuant::kNone) quant_max_act_k_ = std::max(quant_max_act_k_, w.k);
  return static_cast<const void*>(codes);
}

absl::StatusOr<void*> CudaOps::Buffer(int id, int64_t bytes) {
  auto& [ptr, size] = buffers_[id];
  if (size >= bytes && ptr != nullptr) return ptr;
  if (frozen_) {
    return absl::InternalError(absl::StrCat("step buffer ", id, " needs ", bytes,
                                            " bytes, beyond the ", size, " reserved at start-up"));
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));  // the old buffer may still be in use
  cudaFree(ptr);
  allocated_bytes_ -= size;
  ptr = nullptr;
  size = 0;
  if (cudaMalloc(&ptr, static_cast<size_t>(bytes)) != cudaSuccess) {
    cudaGetLastError();
    ptr = nullptr;
    return OutOfMemory(bytes, "activations");
  }
  // Zeroed once: rows a graph's padding never writes (attention outputs of padding sequences)
  // then hold finite values.
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(ptr, 0, bytes, stream_));
  size = bytes;
  allocated_bytes_ += bytes;
  return ptr;
}

absl::Status CudaOps::CopyToDevice(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return absl::OkStatus();
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaOps::CopyToHost(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0) {
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  }
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  if (profiling_) LogProfile();
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DeviceAllocation>> CudaOps::Allocate(int64_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 16))) != cudaSuccess) {
    cudaGetLastError();
    return OutOfMemory(bytes, "the KV pool");
  }
  auto allocation = std::make_unique<CudaAllocation>(p, bytes);
  // Zeroed on the compute stream and waited for: the stream is non-blocking (a plain cudaMemset
  // on the legacy stream would not order before the first step), and the pool may be exported
  // to another process (CUDA IPC) as soon as this returns.
  CUDA_RETURN_IF_ERROR(cudaMemsetAsync(p, 0, static_cast<size_t>(bytes), stream_));
  CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return std::unique_ptr<DeviceAllocation>(std::move(allocation));
}

absl::StatusOr<DeviceMemoryInfo> CudaOps::MemoryInfo() {
  size_t free = 0, total = 0;
  CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free, &total));
  // Besides what this object allocated: the two attention plans' buffers, cuBLASLt's workspaces
  // (kernels/gemm; kernels/quant_gemm's FP8 path when it serves a weight), and an allowance for the
  // CUDA context and the modules loaded into it, which no API reports per process.
  constexpr int64_t kContextAllowance = int64_t{512} << 20;
  constexpr int64_t kCublasLtWorkspace = int64_t{32} << 20;
  const int64_t own = allocated_bytes_ + decode_plan_->DeviceBytes() +
                      prefill_plan_->DeviceBytes() + kCublasLtWorkspace + kContextAllowance +
                      (fp8_lt_.empty() ? 0 : kFp8LtWorkspaceBytes);
  return DeviceMemoryInfo{static_cast<int64_t>(free), static_cast<int64_t>(total), own};
}

void CudaOps::LogProfile() {
  profiling_ = false;
  if (num_op_events_ == 0) return;
  struct Row {
    int count = 0;
    double us = 0;
  };
  std::map<std::string, Row> rows;
  double kernels_us = 0;
  for (size_t i = 0; i < num_op_events_; ++i) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, op_events_[i].start, op_events_[i].end) != cudaSuccess) {
      cudaGetLastError();
      return;
    }
    Row& r = rows[op_events_[i].name];
    ++r.count;
    r.us += ms * 1e3;
    kernels_us += ms * 1e3;
  }
  float span_ms = 0;
  cudaEventElapsedTime(&span_ms, op_events_[0].start, op_events_[num_op_events_ - 1].end);
  std::string table = absl::StrFormat(
      "op profile of step %d (%d sequences, eager): ops %.1f us of a %.1f us span\n", num_steps_,
      num_seqs_, kernels_us, span_ms * 1e3);
  std::vector<std::pair<std::string, Row>> sorted(rows.begin(), rows.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.second.us > b.second.us; });
  for (const auto& [name, r] : sorted) {
    table += absl::StrFormat("  %-40s %5d x  %9.1f us  %5.1f%%\n", name, r.count, r.us,
                             100.0 * r.us / std::max(kernels_us, 1e-9));
  }
  LOG(INFO) << table;
  num_op_events_ = 0;
}

absl::Status CudaOps::Embedding(const EmbeddingArgs& a) {
  return Timed([] { return std::string("embedding"); },
               [&] { return ::tandem::Embedding(a, stream_); });
}
absl::Status CudaOps::RmsNorm(const RmsNormArgs& a) {
  return Timed([&] { return std::string(a.residual ? "add+rmsnorm" : "rmsnorm"); },
               [&] { return ::tandem::RmsNorm(a, stream_); });
}
absl::Status CudaOps::Gemm(const GemmArgs& a) {
  if (!quant_.empty()) {
    if (auto it = quant_.find(a.w); it != quant_.end()) return QuantGemm(a, it->second);
  }
  if (a.a_norm_weight != nullptr && !GemmFusesNorm(a.m) &&
      fused_act_quant_ != FusedActQuant::kOff) {
    // A bf16 weight in a step whose norms run inside the GEMMs for the FP8 ones.
    if (fused_act_quant_ == FusedActQuant::kRequire) {
      return absl::FailedPreconditionError(
          absl::StrCat("TANDEM_FUSED_ACT_QUANT=require: the bf16 GEMM [", a.n, ", ", a.k,
                       "] was given the norm"));
    }
    ASSIGN_OR_RETURN(const GemmArgs plain, NormIntoScratch(a));
    return Gemm(plain);
  }
  return Timed(
      [&] {
        return absl::StrCat("gemm m=", a.m, " n=", a.n, " k=", a.k,
                            a.a_norm_weight != nullptr ? " +norm" : "", a.accumulate ? " +=" : "");
      },
      [&] { return ::tandem::Gemm(a, stream_); });
}
absl::Status CudaOps::QuantGemm(const GemmArgs& a, const QuantGemmArgs& w) {
  if (a.m < 0 || a.n != w.n || a.k != w.k ||
      (a.a_norm_weight != nullptr && fused_act_quant_ == FusedActQuant::kOff) ||
      a.a_dtype != DType::kBF16 || a.c_dtype != DType::kBF16) {
    return absl::InternalError(absl::StrCat("quantized GEMM: bf16 [", a.n, ", ", a.k,
                                            "] without a fused norm asked of a [", w.n, ", ", w.k,
                                            "] weight"));
  }
  if (a.m == 0) return absl::OkStatus();
  if (!fp8_lt_.empty()) {
    ASSIGN_OR_RETURN(const bool done, TryFp8Lt(a, w));
    if (done) return absl::OkStatus();
  }
  if (a.a_norm_weight != nullptr) {  // not fused: the norm on its own, then the usual paths
    if (fused_act_quant_ == FusedActQuant::kRequire) {
      return absl::FailedPreconditionError(
          absl::StrCat("TANDEM_FUSED_ACT_QUANT=require: the quantized GEMM [", a.n, ", ", a.k,
                       "] at m=", a.m, " cannot take the fused RMSNorm + FP8 quantization"));
    }
    ASSIGN_OR_RETURN(const GemmArgs plain, NormIntoScratch(a));
    return QuantGemm(plain, w);
  }
  QuantGemmArgs q = WithActivations(w, a);
  if (q.act_quant != ActQuant::kNone) {
    if (act_scratch_ == nullptr || a.m > act_scratch_rows_ || a.k > quant_max_act_k_) {
      return absl::InternalError(absl::StrCat("quantized GEMM: ", a.m, " x ", a.k,
                                              " activations beyond the scratch reserved"));
    }
    RETURN_IF_ERROR(Timed([] { return std::string("quant act fp8"); },
                          [&] {
                            return QuantizeActivations(q.act_quant, q.act_group_size, a.a,
                                                       act_scratch_, a.m, a.k, a.a_dtype, stream_);
                          }));
    q.a = act_scratch_;
    q.act_quant = ActQuant::kNone;  // already applied
  }
  const char* code = q.code == QuantCode::kFp8E4M3 ? "fp8"
                     : q.code == QuantCode::kInt8  ? "int8"
                                                   : "int4";
  if (QuantGemvApplies(quant_gemv_, q.code, q.m) && QuantGemvCovers(q).ok()) {
    return Timed(
        [&] {
          return absl::StrCat("qgemm ", code, " gemv m=", a.m, " n=", a.n, " k=", a.k,
                              a.accumulate ? " +=" : "");
        },
        [&] { return QuantGemv(q, stream_); });
  }
  if (QuantTcApplies(quant_tc_, quant_tc_min_m_, q.code, q.m)) {
    q.tc_workspace = quant_tc_workspace_;
    q.tc_splits = quant_tc_splits_;
    if (absl::Status covers = QuantGemmTcCovers(q); covers.ok()) {
      return Timed(
          [&] {
            return absl::StrCat("qgemm ", code, " tc m=", a.m, " n=", a.n, " k=", a.k,
                                a.accumulate ? " +=" : "");
          },
          [&] { return QuantGemmTc(q, stream_); });
    } else if (quant_tc_ == QuantTc::kRequire) {
      return absl::FailedPreconditionError(
          absl::StrCat("TANDEM_QUANT_TC=require: ", covers.message()));
    }
  }
  if (q.m <= kQuantSkinnyMaxM && QuantGemmSkinnyCovers(q).ok()) {
    return Timed(
        [&] { return absl::StrCat("qgemm ", code, " skinny m=", a.m, " n=", a.n, " k=", a.k); },
        [&] { return QuantGemmSkinny(q, stream_); });
  }
  if (dequant_scratch_ == nullptr || w.n * w.k > quant_max_weight_elems_) {
    return absl::InternalError("quantized GEMM: no dequantization scratch (ReserveStep first)");
  }
  RETURN_IF_ERROR(
      Timed([&] { return absl::StrCat("qgemm ", code, " dequant n=", a.n, " k=", a.k); },
            [&] { return QuantDequantize(q, dequant_scratch_, DType::kBF16, stream_); }));
  GemmArgs dense = a;
  dense.a = q.a;
  dense.w = dequant_scratch_;
  dense.w_dtype = DType::kBF16;
  dense.overlap_launch = false;  // its weight was just written by the dequantization
  return Timed(
      [&] {
        return absl::StrCat("qgemm ", code, " dense m=", a.m, " n=", a.n, " k=", a.k,
                            a.accumulate ? " +=" : "");
      },
      [&] { return ::tandem::Gemm(dense, stream_); });
}

absl::StatusOr<GemmArgs> CudaOps::NormIntoScratch(const GemmArgs& a) {
  if (act_scratch_ == nullptr || a.m > act_scratch_rows_ || a.k > quant_max_act_k_ ||
      a.a_dtype != DType::kBF16) {
    return absl::InternalError(absl::StrCat("GEMM with a fused norm: ", a.m, " x ", a.k,
                                            " bf16 activations beyond the scratch reserved"));
  }
  RETURN_IF_ERROR(RmsNorm(RmsNormArgs{.input = a.a,
                                      .weight = a.a_norm_weight,
                                      .out = act_scratch_,
                                      .num_rows = a.m,
                                      .hidden = a.k,
                                      .eps = a.a_norm_eps,
                                      .dtype = a.a_dtype}));
  GemmArgs plain = a;
  plain.a = act_scratch_;
  plain.a_norm_weight = nullptr;
  return plain;
}

absl::Status CudaOps::RopeKvStore(const RopeKvStoreArgs& a) {
  return Timed([] { return std::string("rope+kv store"); },
               [&] { return ::tandem::RopeKvStore(a, stream_); });
}
absl::Status CudaOps::SiluMul(const SiluMulArgs& a) {
  return Timed([] { return std::string("silu*mul"); },
               [&] { return ::tandem::SiluMul(a, stream_); });
}
absl::Status CudaOps::LogitsProcess(const LogitsProcessArgs& a) {
  return Timed([] { return std::string("logits process"); },
               [&] { return ::tandem::LogitsProcess(a, stream_); });
}
absl::Status CudaOps::Logprobs(const LogprobsArgs& a) {
  return Timed([] { return std::string("logprobs"); },
               [&] { return ::tandem::Logprobs(a, stream_); });
}
absl::Status CudaOps::Sampling(const SamplingArgs& a) {
  return Timed([] { return std::string("sampling"); },
               [&] { return ::tandem::Sampling(a, stream_); });
}

absl::Status CudaOps::PagedAttention(const PagedAttentionArgs& args) {
  if (num_decode_ > 0) {
    PagedAttentionArgs decode = args;
    decode.num_seqs = num_decode_;
    RETURN_IF_ERROR(Timed([] { return std::string("attention decode"); },
                          [&] { return PagedAttentionDecode(decode, *decode_plan_, stream_); }));
  }
  if (num_seqs_ > num_decode_) {
    // The prefill plan covers sequences [num_decode_, num_seqs_): its items count from there.
    PagedAttentionArgs prefill = args;
    const int64_t skip = num_decode_;
    prefill.block_tables = args.block_tables + skip * args.max_pages_per_seq;
    prefill.seq_lens = args.seq_lens + skip;
    prefill.query_start = args.query_start + skip;
    prefill.num_seqs = num_seqs_ - num_decode_;
    RETURN_IF_ERROR(Timed([] { return std::string("attention prefill"); },
                          [&] { return PagedAttentionPrefill(prefill, *prefill_plan_, stream_); }));
  }
  return absl::OkStatus();
}

absl::Status CudaOps::BeginCapture() {
  CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  return absl::OkStatus();
}

absl::StatusOr<int> CudaOps::EndCapture() {
  cudaGraph_t graph = nullptr;
  CUDA_RETURN_IF_ERROR(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t st = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  CUDA_RETURN_IF_ERROR(st);
  graphs_.push_back(exec);
  return static_cast<int>(graphs_.size()) - 1;
}

absl::Status CudaOps::Replay(int graph) {
  if (graph < 0 || graph >= static_cast<int>(graphs_.size())) {
    return absl::InternalError(absl::StrCat("no CUDA graph ", graph));
  }
  CUDA_RETURN_IF_ERROR(cudaGraphLaunch(graphs_[graph], stream_));
  return absl::OkStatus();
}

absl::StatusOr<void*> CudaOps::RecordKvEvent(int layer) {
  if (layer < 0) return absl::InvalidArgumentError("RecordKvEvent: negative layer");
  while (static_cast<int>(kv_events_.size()) <= layer) {
    cudaEvent_t e = nullptr;
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    kv_events_.push_back(e);
  }
  // Re-recording an event another thread still waits on is fine: the later record completes
  // after the earlier one on the same stream.
  CUDA_RETURN_IF_ERROR(cudaEventRecord(kv_events_[layer], stream_));
  return static_cast<void*>(kv_events_[layer]);
}

}  // namespace tandem
