// Picks a worker's KV data paths (WorkerOptions::kv_transport, comm/kv_ipc.h) for its engine's
// pool: the CUDA IPC device when the pool is on a GPU and IPC is asked for (ipc) or allowed
// (auto), null otherwise; the NCCL transport likewise for nccl / auto. ipc or nccl with a host
// pool, or in a build without CUDA (or without libnccl, for nccl), is FailedPrecondition /
// Unimplemented saying so: the worker does not start. The choice is logged; which path each
// transfer took is in the KV metrics (KvTransferStats::path) and logged per peer by the sender.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "comm/kv_ipc.h"
#include "comm/nccl_kv_transport.h"
#include "engine/engine.h"
#include "worker/worker_options.h"

namespace tandem {

absl::StatusOr<std::shared_ptr<KvIpcDevice>> KvIpcFor(const WorkerOptions& options,
                                                      const Engine& engine);
absl::StatusOr<std::shared_ptr<NcclKvTransport>> NcclFor(const WorkerOptions& options,
                                                         Engine& engine);

}  // namespace tandem
