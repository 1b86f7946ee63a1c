// MakeCudaKvIpc in a build without CUDA: CUDA IPC is impossible, and says why.
#include "comm/kv_ipc.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<KvIpcDevice>> MakeCudaKvIpc() {
  return absl::UnimplementedError("this build of tandem has no CUDA: no CUDA IPC KV transport");
}

}  // namespace tandem
