#include "router/registry_service.h"

#include "rpc/cluster_auth.h"

namespace tandem::router {

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

grpc::Status RegistryService::Register(grpc::ServerContext* context,
                                       const tandem::v1::RegisterRequest* request,
                                       tandem::v1::RegisterResponse* response) {
  if (grpc::Status auth = CheckControlPlaneCall(*context, cluster_token_, require_certificate_);
      !auth.ok())
    return auth;
  absl::StatusOr<tandem::v1::RegisterResponse> result = registry_->Register(*request);
  if (!result.ok()) return ToGrpc(result.status());
  *response = *std::move(result);
  return grpc::Status::OK;
}

grpc::Status RegistryService::Heartbeat(grpc::ServerContext* context,
                                        const tandem::v1::HeartbeatRequest* request,
                                        tandem::v1::HeartbeatResponse* response) {
  if (grpc::Status auth = CheckControlPlaneCall(*context, cluster_token_, require_certificate_);
      !auth.ok())
    return auth;
  absl::StatusOr<tandem::v1::HeartbeatResponse> result = registry_->Heartbeat(*request);
  if (!result.ok()) return ToGrpc(result.status());
  *response = *std::move(result);
  return grpc::Status::OK;
}

}  // namespace tandem::router
