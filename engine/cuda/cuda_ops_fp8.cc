// CudaOps' FP8 W8A8 GEMMs through cuBLASLt (kernels/quant_gemm/fp8_gemm_lt.h): the weights the
// path covers get their scales packed and uploaded at adoption, one scratch (e4m3 activations,
// their scales, the block modes' tail) is reserved with the step buffers, and QuantGemm hands
// the GEMMs UseFp8Lt picks to TryFp8Lt (with a_norm_weight: the fused RMSNorm + quantization
// kernel fills the scratch, fused_act_quant.h). A refusal (Unimplemented: a configuration cuBLASLt
// has no algorithm for) falls back to the other paths, logged once per weight
// (TANDEM_FP8_LT=require: returned as the error).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "engine/cuda/cuda_ops.h"
#include "kernels/rmsnorm/rmsnorm_quant.h"

namespace tandem {

absl::Status CudaOps::AdoptFp8Lt(const QuantizedWeight& host, const QuantGemmArgs& device) {
  if (!fp8_lt_enabled_ || host.code != QuantCode::kFp8E4M3 || host.act_quant == ActQuant::kNone) {
    return absl::OkStatus();
  }
  absl::StatusOr<Fp8LtPackedScales> packed = Fp8LtPackWeightScales(host.Args());
  if (!packed.ok()) {  // a shape or layout the path does not cover: the other paths serve it
    if (fp8_lt_required_) return packed.status();
    LOG(INFO) << "FP8 weight [" << host.n << ", " << host.k
              << "] without the cuBLASLt FP8 path: " << packed.status().message();
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(Fp8LtInitDevice());  // handle + workspace, before any graph capture
  const int64_t bytes = static_cast<int64_t>(packed->scales.size() * sizeof(float));
  ASSIGN_OR_RETURN(void* scales, DeviceAlloc(bytes));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(scales, packed->scales.data(), bytes, cudaMemcpyHostToDevice));
  fp8_lt_[device.w] = Fp8LtWeight{.w = device.w,
                                  .scales = static_cast<const float*>(scales),
                                  .n = host.n,
                                  .k = host.k,
                                  .mode = packed->mode};
  fp8_lt_max_n_ = std::max(fp8_lt_max_n_, host.n);
  fp8_lt_max_k_ = std::max(fp8_lt_max_k_, host.k);
  return absl::OkStatus();
}

absl::Status CudaOps::ReserveFp8Lt(int64_t max_tokens) {
  if (fp8_lt_.empty()) return absl::OkStatus();
  const int64_t bytes = Fp8LtScratchBytes(max_tokens, fp8_lt_max_k_, fp8_lt_max_n_);
  if (bytes <= fp8_lt_scratch_bytes_) return absl::OkStatus();
  ASSIGN_OR_RETURN(fp8_lt_scratch_, DeviceAlloc(bytes));  // cudaMalloc: 256-byte aligned
  fp8_lt_scratch_bytes_ = bytes;
  return absl::OkStatus();
}

absl::StatusOr<bool> CudaOps::TryFp8Lt(const GemmArgs& a, const QuantGemmArgs& w) {
  auto it = fp8_lt_.find(w.w);
  if (it == fp8_lt_.end()) return false;
  QuantGemmArgs skinny = WithActivations(w, a);
  skinny.act_quant = ActQuant::kNone;  // the skinny kernel runs on pre-rounded activations
  if (!UseFp8Lt(a.m, a.m <= kQuantSkinnyMaxM && QuantGemmSkinnyCovers(skinny).ok())) return false;
  const QuantGemmArgs q = WithActivations(w, a);
  if (Fp8LtScratchBytes(a.m, a.k, a.n) > fp8_lt_scratch_bytes_) {
    return absl::InternalError(absl::StrCat("FP8 GEMM: ", a.m, " x ", a.k,
                                            " beyond the scratch reserved (ReserveStep first)"));
  }
  const bool norm = a.a_norm_weight != nullptr;
  // The norm fused with the quantization: a is the residual stream, nothing bf16 is written.
  const RmsNormQuantArgs nq{.norm = RmsNormArgs{.input = a.a,
                                                .weight = a.a_norm_weight,
                                                .num_rows = a.m,
                                                .hidden = a.k,
                                                .eps = a.a_norm_eps,
                                                .dtype = a.a_dtype},
                            .act_quant = w.act_quant,
                            .act_group_size = w.act_group_size,
                            .scratch = fp8_lt_scratch_,
                            .scratch_bytes = fp8_lt_scratch_bytes_};
  if (norm && !RmsNormQuantCovers(nq).ok()) return false;  // the caller normalises first
  const absl::Status st = Timed(
      [&] {
        return absl::StrCat("qgemm fp8 cublaslt m=", a.m, " n=", a.n, " k=", a.k,
                            norm ? " +norm" : "", a.accumulate ? " +=" : "");
      },
      [&] {
        if (!norm) return Fp8GemmLt(q, it->second, fp8_lt_scratch_, fp8_lt_scratch_bytes_, stream_);
        return Fp8GemmLtWith(q, it->second, fp8_lt_scratch_, fp8_lt_scratch_bytes_, stream_,
                             [&] { return RmsNormQuant(nq, stream_); });
      });
  if (st.ok()) return true;
  if (fp8_lt_required_ || (!absl::IsUnimplemented(st) && !absl::IsInvalidArgument(st))) return st;
  if (fp8_lt_refused_.insert(w.w).second) {
    LOG(WARNING) << "FP8 GEMM [" << a.n << ", " << a.k << "] at m=" << a.m
                 << " falls back from cuBLASLt FP8: " << st.message();
  }
  return false;
}

}  // namespace tandem
