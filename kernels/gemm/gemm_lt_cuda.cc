// The cuBLASLt path of Gemm() (large m), and the per-device handle + workspace that owns it.
//
// Row-major c[m, n] = a[m, k] . w[n, k]^T is, in cuBLAS's column-major terms,
//   C (n x m, ld n) = op(W) . A  with W viewed as k x n (ld k) transposed and A as k x m (ld k).
// Plans (descriptors + the algorithm: the fastest of the heuristic's candidates, timed when the
// plan is made, kernels/common/cublaslt_autotune.h) are cached per shape, so a steady-state call
// is one cublasLtMatmul: no allocation, no synchronisation — safe inside CUDA graph capture once
// GemmInitDevice() has run for the device.
#include <cublasLt.h>
#include <cublas_v2.h>  // cublasGetStatusString, used by CUBLAS_RETURN_IF_ERROR
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "kernels/common/cublaslt_autotune.h"
#include "kernels/common/cublaslt_device.h"
#include "kernels/gemm/gemm.h"

namespace tandem {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t w_layout = nullptr, a_layout = nullptr, c_layout = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

// (m, n, k, c_dtype, has_bias, tuned) -> plan, one cache per device
// (kernels/common/cublaslt_device.h; m first: ChooseLtAlgo's bucket).
using PlanKey = std::tuple<int64_t, int64_t, int64_t, int, bool, bool>;
using LtDevice = CublasLtDevice<PlanKey, Plan>;

absl::StatusOr<LtDevice*> DeviceContext() {
  return CublasLtDeviceContext<PlanKey, Plan>(kWorkspaceBytes);
}

absl::Status MakeDescriptors(const GemmArgs& args, Plan& plan) {
  const cudaDataType_t c_type = args.c_dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&plan.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans = CUBLAS_OP_T;
  CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof(trans)));
  if (args.bias != nullptr) {  // the first call's pointer, for the tuner (each call sets its own)
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &c_type, sizeof(c_type)));
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &args.bias, sizeof(args.bias)));
  }
  CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(&plan.w_layout, CUDA_R_16BF, args.k, args.n, args.k));
  CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(&plan.a_layout, CUDA_R_16BF, args.k, args.m, args.k));
  CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(&plan.c_layout, c_type, args.n, args.m, args.n));
  return absl::OkStatus();
}

// Descriptors and the algorithm: the heuristic's first, or with tuning (std::get<5>(key)) the
// fastest of its candidates on this call's a and w, at this call's beta (the key has no
// accumulate: either beta runs any algorithm).
absl::Status MakePlan(LtDevice& dev, const PlanKey& key, const GemmArgs& args, void* workspace,
                      cudaStream_t stream, Plan& plan) {
  RETURN_IF_ERROR(MakeDescriptors(args, plan));
  const LtTuneProblem problem{
      .handle = dev.handle,
      .op = plan.op,
      .a_layout = plan.w_layout,
      .b_layout = plan.a_layout,
      .d_layout = plan.c_layout,
      .a = args.w,
      .b = args.a,
      .d_bytes = static_cast<size_t>(args.m * args.n * DTypeSize(args.c_dtype)),
      .beta = args.accumulate ? 1.0f : 0.0f,
      .workspace = workspace,
      .workspace_bytes = kWorkspaceBytes,
      .stream = stream,
      .label = absl::StrCat("bf16 m=", args.m, " n=", args.n, " k=", args.k,
                            args.c_dtype == DType::kF32 ? " f32 out" : "",
                            args.bias != nullptr ? " bias" : "")};
  std::vector<cublasLtMatmulHeuristicResult_t> found;
  CUBLAS_RETURN_IF_ERROR(LtHeuristic(problem, std::get<5>(key) ? kLtTuneMaxCandidates : 1, found));
  if (found.empty()) {
    return absl::UnimplementedError(
        absl::StrCat("cuBLASLt: no algorithm for m=", args.m, " n=", args.n, " k=", args.k));
  }
  plan.algo = ChooseLtAlgo(dev, key, problem, found, std::get<5>(key));
  return absl::OkStatus();
}

}  // namespace

absl::Status GemmInitDevice() { return DeviceContext().status(); }

absl::Status GemmCublasLt(const GemmArgs& args, cudaStream_t stream) {
  if (args.a_dtype != DType::kBF16 || args.w_dtype != DType::kBF16 ||
      (args.c_dtype != DType::kBF16 && args.c_dtype != DType::kF32)) {
    return absl::InvalidArgumentError("GemmCublasLt: a and w must be bf16, c bf16 or f32");
  }
  auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  if (args.k % 8 != 0 || args.n % 8 != 0 || !aligned(args.a) || !aligned(args.w) ||
      !aligned(args.c) || (args.bias != nullptr && !aligned(args.bias))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GemmCublasLt: needs k % 8 == 0, n % 8 == 0 and 16-byte aligned pointers; got n=", args.n,
        " k=", args.k));
  }
  if (args.a_norm_weight != nullptr) {
    return absl::InvalidArgumentError("GemmCublasLt: no fused RMSNorm (a_norm_weight)");
  }
  // The bias epilogue with beta = 1 rounds a · wᵀ + bias to c's dtype before adding c (measured:
  // 4 bf16 ulps off a once-rounded sum), which breaks GemmArgs::accumulate's contract.
  if (args.accumulate && args.bias != nullptr) {
    return absl::InvalidArgumentError("GemmCublasLt: accumulate with a bias is not supported");
  }
  if (args.m <= 0 || args.n <= 0) return absl::OkStatus();
  auto dev_or = DeviceContext();
  if (!dev_or.ok()) return dev_or.status();
  LtDevice& dev = **dev_or;
  // The lock also covers the bias-pointer update of the shared descriptor and the enqueue.
  std::lock_guard<std::mutex> lock(dev.mu);
  auto workspace = dev.WorkspaceFor(stream);
  if (!workspace.ok()) return workspace.status();
  Plan* plan = nullptr;
  {
    const PlanKey key{args.m,
                      args.n,
                      args.k,
                      static_cast<int>(args.c_dtype),
                      args.bias != nullptr,
                      LtAutotuneEnabled()};
    auto it = dev.plans.find(key);
    if (it == dev.plans.end()) {
      Plan fresh;
      const absl::Status st = MakePlan(dev, key, args, *workspace, stream, fresh);
      if (!st.ok()) return st;
      it = dev.plans.emplace(key, fresh).first;
    }
    plan = &it->second;  // std::map nodes are stable; plans are never erased.
  }
  if (args.bias != nullptr) {
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &args.bias, sizeof(args.bias)));
  }
  // accumulate: D = A·B + C with C = D (in place, as cuBLASLt allows for equal layouts).
  const float alpha = 1.0f, beta = args.accumulate ? 1.0f : 0.0f;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(
      dev.handle, plan->op, &alpha, args.w, plan->w_layout, args.a, plan->a_layout, &beta, args.c,
      plan->c_layout, args.c, plan->c_layout, &plan->algo, *workspace, kWorkspaceBytes, stream));
  return absl::OkStatus();
}

}  // namespace tandem
