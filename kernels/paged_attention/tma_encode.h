// The driver's cuTensorMapEncodeTiled, found once per process through the runtime (so the
// kernels link no libcuda), and the bf16 K/V map the prefill kernel
// (paged_attention_prefill_sm90.cu) and the stream decode kernel's TMA stages (stream_decode.cu)
// both read. Host code. Internal to kernels/paged_attention.
#pragma once

#include <cuda.h>  // CUtensorMap and the encoder's type (the types only: no libcuda link)
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace tandem::attention {

// The encoder, or null when the driver does not export it (the callers say so in a status).
inline PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode =
      []() -> PFN_cuTensorMapEncodeTiled_v12000 {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// One bf16 layer of the K/V cache as a 2D tensor of rows of head_dim elements (kv_layout.h: a
// (page, K/V, head) is page_size consecutive rows, row ((2 page + kv) H + head) P + key); boxes
// of 64 dims x box_rows rows in TMA's 128-byte swizzle. Rows: any row an int32 coordinate can
// name (the block tables keep the copies in the pool).
inline absl::StatusOr<CUtensorMap> Bf16KvRowsTensorMap(const void* kv_layer, int head_dim,
                                                       int box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
  if (encode == nullptr) return absl::InternalError("cuTensorMapEncodeTiled not found");
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(head_dim), cuuint64_t{0x7fffffff}};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(head_dim) * sizeof(uint16_t)};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  CUtensorMap map;
  const CUresult r =
      encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(kv_layer), dims, strides,
             box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return absl::InternalError(absl::StrCat("cuTensorMapEncodeTiled (bf16 K/V) failed: ", int{r}));
  }
  return map;
}

}  // namespace tandem::attention
