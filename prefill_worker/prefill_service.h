// PrefillService: the prefill role. Prefill(request, destination) queues a prefill-only engine
// request; when its prompt is computed the first token is streamed at once, the request's KV
// pages are pushed into the decode worker's reservation (on a transfer thread, layer by layer),
// and once decode acknowledges them the pages are freed and the stream ends with transfer_done.
//
// Per-request state machine (loop thread only):
//   kInEngine     queued or prefilling           --kPrefillDone--> kTransferring
//                                                 --stop/length/abort/error--> gone
//   kTransferring pages held, sender pushing      --ack or failure--> pages released, gone
// Abort / client cancel: kInEngine -> Engine::Abort; kTransferring -> the transfer is aborted
// (the decode side sees TransferAbort) and the pages are released when the sender returns.
// If the engine breaks, every stream ends at once with INTERNAL, as a failed batch's do
// (FailAllOnLoop; transfers in flight are aborted).
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "comm/kv_transport.h"
#include "worker/worker_service.h"

namespace tandem {

class PrefillService : public WorkerService {
 public:
  PrefillService(const WorkerEnv& env, std::unique_ptr<KvSender> sender, int num_transfer_threads);
  ~PrefillService() override;

  EngineLoop::Handlers Handlers() override;
  void Stop() override;

  grpc::Status Prefill(grpc::ServerContext* ctx, const tandem::v1::PrefillRequest* req,
                       grpc::ServerWriter<tandem::v1::PrefillEvent>* writer) override;

 protected:
  bool AbortOnLoop(Engine& engine, const std::string& request_id,
                   tandem::v1::AbortReason reason) override;

 private:
  using Channel = EventChannel<tandem::v1::PrefillEvent>;
  enum class Phase { kInEngine, kTransferring };
  struct Request {
    std::shared_ptr<Channel> channel;
    std::optional<tandem::v1::KvDestination> destination;
    int num_prompt_tokens = 0;
    absl::Time arrival;
    Phase phase = Phase::kInEngine;
    std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);
  };
  // One push of a finished prefill's pages (runs on a transfer thread).
  struct TransferJob {
    std::string request_id;
    tandem::v1::KvDestination destination;
    std::vector<int32_t> pages;  // this worker's page ids, prompt order
    const void* pool = nullptr;
    KvLayout layout;
    std::shared_ptr<std::atomic<bool>> cancelled;
  };

  void AddOnLoop(Engine& engine, EngineRequest request, Request state);
  void OnOutput(Engine& engine, const RequestOutput& out, absl::Time step_start);
  void StartTransfer(Engine& engine, const std::string& id, Request& r);
  void OnTransferDone(Engine& engine, const std::string& id, absl::Status status,
                      const KvTransferStats& stats);
  void Finish(const std::string& id, absl::Status status);
  void FailAllOnLoop(Engine& engine, const absl::Status& error) override;
  void TransferThread();
  absl::StatusOr<KvTransferStats> RunTransfer(const TransferJob& job);

  std::unique_ptr<KvSender> sender_;
  absl::flat_hash_map<std::string, Request> requests_;  // loop thread only

  absl::Mutex jobs_mu_;
  std::deque<TransferJob> jobs_ ABSL_GUARDED_BY(jobs_mu_);
  bool stopping_ ABSL_GUARDED_BY(jobs_mu_) = false;
  std::vector<std::thread> transfer_threads_;
};

}  // namespace tandem
