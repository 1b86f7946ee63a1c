// One cuBLASLt handle, workspace and plan cache per device, created on first use and kept for the
// process lifetime. The bf16 GEMM (kernels/gemm/gemm_lt_cuda.cc) and the FP8 GEMM
// (kernels/quant_gemm/fp8_gemm_lt_cuda.cc) each keep their own, keyed by their plan types.
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
  std::map<Key, Plan> plans;  // guarded by mu
  std::mutex mu;
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
    slot = std::move(ctx);
  }
  return slot.get();
}

}  // namespace tandem
