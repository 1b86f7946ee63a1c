#include "worker/kv_ipc_setup.h"

#include "absl/strings/str_cat.h"
#include "base/logging.h"

namespace tandem {

absl::StatusOr<std::shared_ptr<KvIpcDevice>> KvIpcFor(const WorkerOptions& options,
                                                      const Engine& engine) {
  const KvTransportKind kind = options.kv_transport;
  if (kind == KvTransportKind::kTcp) {
    LOG(INFO) << "KV transport: tcp";
    return nullptr;
  }
  if (!engine.kv_pool_on_device()) {
    if (kind == KvTransportKind::kIpc) {
      return absl::FailedPreconditionError(
          "--kv-transport ipc needs the KV pool on a GPU (--backend cuda); use tcp or auto");
    }
    LOG(INFO) << "KV transport: tcp (auto; the KV pool is host memory)";
    return nullptr;
  }
  absl::StatusOr<std::unique_ptr<KvIpcDevice>> ipc = MakeCudaKvIpc();
  if (!ipc.ok()) {
    if (kind == KvTransportKind::kIpc) return ipc.status();
    LOG(WARNING) << "KV transport: tcp (auto; no CUDA IPC: " << ipc.status() << ")";
    return nullptr;
  }
  LOG(INFO) << "KV transport: " << KvTransportKindName(kind)
            << " (CUDA IPC where the peer's pool can be mapped)";
  return std::shared_ptr<KvIpcDevice>(*std::move(ipc));
}

}  // namespace tandem
