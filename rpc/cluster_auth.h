// The cluster token on gRPC (base/cluster_token.h; mutual TLS on top where the deployment has
// it: rpc/control_plane_tls.h): clients attach it to every call of a
// channel as metadata (a client interceptor, so no call site can forget it); servers check it
// first thing in every handler of an internal service (the router's WorkerRegistry, every
// worker's Worker service) and answer UNAUTHENTICATED, doing nothing, when it is missing or
// wrong. gRPC 1.51's insecure server credentials take no AuthMetadataProcessor, hence the
// per-handler check; router_hardening_test and worker_pair_test call every method of both
// services without the token.
//
// The channel arguments are those of every control-plane channel: keepalive pings the servers
// here accept (ControlPlaneServerArgs), and reconnect backoff short enough that a peer that
// restarted is reached again within about a second.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <string_view>

#include "rpc/control_plane_tls.h"

namespace tandem {

inline constexpr char kClusterTokenMetadata[] = "x-tandem-cluster-token";

// Keepalive every 5 s (3 s timeout), even without calls; reconnect after 100 ms, backing off to
// at most 1 s (gRPC's default: 1 s, then up to 120 s).
grpc::ChannelArguments ControlPlaneChannelArgs();
// What a control-plane server needs so that ControlPlaneChannelArgs' pings are not refused
// ("too_many_pings"): pings without calls permitted, at most one per second expected.
void ApplyControlPlaneServerArgs(grpc::ServerBuilder& builder);

// A worker's server pings its clients (the router) every kServerKeepaliveTime and closes a
// connection whose ping is not acknowledged within kServerKeepaliveTimeout: a router that froze
// (SIGSTOP) or vanished without a FIN is noticed within about 4 s, its calls on that connection
// are cancelled, and the worker aborts their requests (WorkerService::StreamEvents polls
// IsCancelled), freeing their pages. Clients accept any ping rate (gRPC's ping-abuse policy is
// the server's), so this needs nothing of them.
inline constexpr int kServerKeepaliveTimeMs = 2000;
inline constexpr int kServerKeepaliveTimeoutMs = 2000;
void ApplyServerKeepalive(grpc::ServerBuilder& builder);

// A channel to `address` with `args`; every call carries `token` (none when empty). Mutual TLS
// with `tls`'s certificate when it is enabled (rpc/control_plane_tls.h), insecure otherwise.
std::shared_ptr<grpc::Channel> ClusterChannel(const std::string& address, const std::string& token,
                                              const grpc::ChannelArguments& args,
                                              const ControlPlaneTls& tls = {});

// OK when the call carries `token`, UNAUTHENTICATED otherwise. An empty `token` means the
// control plane runs unauthenticated (in-process tests, or a binary started with
// --insecure-no-cluster-token): everything passes.
grpc::Status CheckClusterToken(const grpc::ServerContext& context, std::string_view token);
// The same, and with `require_certificate` (mutual TLS on) also UNAUTHENTICATED unless the call
// came over TLS with a verified client certificate (a call on a port without TLS, such as the
// router's public --grpc-port, has none).
grpc::Status CheckControlPlaneCall(const grpc::ServerContext& context, std::string_view token,
                                   bool require_certificate);

}  // namespace tandem
