// tandem-prefill-worker: computes prompts' KV (chunked prefill), streams the first token and
// pushes the pages to the decode worker the router reserved. See prefill_service.h.
#include <memory>

#include "comm/tcp_kv_sender.h"
#include "prefill_worker/prefill_service.h"
#include "worker/kv_ipc_setup.h"
#include "worker/kv_pool_copy.h"
#include "worker/run_worker.h"

namespace {
// Concurrent outgoing KV transfers (each a blocking TCP stream on the host transport).
constexpr int kTransferThreads = 4;
}  // namespace

int main(int argc, char** argv) {
  return tandem::RunWorker(
      argc, argv, tandem::WorkerRole::kPrefill,
      [](const tandem::WorkerEnv& env) -> absl::StatusOr<std::unique_ptr<tandem::WorkerService>> {
        auto ipc = tandem::KvIpcFor(*env.options, *env.engine);
        if (!ipc.ok()) return ipc.status();
        auto nccl = tandem::NcclFor(*env.options, *env.engine);
        if (!nccl.ok()) return nccl.status();
        return std::make_unique<tandem::PrefillService>(
            env,
            std::make_unique<tandem::TcpKvSender>(
                tandem::PoolCopyFor(env.engine), env.options->cluster_token,
                env.options->kv_transport, *std::move(ipc), *std::move(nccl)),
            kTransferThreads);
      });
}
