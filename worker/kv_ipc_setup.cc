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
  if (kind == KvTransportKind::kNccl) return nullptr;  // NcclFor
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

absl::StatusOr<std::shared_ptr<NcclKvTransport>> NcclFor(const WorkerOptions& options,
                                                         Engine& engine) {
  const KvTransportKind kind = options.kv_transport;
  if (kind != KvTransportKind::kNccl && kind != KvTransportKind::kAuto) return nullptr;
  const bool required = kind == KvTransportKind::kNccl;
  if (!engine.kv_pool_on_device()) {
    if (required) {
      return absl::FailedPreconditionError(
          "--kv-transport nccl needs the KV pool on a GPU (--backend cuda); use tcp or auto");
    }
    return nullptr;  // KvIpcFor logged the choice
  }
  absl::StatusOr<std::shared_ptr<NcclApi>> api = MakeCudaNccl();
  absl::StatusOr<std::shared_ptr<NcclKvTransport>> nccl =
      api.ok() ? NcclKvTransport::Create(*std::move(api), engine.kv_pool())
               : absl::StatusOr<std::shared_ptr<NcclKvTransport>>(api.status());
  if (!nccl.ok()) {
    if (required) {
      return absl::Status(nccl.status().code(),
                          absl::StrCat("--kv-transport nccl: ", nccl.status().message()));
    }
    LOG(WARNING) << "KV transport auto: no NCCL (" << nccl.status()
                 << "); peers on other GPUs use CUDA IPC where they can map the pool, else TCP";
    return nullptr;
  }
  LOG(INFO) << "KV transport: " << KvTransportKindName(kind)
            << " (NCCL where the peer's pool is on another GPU; this pool is on "
            << (*nccl)->device_id() << ")";
  return *std::move(nccl);
}

}  // namespace tandem
