// Conversions between the router's request types and worker.proto messages.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/status/status.h"
#include "router/generate_spec.h"
#include "tandem/v1/worker.pb.h"

namespace tandem::router {

tandem::v1::SamplingParams ToProto(const SamplingSpec& sampling);

// A failed worker call as the client sees it: a rejected argument stays InvalidArgument (400);
// anything else means the worker could not serve the request: Unavailable (503).
absl::Status WorkerCallError(const grpc::Status& status, const std::string& worker_id,
                             const char* what);

}  // namespace tandem::router
