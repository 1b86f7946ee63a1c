// tandem-prefill-worker: computes prompts' KV (chunked prefill), streams the first token and
// pushes the pages to the decode worker the router reserved. See prefill_service.h.
#include <memory>

#include "comm/tcp_kv_sender.h"
#include "prefill_worker/prefill_service.h"
#include "worker/kv_group_shape.h"
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
        auto sender = std::make_unique<tandem::TcpKvSender>(
            tandem::PoolCopyFor(env.engine), env.options->cluster_token, env.options->kv_transport,
            *std::move(ipc), *std::move(nccl));
        // The hello names the group: a decode group of other TP / PP sizes maps the pages.
        auto group = tandem::KvGroupShapeFor(env.options->engine, *env.engine);
        if (!group.ok()) return group.status();
        if (absl::Status st = sender->SetGroupShape(*group); !st.ok()) return st;
        return std::make_unique<tandem::PrefillService>(env, std::move(sender), kTransferThreads);
      });
}
