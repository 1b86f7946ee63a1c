// The CUDA backend's entry points in a build without CUDA (-DTANDEM_CUDA=OFF, or no nvcc at
// configure time): no device is ever available, and asking for the backend says why.
#include "engine/cuda/cuda_device.h"
#include "engine/cuda/cuda_group.h"
#include "engine/model/ops.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<Ops>> MakeCudaOps() {
  return absl::UnimplementedError(
      "this build of tandem has no CUDA backend (configured without nvcc or with "
      "-DTANDEM_CUDA=OFF); use --backend cpu");
}

bool CudaDeviceAvailable() { return false; }

absl::Status CopyDeviceMemory(void*, const void*, int64_t) {
  return absl::UnimplementedError("this build of tandem has no CUDA backend");
}

absl::Status WaitKvEvent(void* event) {
  if (event == nullptr) return absl::OkStatus();
  return absl::UnimplementedError("this build of tandem has no CUDA backend");
}

int CudaDeviceCount() { return 0; }

absl::Status SetCudaDevice(int) {
  return absl::UnimplementedError("this build of tandem has no CUDA backend");
}

absl::StatusOr<CudaRankOps> MakeCudaRankOps(int) {
  return absl::UnimplementedError(
      "this build of tandem has no CUDA backend (configured without nvcc or with "
      "-DTANDEM_CUDA=OFF); use --backend cpu");
}

std::shared_ptr<PeerDeviceApi> MakeCudaPeerApi() { return nullptr; }

absl::StatusOr<std::unique_ptr<DeviceAllocation>> AllocateSplitDevicePool(
    const std::vector<int>&, const std::vector<int64_t>&) {
  return absl::UnimplementedError("this build of tandem has no CUDA backend");
}

}  // namespace tandem
