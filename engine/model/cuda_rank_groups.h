// What the CUDA backend's loaders share (load_model.cc for one GPU and tensor parallelism,
// load_cuda_pipeline.cc for pipeline stages): the check of what the CUDA kernels cover, and the
// communicator group of CUDA ranks — NCCL when every rank has a GPU of its own and NCCL is
// built, else the in-process peer communicator (device_placement.h's ChooseDeviceComm).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/group/communicator.h"
#include "comm/group/peer_communicator.h"
#include "engine/model/model_config.h"
#include "engine/model/parallel_model.h"

namespace tandem {

// Unimplemented (naming `dir` and the fix) for what the CUDA kernels do not run: head_dim other
// than 64 or 128.
absl::Status CheckCudaSupports(const ModelConfig& config, const std::string& dir);

// A communicator group of CUDA ranks and each rank's communicator, [rank in the group].
struct DeviceGroup {
  CommGroupHandle handle;
  std::vector<std::unique_ptr<Communicator>> comms;
};

// The group of ranks on `devices` ([rank]) whose work runs on `streams` ([rank], their compute
// streams, cudaStream_t), under options.timeout and options.force_peer_comm; `what` names the
// group in the log ("tensor-parallel ranks", "pipeline stages"); `on_peer` (may be null) is
// called with the group once made when it is a peer group. NCCL's or the peer group's error.
absl::StatusOr<DeviceGroup> MakeDeviceGroup(const std::vector<int>& devices,
                                            const std::vector<void*>& streams,
                                            const CudaGroupOptions& options,
                                            const std::string& what,
                                            const std::function<void(PeerCommGroup&)>& on_peer);

// LoadCudaParallelModel for pipeline_parallel > 1 (parallel_model.h): TP · PP ranks placed on
// the devices, each stage's ranks holding its layers only (embeddings on the first stage, the
// final norm and lm_head on the last stage's TP rank 0), a communicator group per stage of TP
// ranks and one group-wide for the stage-to-stage transfers. Quantized weights (the checkpoint's
// format, or `quantization` as LoadModel's) are sliced per rank as with tensor parallelism alone.
absl::StatusOr<std::unique_ptr<Model>> LoadCudaPipelineModel(const std::string& dir,
                                                             const ParallelConfig& parallel,
                                                             const CudaGroupOptions& options,
                                                             const std::string& quantization = "");

}  // namespace tandem
