// The router's WorkerRegistry gRPC service (worker.proto): Register and Heartbeat, forwarded to
// the WorkerRegistry. Protocol or model mismatches come back as FAILED_PRECONDITION.
#pragma once

#include "router/worker_registry.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router {

class RegistryService final : public tandem::v1::WorkerRegistry::Service {
 public:
  explicit RegistryService(WorkerRegistry* registry) : registry_(registry) {}

  grpc::Status Register(grpc::ServerContext* context, const tandem::v1::RegisterRequest* request,
                        tandem::v1::RegisterResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const tandem::v1::HeartbeatRequest* request,
                         tandem::v1::HeartbeatResponse* response) override;

 private:
  WorkerRegistry* registry_;
};

// absl::Status → grpc::Status (same code numbers).
grpc::Status ToGrpc(const absl::Status& status);

}  // namespace tandem::router
