// RunWorker: the whole life of a worker process, shared by tandem-prefill-worker and
// tandem-decode-worker: parse flags, build the engine, start the gRPC service, the engine loop,
// metrics and registration; on SIGTERM / SIGINT drain (refuse new work, tell the router, let
// in-flight requests finish up to --drain-timeout-ms) and exit 0. A worker whose engine broke
// (WorkerService::health) keeps running, unhealthy and unregistered, until stopped.
#pragma once

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "worker/worker_service.h"

namespace tandem {

using ServiceFactory =
    std::function<absl::StatusOr<std::unique_ptr<WorkerService>>(const WorkerEnv& env)>;

// Returns the process exit code.
int RunWorker(int argc, char** argv, WorkerRole default_role, const ServiceFactory& make_service);

}  // namespace tandem
