// Failure attribution between the two workers of a pair (finding 4 of [hardening]). A worker
// that fails a request because of the *other* worker — its KV transfer to / from that worker
// failed — says so: the absl::Status it ends the request with carries a payload
// (MarkPeerFault), which the worker's gRPC handler turns into the trailing metadata
// "x-tandem-peer-fault" (AddPeerFaultTrailer). The router then does not take the answering worker
// for unreachable (it answered), and does not take the peer down on its word either: the peer's
// own calls and heartbeats decide. So one bad worker cannot take the healthy ones out of
// rotation.
#pragma once

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tandem {

inline constexpr char kPeerFaultMetadata[] = "x-tandem-peer-fault";

// `status` (not OK) marked as caused by the peer worker; `peer` names it ("decode", "prefill").
absl::Status MarkPeerFault(absl::Status status, absl::string_view peer);
bool IsPeerFault(const absl::Status& status);
// Server side: adds the trailer when `status` is marked.
void AddPeerFaultTrailer(grpc::ServerContext* context, const absl::Status& status);
// Client side, after the call ended: whether the worker blamed its peer.
bool ReportsPeerFault(const grpc::ClientContext& context);

}  // namespace tandem
