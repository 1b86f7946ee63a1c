#include "engine/model/cuda_rank_groups.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "comm/group/nccl_communicator.h"
#include "comm/nccl_api.h"
#include "engine/cuda/cuda_group.h"
#include "engine/model/device_placement.h"

namespace tandem {

absl::Status CheckCudaSupports(const ModelConfig& c, const std::string& dir) {
  if (c.head_dim != 64 && c.head_dim != 128) {
    return absl::UnimplementedError(absl::StrCat(
        dir, ": head_dim ", c.head_dim, " is not supported by the CUDA attention kernels (64 or ",
        "128); use --backend cpu"));
  }
  return absl::OkStatus();
}

absl::StatusOr<DeviceGroup> MakeDeviceGroup(const std::vector<int>& devices,
                                            const std::vector<void*>& streams,
                                            const CudaGroupOptions& options,
                                            const std::string& what,
                                            const std::function<void(PeerCommGroup&)>& on_peer) {
  const int n = static_cast<int>(devices.size());
  DeviceGroup g;
  absl::StatusOr<std::shared_ptr<NcclApi>> nccl =
      absl::FailedPreconditionError("ranks share a GPU");
  if (!SharesDevice(devices) && !options.force_peer_comm) nccl = MakeCudaNccl();
  if (ChooseDeviceComm(devices, nccl.ok()) == DeviceCommKind::kNccl) {
    std::vector<NcclRank> ranks;
    for (int r = 0; r < n; ++r) ranks.push_back(NcclRank{devices[r], streams[r]});
    ASSIGN_OR_RETURN(std::shared_ptr<NcclCommGroup> group,
                     MakeNcclGroup(*nccl, ranks, NcclGroupOptions{.timeout = options.timeout}));
    for (int r = 0; r < n; ++r) g.comms.push_back(group->ForRank(r));
    g.handle = CommGroupHandle::Of(std::move(group));
    LOG(INFO) << what << " on GPUs [" << absl::StrJoin(devices, ", ") << "]: NCCL";
    return g;
  }
  std::vector<PeerRank> ranks;
  for (int r = 0; r < n; ++r) ranks.push_back(PeerRank{devices[r], streams[r]});
  ASSIGN_OR_RETURN(
      std::shared_ptr<PeerCommGroup> group,
      PeerCommGroup::Create(MakeCudaPeerApi(), ranks, PeerCommOptions{.timeout = options.timeout}));
  if (on_peer) on_peer(*group);
  for (int r = 0; r < n; ++r) g.comms.push_back(group->ForRank(r));
  g.handle = CommGroupHandle::Of(std::move(group));
  LOG(INFO) << what << " on GPUs [" << absl::StrJoin(devices, ", ")
            << "]: in-process peer communicator"
            << (nccl.ok() || SharesDevice(devices)
                    ? ""
                    : " (no NCCL: " + std::string(nccl.status().message()) + ")");
  return g;
}

}  // namespace tandem
