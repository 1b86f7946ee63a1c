// MakeCudaNccl in a build without CUDA or without libnccl: NCCL is impossible, and says why.
#include "comm/nccl_api.h"

namespace tandem {

absl::StatusOr<std::shared_ptr<NcclApi>> MakeCudaNccl() {
#ifdef TANDEM_NCCL_MISSING_REASON
  return absl::UnimplementedError(
      "this build of tandem has no NCCL KV transport: " TANDEM_NCCL_MISSING_REASON);
#else
  return absl::UnimplementedError("this build of tandem has no NCCL KV transport");
#endif
}

}  // namespace tandem
