#include "router/registry_service.h"

namespace tandem::router {

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

grpc::Status RegistryService::Register(grpc::ServerContext*,
                                       const tandem::v1::RegisterRequest* request,
                                       tandem::v1::RegisterResponse* response) {
  absl::StatusOr<tandem::v1::RegisterResponse> result = registry_->Register(*request);
  if (!result.ok()) return ToGrpc(result.status());
  *response = *std::move(result);
  return grpc::Status::OK;
}

grpc::Status RegistryService::Heartbeat(grpc::ServerContext*,
                                        const tandem::v1::HeartbeatRequest* request,
                                        tandem::v1::HeartbeatResponse* response) {
  *response = registry_->Heartbeat(*request);
  return grpc::Status::OK;
}

}  // namespace tandem::router
