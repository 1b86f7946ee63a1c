// Whether the CUDA backend can run here: this build has it and a device is visible. Cheap to
// call (one device count query); false in a build without CUDA.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace tandem {

bool CudaDeviceAvailable();

// A synchronous copy between host and device memory (either direction, told apart by their
// addresses), on the calling thread; safe beside an engine running its own stream. Internal on
// a CUDA error; Unimplemented in a build without CUDA.
absl::Status CopyDeviceMemory(void* dst, const void* src, int64_t bytes);

// Blocks until `event` (a cudaEvent_t as void*, Ops::RecordKvEvent's) has completed; OK at once
// for null. Internal on a CUDA error; Unimplemented in a build without CUDA.
absl::Status WaitKvEvent(void* event);

}  // namespace tandem
