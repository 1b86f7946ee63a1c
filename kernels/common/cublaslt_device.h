// One cuBLASLt handle, workspace and plan cache per device, created on first use and kept for the
// process lifetime. The workspace is cuBLASLt's scratch while a GEMM runs, so two streams whose
// GEMMs may run at once (tensor-parallel ranks sharing a GPU) must not share one: the device's
// first stream uses `workspace`, every other stream gets its own (WorkspaceFor). The bf16 GEMM
// (kernels/gemm/gemm_lt_cuda.cc) and the FP8 GEMM (kernels/quant_gemm/fp8_gemm_lt_cuda.cc) each
// keep their own, keyed by their plan types.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>  // cublasGetStatusString, used by CUBLAS_RETURN_IF_ERROR
#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

#include "absl/status/statusor.h"
#include "base/cuda_check.h"

namespace tandem {

template <typename Key, typename Plan>
struct CublasLtDevice {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;  // workspace_bytes of CublasLtDeviceContext
  size_t workspace_bytes = 0;
  std::map<Key, Plan> plans;  // guarded by mu
  // The timed winner per tuning bucket (cublaslt_autotune.h: ChooseLtAlgo); guarded by mu.
  std::map<Key, cublasLtMatmulAlgo_t> tuned;
  std::mutex mu;
  // The first stream seen, and the workspaces of the others (guarded by mu; never freed: a
  // stream's first GEMM allocates it, so that first GEMM must not be under graph capture, as the
  // model's eager run before each capture guarantees).
  cudaStream_t first_stream = nullptr;
  bool seen_stream = false;
  std::map<cudaStream_t, void*> stream_workspaces;

  // The workspace of `stream` (with mu held).
  absl::StatusOr<void*> WorkspaceFor(cudaStream_t stream) {
    if (!seen_stream) {
      seen_stream = true;
      first_stream = stream;
    }
    if (stream == first_stream) return workspace;
    void*& ws = stream_workspaces[stream];
    if (ws == nullptr) CUDA_RETURN_IF_ERROR(cudaMalloc(&ws, workspace_bytes));
    return ws;
  }
};

// The context of the calling thread's current device. Every call of one instantiation passes
// the same workspace_bytes.
template <typename Key, typename Plan>
absl::StatusOr<CublasLtDevice<Key, Plan>*> CublasLtDeviceContext(size_t workspace_bytes) {
  static std::mutex devices_mu;
  static std::map<int, std::unique_ptr<CublasLtDevice<Key, Plan>>>
      devices;  // guarded by devices_mu
  int device = 0;
  CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(devices_mu);
  auto& slot = devices[device];
  if (slot == nullptr) {
    auto ctx = std::make_unique<CublasLtDevice<Key, Plan>>();
    CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&ctx->handle));
    CUDA_RETURN_IF_ERROR(cudaMalloc(&ctx->workspace, workspace_bytes));
    ctx->workspace_bytes = workspace_bytes;
    slot = std::move(ctx);
  }
  return slot.get();
}

}  // namespace tandem
