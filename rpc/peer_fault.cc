#include "rpc/peer_fault.h"

#include <string>

#include "absl/strings/cord.h"

namespace tandem {
namespace {

constexpr char kPayloadUrl[] = "type.tandem/peer_fault";

}  // namespace

absl::Status MarkPeerFault(absl::Status status, absl::string_view peer) {
  if (!status.ok()) status.SetPayload(kPayloadUrl, absl::Cord(peer));
  return status;
}

bool IsPeerFault(const absl::Status& status) { return status.GetPayload(kPayloadUrl).has_value(); }

void AddPeerFaultTrailer(grpc::ServerContext* context, const absl::Status& status) {
  auto peer = status.GetPayload(kPayloadUrl);
  if (peer.has_value()) context->AddTrailingMetadata(kPeerFaultMetadata, std::string(*peer));
}

bool ReportsPeerFault(const grpc::ClientContext& context) {
  return context.GetServerTrailingMetadata().count(kPeerFaultMetadata) > 0;
}

}  // namespace tandem
