// The public gRPC Generation service (generate.proto) with the HTTP API's semantics: same
// validation (INVALID_ARGUMENT), unknown model (NOT_FOUND), API key in the "authorization"
// metadata (UNAUTHENTICATED), queue full (RESOURCE_EXHAUSTED), no worker / worker died
// (UNAVAILABLE). Callback API: no thread per stream. Cancelling the call aborts the request.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "router/generation_service.h"
#include "router/openai_request.h"
#include "tandem/v1/generate.grpc.pb.h"

namespace tandem::router {

// GenerateRequest → GenerateSpec (tokenized, validated). Pure; request_id left as given.
absl::StatusOr<GenerateSpec> SpecFromProto(const tandem::v1::GenerateRequest& request,
                                           const ModelContext& model);

class GenerationGrpcService final : public tandem::v1::Generation::CallbackService {
 public:
  // Borrowed pointers must outlive the service.
  GenerationGrpcService(ModelContext model, GenerationService* service, std::string api_key);

  grpc::ServerWriteReactor<tandem::v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const tandem::v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const tandem::v1::ListModelsRequest* request,
                                       tandem::v1::ListModelsResponse* response) override;

 private:
  bool Authorized(const grpc::CallbackServerContext& context) const;

  const ModelContext model_;
  GenerationService* service_;
  const std::string api_key_;
};

}  // namespace tandem::router
