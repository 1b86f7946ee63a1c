// PrefillService: the prefill role. Prefill(request, destination) queues a prefill-only engine
// request; its KV pages are pushed into the decode worker's reservation on a transfer thread,
// the first token is streamed as soon as it is sampled, and once decode acknowledges every page
// the pages are freed and the stream ends with transfer_done.
//
// Layer-wise push (default; WorkerOptions::kv_layerwise_push): the engine announces the step
// that computes a prompt's final chunk and reports each layer as it is stored
// (engine/kv_push.h, the rule for chunked prefill is there); a transfer thread sends layer l
// (SendLayer over all the prompt's pages) while the engine computes layers l + 1.., and sends
// Finish only once the request ended with kPrefillDone. Off: the whole prompt is pushed after
// kPrefillDone. Either way the source pages are never reused before their send completed: the
// engine frees an announced request's pages only after BeforeFree, which abandons the push
// and waits for the page read in progress (one SendLayer at most; over CUDA IPC, the copies
// enqueued so far: the op's Abort waits for them).
//
// Per-request state machine (loop thread only):
//   kInEngine     queued or prefilling (final chunk: push running) --kPrefillDone--> kTransferring
//                                                 --stop/length/abort/error--> push abandoned, gone
//   kTransferring pages held, sender pushing      --ack or failure--> pages released, gone
// Abort / client cancel: kInEngine -> Engine::Abort; kTransferring -> the transfer is aborted
// (the decode side sees TransferAbort) and the pages are released when the sender returns.
// The sender observes the abort inside its blocking waits too (KvSender::Begin's cancel
// check), so a transfer stalled on a frozen decode worker gives its pages back within
// milliseconds of the abort, not at --kv-transfer-timeout-ms.
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
#include "absl/container/flat_hash_set.h"
#include "comm/kv_transport.h"
#include "engine/kv_push.h"
#include "worker/worker_service.h"

namespace tandem {

class PrefillService : public WorkerService, private KvPushListener {
 public:
  // With env.options->kv_layerwise_push, installs itself as env.engine's KvPushListener (before
  // the loop runs the engine).
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
  // One layer-wise push, shared by the loop thread (which publishes stored layers and the
  // outcome) and the transfer thread that sends it.
  struct Push {
    enum class Outcome { kPending, kCommit, kAbandon };
    absl::Mutex mu;
    int layers_stored ABSL_GUARDED_BY(mu) = 0;      // layers [0, layers_stored) may be sent
    std::vector<void*> events ABSL_GUARDED_BY(mu);  // per layer: KvPushListener's event
    // kCommit: the request ended kPrefillDone (send Finish once every layer went); kAbandon: its
    // pages are being freed, or the worker stops (abort the transfer, read no more pages).
    Outcome outcome ABSL_GUARDED_BY(mu) = Outcome::kPending;
    // A SendLayer is reading the pages now; with device copies ordered after events
    // (KvSendOp::OrdersAfterEvents), from the first layer enqueued until the op ended.
    bool reading ABSL_GUARDED_BY(mu) = false;
    // outcome == kAbandon, readable without `mu`: the transfer's socket waits observe it, so a
    // SendLayer blocked on a silent peer ends at once and BeforeFree's wait stays short.
    std::atomic<bool> abandoned{false};
    // When the prompt's result reached the host (its step ended): the transfer time after it is
    // the exposed part (WorkerMetrics::ObserveKvExposed).
    absl::Time computed ABSL_GUARDED_BY(mu) = absl::InfiniteFuture();
  };
  struct Request {
    std::shared_ptr<Channel> channel;
    std::optional<tandem::v1::KvDestination> destination;
    int num_prompt_tokens = 0;
    absl::Time arrival;
    Phase phase = Phase::kInEngine;
    std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);
    std::shared_ptr<Push> push;  // layer-wise: set when its final chunk was announced
  };
  // One push of a finished prefill's pages (runs on a transfer thread).
  struct TransferJob {
    std::string request_id;
    tandem::v1::KvDestination destination;
    std::vector<int32_t> pages;  // this worker's page ids, prompt order
    const void* pool = nullptr;
    KvLayout layout;
    std::shared_ptr<std::atomic<bool>> cancelled;
    std::shared_ptr<Push> push;  // null: all layers are stored (sent after kPrefillDone)
  };

  // KvPushListener (loop thread, inside Engine::Step or where the engine frees pages).
  void OnPushBegin(const std::vector<KvPush>& pushes) override;
  void OnLayerStored(int layer, void* event) override;
  void BeforeFree(const std::string& id) override;

  void AddOnLoop(Engine& engine, EngineRequest request, Request state);
  void OnOutput(Engine& engine, const RequestOutput& out, absl::Time step_start);
  void StartTransfer(Engine& engine, const std::string& id, Request& r);
  // `exposed`: the transfer's time not overlapped with the prompt's compute (Push::computed).
  void OnTransferDone(Engine& engine, const std::string& id, const Push* push, absl::Status status,
                      const KvTransferStats& stats, absl::Duration exposed);
  void Finish(const std::string& id, absl::Status status);
  void FailAllOnLoop(Engine& engine, const absl::Status& error) override;
  void TransferThread();
  absl::StatusOr<KvTransferStats> RunTransfer(const TransferJob& job);
  // Marks a push abandoned (both its outcome and its atomic flag).
  static void AbandonLocked(Push& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p.mu);
  // Sends layer `layer` of a layer-wise push once it is stored; Aborted if abandoned first.
  absl::Status SendStoredLayer(const TransferJob& job, KvSendOp& op, int layer);
  void EnqueueJob(TransferJob job);

  std::unique_ptr<KvSender> sender_;
  const bool layerwise_;
  const void* const kv_pool_;  // the engine's (constant from construction)
  const KvLayout kv_layout_;
  absl::flat_hash_map<std::string, Request> requests_;  // loop thread only
  std::vector<std::shared_ptr<Push>> step_pushes_;      // this step's (OnPushBegin); loop only

  absl::Mutex jobs_mu_;
  std::deque<TransferJob> jobs_ ABSL_GUARDED_BY(jobs_mu_);
  bool stopping_ ABSL_GUARDED_BY(jobs_mu_) = false;
  std::atomic<bool> stop_transfers_{false};  // set by Stop: transfers in flight give up at once
  // Pushes a transfer thread is running (Stop abandons them). Lock order: jobs_mu_, Push::mu.
  absl::flat_hash_set<Push*> active_pushes_ ABSL_GUARDED_BY(jobs_mu_);
  std::vector<std::thread> transfer_threads_;
};

}  // namespace tandem
