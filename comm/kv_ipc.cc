// The KV transport kinds' names (kv_ipc.h).
#include "comm/kv_ipc.h"

#include "absl/strings/str_cat.h"

namespace tandem {

absl::StatusOr<KvTransportKind> ParseKvTransportKind(const std::string& name) {
  if (name == "tcp") return KvTransportKind::kTcp;
  if (name == "ipc") return KvTransportKind::kIpc;
  if (name == "nccl") return KvTransportKind::kNccl;
  if (name == "auto") return KvTransportKind::kAuto;
  return absl::InvalidArgumentError(
      absl::StrCat("kv_transport '", name, "': expected tcp, ipc, nccl or auto"));
}

const char* KvTransportKindName(KvTransportKind kind) {
  switch (kind) {
    case KvTransportKind::kTcp:
      return "tcp";
    case KvTransportKind::kIpc:
      return "ipc";
    case KvTransportKind::kNccl:
      return "nccl";
    case KvTransportKind::kAuto:
      return "auto";
  }
  return "?";
}

}  // namespace tandem
