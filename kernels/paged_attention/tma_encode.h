// The driver's cuTensorMapEncodeTiled, found once per process through the runtime (so the
// kernels link no libcuda): the tensor maps of the prefill kernel's K/V tiles
// (paged_attention_prefill_sm90.cu) and of the stream decode kernel's fp8 codes (stream_decode.cu).
// Host code. Internal to kernels/paged_attention.
#pragma once

#include <cuda.h>  // CUtensorMap and the encoder's type (the types only: no libcuda link)
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

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

}  // namespace tandem::attention
