// The CUDA side of a worker group's ranks (engine/model/parallel_model.h), callable from code
// built without CUDA headers: devices, one rank's CudaOps on its device, the device API of the
// in-process communicator (comm/group/peer_communicator.h), and the KV pool of ranks on several
// devices. A build without CUDA gets stubs that say so (cuda_unavailable.cc).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/group/peer_communicator.h"
#include "engine/model/ops.h"

namespace tandem {

// Visible CUDA devices (0 without CUDA or without a device).
int CudaDeviceCount();
// Makes `device` the calling thread's current CUDA device (every later CUDA call of the thread
// runs there). Internal on a CUDA error; Unimplemented without CUDA.
absl::Status SetCudaDevice(int device);

// One rank's backend: CudaOps on `device` (made the calling thread's current device, where the
// rank's weights are then adopted) and its compute stream (a cudaStream_t).
struct CudaRankOps {
  std::unique_ptr<Ops> ops;
  void* stream = nullptr;
};
absl::StatusOr<CudaRankOps> MakeCudaRankOps(int device);

// The PeerDeviceApi over the CUDA runtime: events, stream waits, the PeerReduceSum kernel,
// cudaMemcpyAsync, and cudaMalloc'd staging buffers; EnablePeers
// turns on peer access between distinct devices (FailedPrecondition where the hardware has none).
// Each call runs on the calling thread's current device, which must be the stream's (the ranks'
// threads have theirs current).
std::shared_ptr<PeerDeviceApi> MakeCudaPeerApi();

// The KV pool of ranks on several devices: one address range of slice_bytes[i] for rank i laid
// end to end, each granule of it physically on the device of the slice holding its first byte
// (SplitPoolChunks, engine/model/device_placement.h), zero-filled, readable and writable from
// every device in `devices` (so also through cudaMemcpy from any thread). FailedPrecondition
// without peer access between the devices or without the driver's virtual memory management;
// ResourceExhausted when a device has no room. Not exportable through CUDA IPC.
absl::StatusOr<std::unique_ptr<DeviceAllocation>> AllocateSplitDevicePool(
    const std::vector<int>& devices, const std::vector<int64_t>& slice_bytes);

}  // namespace tandem
