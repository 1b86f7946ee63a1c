// The cuBLASLt path of Gemm() (large m), and the per-device handle + workspace that owns it.
//
// Row-major c[m, n] = a[m, k] . w[n, k]^T is, in cuBLAS's column-major terms,
//   C (n x m, ld n) = op(W) . A  with W viewed as k x n (ld k) transposed and A as k x m (ld k).
// Plans (descriptors + the heuristic's algorithm) are cached per shape, so a steady-state call is
// one cublasLtMatmul: no allocation, no synchronisation — safe inside CUDA graph capture once
// GemmInitDevice() has run for the device.
#include <cublasLt.h>
#include <cublas_v2.h>  // cublasGetStatusString, used by CUBLAS_RETURN_IF_ERROR
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
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

// (m, n, k, c_dtype, has_bias) -> plan, one cache per device (kernels/common/cublaslt_device.h).
using PlanKey = std::tuple<int64_t, int64_t, int64_t, int, bool>;
using LtDevice = CublasLtDevice<PlanKey, Plan>;

absl::StatusOr<LtDevice*> DeviceContext() {
  return CublasLtDeviceContext<PlanKey, Plan>(kWorkspaceBytes);
}

absl::Status MakePlan(LtDevice& dev, const GemmArgs& args, Plan& plan) {
  const cudaDataType_t c_type = args.c_dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&plan.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans = CUBLAS_OP_T;
  CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof(trans)));
  if (args.bias != nullptr) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        plan.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &c_type, sizeof(c_type)));
  }
  CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(&plan.w_layout, CUDA_R_16BF, args.k, args.n, args.k));
  CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(&plan.a_layout, CUDA_R_16BF, args.k, args.m, args.k));
  CUBLAS_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(&plan.c_layout, c_type, args.n, args.m, args.n));
  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = kWorkspaceBytes;
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(dev.handle, plan.op, plan.w_layout, plan.a_layout,
                                     plan.c_layout, plan.c_layout, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  CUBLAS_RETURN_IF_ERROR(st);
  if (found == 0) {
    return absl::UnimplementedError(
        absl::StrCat("cuBLASLt: no algorithm for m=", args.m, " n=", args.n, " k=", args.k));
  }
  plan.algo = result.algo;
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
  Plan* plan = nullptr;
  {
    const auto key = std::make_tuple(args.m, args.n, args.k, static_cast<int>(args.c_dtype),
                                     args.bias != nullptr);
    auto it = dev.plans.find(key);
    if (it == dev.plans.end()) {
      Plan fresh;
      const absl::Status st = MakePlan(dev, args, fresh);
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
  auto workspace = dev.WorkspaceFor(stream);
  if (!workspace.ok()) return workspace.status();
  CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(
      dev.handle, plan->op, &alpha, args.w, plan->w_layout, args.a, plan->a_layout, &beta, args.c,
      plan->c_layout, args.c, plan->c_layout, &plan->algo, *workspace, kWorkspaceBytes, stream));
  return absl::OkStatus();
}

}  // namespace tandem
