// SKIP_WITHOUT_GPU(): the first statement of a GPU test of the engine's CUDA backend (label gpu),
// which then skips cleanly where no CUDA device is visible (CI, the development machine).
#pragma once

#include "engine/cuda/cuda_device.h"
#include "gtest/gtest.h"

#define SKIP_WITHOUT_GPU() \
  if (!::tandem::CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device"
