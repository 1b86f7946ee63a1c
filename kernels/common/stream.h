// Lets CPU-only code name cudaStream_t without CUDA headers (the typedef matches CUDA's own).
#pragma once

#if defined(__CUDACC__) || defined(TANDEM_HAVE_CUDA_RUNTIME_H)
#include <cuda_runtime.h>
#else
typedef struct CUstream_st* cudaStream_t;
#endif
