// One checking macro per library for every CUDA, cuBLAS and NCCL call: each returns an
// absl::Status naming the expression, the library's error string and file:line. Include only
// from CUDA translation units or the CUDA backend.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#define CUDA_RETURN_IF_ERROR(expr)                                                              \
  do {                                                                                          \
    const cudaError_t _tandem_err = (expr);                                                     \
    if (_tandem_err != cudaSuccess) {                                                           \
      return ::absl::InternalError(::absl::StrCat(#expr,                                        \
                                                  " failed: ", cudaGetErrorString(_tandem_err), \
                                                  " (", __FILE__, ":", __LINE__, ")"));         \
    }                                                                                           \
  } while (0)

// After a kernel launch: reports launch-configuration errors at the launch site.
#define CUDA_RETURN_IF_LAUNCH_ERROR() CUDA_RETURN_IF_ERROR(cudaGetLastError())

#define CUBLAS_RETURN_IF_ERROR(expr)                                                              \
  do {                                                                                            \
    const cublasStatus_t _tandem_st = (expr);                                                     \
    if (_tandem_st != CUBLAS_STATUS_SUCCESS) {                                                    \
      return ::absl::InternalError(::absl::StrCat(#expr,                                          \
                                                  " failed: ", cublasGetStatusString(_tandem_st), \
                                                  " (", __FILE__, ":", __LINE__, ")"));           \
    }                                                                                             \
  } while (0)

#define NCCL_RETURN_IF_ERROR(expr)                                                             \
  do {                                                                                         \
    const ncclResult_t _tandem_nr = (expr);                                                    \
    if (_tandem_nr != ncclSuccess && _tandem_nr != ncclInProgress) {                           \
      return ::absl::InternalError(::absl::StrCat(#expr,                                       \
                                                  " failed: ", ncclGetErrorString(_tandem_nr), \
                                                  " (", __FILE__, ":", __LINE__, ")"));        \
    }                                                                                          \
  } while (0)
