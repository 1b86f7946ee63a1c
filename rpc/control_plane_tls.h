// Mutual TLS on the control plane (optional, on top of the cluster token): every process of a
// deployment holds the deployment CA's certificate and a certificate of its own that the CA
// signed (deploy/launcher/deployment_ca.h makes them per `tandem serve`). A worker's gRPC port
// then takes only TLS connections whose client presents a certificate of that CA; the router
// serves its WorkerRegistry only on a second port of that kind (--control-plane-port), its
// public Generation API staying on --grpc-port; and every control-plane client (the router's
// channels to the workers, the workers' channel to the registry) presents its certificate and
// checks the server's. A client without a certificate, or with one of another CA, fails the TLS
// handshake: its call ends UNAVAILABLE and reaches no handler.
//
// Certificates name the peer kControlPlaneTlsName (their subjectAltName), not a host: clients
// check that name whatever address they dial, so a deployment's addresses may change freely.
// The KV transfer's TCP connections are not TLS (they carry the token in their hello).
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace tandem {

inline constexpr char kControlPlaneTlsName[] = "tandem-control-plane";

// One process's TLS material, PEM text. All empty: TLS is off.
struct ControlPlaneTls {
  std::string ca_pem;    // the deployment CA: peers' certificates must chain to it
  std::string cert_pem;  // this process's certificate (used as server and as client)
  std::string key_pem;   // its private key
  bool enabled() const { return !ca_pem.empty(); }
};

// Reads the three PEM files (the --tls-ca, --tls-cert and --tls-key flags). All three empty:
// TLS off. InvalidArgument naming the flag and file when only some are given, when one cannot be
// read or holds no PEM block of the kind expected, or when the key file may be read by group or
// others.
absl::StatusOr<ControlPlaneTls> LoadControlPlaneTls(const std::string& ca_file,
                                                    const std::string& cert_file,
                                                    const std::string& key_file);

// Server credentials: mutual TLS (a client certificate of the CA required and verified) when
// `tls` is enabled, insecure otherwise.
std::shared_ptr<grpc::ServerCredentials> ControlPlaneServerCredentials(const ControlPlaneTls& tls);
// Channel credentials: TLS with this process's certificate, checking the server's against the
// CA, when `tls` is enabled (the channel also needs ApplyControlPlaneTlsArgs); insecure otherwise.
std::shared_ptr<grpc::ChannelCredentials> ControlPlaneChannelCredentials(
    const ControlPlaneTls& tls);
// Has the channel check kControlPlaneTlsName in the server's certificate (when `tls` is enabled).
void ApplyControlPlaneTlsArgs(const ControlPlaneTls& tls, grpc::ChannelArguments& args);

// Whether the call came over TLS from a peer whose certificate the server verified (on a port of
// ControlPlaneServerCredentials with TLS enabled, every call; on an insecure port, none).
bool PeerHasVerifiedCertificate(const grpc::ServerContext& context);

}  // namespace tandem
