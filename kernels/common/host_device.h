// TANDEM_HOST_DEVICE: a function compiled for the host and, under nvcc, for the device too, so
// that a CPU reference or test and a kernel share one definition (index math, counter-based
// draws).
#pragma once

#if defined(__CUDACC__)
#define TANDEM_HOST_DEVICE __host__ __device__
#else
#define TANDEM_HOST_DEVICE
#endif
