// Picks a worker's KV data path (WorkerOptions::kv_transport, comm/kv_ipc.h) for its engine's
// pool: the CUDA IPC device when the pool is on a GPU and IPC is asked for (ipc) or allowed
// (auto), null for TCP. ipc with a host pool, or in a build without CUDA, is FailedPrecondition
// / Unimplemented saying so: the worker does not start. The choice is logged.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "comm/kv_ipc.h"
#include "engine/engine.h"
#include "worker/worker_options.h"

namespace tandem {

absl::StatusOr<std::shared_ptr<KvIpcDevice>> KvIpcFor(const WorkerOptions& options,
                                                      const Engine& engine);

}  // namespace tandem
