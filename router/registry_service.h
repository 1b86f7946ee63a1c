// The router's WorkerRegistry gRPC service (worker.proto): Register and Heartbeat, forwarded to
// the WorkerRegistry. Protocol or model mismatches come back as FAILED_PRECONDITION; a call
// without the cluster token (when one is set) as UNAUTHENTICATED, before anything else.
#pragma once

#include <string>
#include <utility>

#include "router/worker_registry.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router {

class RegistryService final : public tandem::v1::WorkerRegistry::Service {
 public:
  // `require_certificate`: mutual TLS is on, and only calls over it (the control-plane port, a
  // verified client certificate) are served; the others get UNAUTHENTICATED.
  RegistryService(WorkerRegistry* registry, std::string cluster_token,
                  bool require_certificate = false)
      : registry_(registry),
        cluster_token_(std::move(cluster_token)),
        require_certificate_(require_certificate) {}

  grpc::Status Register(grpc::ServerContext* context, const tandem::v1::RegisterRequest* request,
                        tandem::v1::RegisterResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const tandem::v1::HeartbeatRequest* request,
                         tandem::v1::HeartbeatResponse* response) override;

 private:
  WorkerRegistry* registry_;
  const std::string cluster_token_;
  const bool require_certificate_;
};

// absl::Status → grpc::Status (same code numbers).
grpc::Status ToGrpc(const absl::Status& status);

}  // namespace tandem::router
