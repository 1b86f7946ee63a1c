// WorkerService: the gRPC Worker service of one worker process (worker.proto), shared shape of
// the prefill, decode and mixed roles. A role implements its RPCs and the engine-loop handlers;
// this base answers GetLoad and Abort (through AbortOnLoop), refuses new work while draining or
// unhealthy, and streams a request's events to its client (StreamEvents).
//
// Health: a worker is healthy until its engine breaks (engine/engine.h, Step(): the backend is
// unusable, e.g. a sticky device error). The role's on_step_error handler calls
// OnEngineBroken: every request the role holds ends with a terminal error (FailAllOnLoop; the
// engine already freed their pages), new work is refused with UNAVAILABLE, and health() turns
// into that error, which the heartbeat carries to the router (worker/router_client.h): the
// router marks the worker down and routes nothing more to it. Only a restart heals it.
//
// Threading: RPC handlers run on gRPC threads and only Post() work to the EngineLoop; all
// per-request state lives in the role's tables, touched only on the loop thread.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "base/clock.h"
#include "rpc/peer_fault.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "worker/engine_loop.h"
#include "worker/event_channel.h"
#include "worker/worker_metrics.h"
#include "worker/worker_options.h"

namespace tandem {

// What a role's service gets at construction.
struct WorkerEnv {
  const WorkerOptions* options = nullptr;
  WorkerMetrics* metrics = nullptr;  // null when metrics are off
  // Before the loop takes it: for constants (kv_pool, kv_layout, config) only; never call its
  // mutating methods outside loop tasks.
  Engine* engine = nullptr;
  // Request timestamps, reservation TTLs and KV transfer deadlines; the loop's clock too.
  Clock* clock = Clock::Real();
};

grpc::Status ToGrpc(const absl::Status& status);

class WorkerService : public tandem::v1::Worker::Service {
 public:
  explicit WorkerService(const WorkerEnv& env) : env_(env) {}
  ~WorkerService() override = default;

  // Wires the loop in (once, before serving).
  void Attach(EngineLoop* loop) { loop_ = loop; }
  virtual EngineLoop::Handlers Handlers() = 0;
  // Stops the role's own threads (transport, transfer workers) so that nothing posts to the
  // loop any more. Called after the gRPC server stopped, while the loop still runs.
  virtual void Stop() {}
  // This worker registered again with the router (it restarted, or had marked this worker down
  // and failed its requests): state only that router could still use, made before `cutoff`, is
  // dead. The decode role drops the unclaimed reservations (which would otherwise hold their
  // pages until their TTL); streams need nothing (a router gone cancels them). Thread-safe.
  virtual void ForgetRouterStateBefore(absl::Time cutoff) {}
  // Where KV pushes land (decode, mixed); empty otherwise.
  virtual std::string kv_transfer_address() const { return ""; }
  // Requests this worker holds any state for (queued, running, transferring, reserved).
  int NumLive() const { return num_live_.load(); }
  // From now on new work is refused with UNAVAILABLE; in-flight requests finish.
  void StartDraining() { draining_ = true; }
  bool draining() const { return draining_.load(); }
  // OK, or the error that broke the engine (then for good). Thread-safe.
  absl::Status health() const;
  // Called on the loop thread right after the worker turned unhealthy (the process shell wakes
  // its heartbeat with it). Thread-safe; null clears it.
  void SetUnhealthyListener(std::function<void()> listener);
  tandem::v1::LoadReport Load() const;
  // The prefix cache's page hashes for the router (at most kMaxPublishedHashes of them).
  void PrefixCache(tandem::v1::PrefixCacheSummary* out) const;
  uint64_t PrefixCacheVersion() const;
  static constexpr int kMaxPublishedHashes = 1 << 18;  // 2 MiB of hashes per heartbeat

  // Every RPC handler's first step: UNAUTHENTICATED unless the call carries the cluster token.
  grpc::Status Authenticate(const grpc::ServerContext* ctx) const;

  grpc::Status GetLoad(grpc::ServerContext* ctx, const tandem::v1::GetLoadRequest* req,
                       tandem::v1::LoadReport* resp) override;
  grpc::Status Abort(grpc::ServerContext* ctx, const tandem::v1::AbortRequest* req,
                     tandem::v1::AbortResponse* resp) override;

 protected:
  // On the loop thread: drops everything held for `request_id`; true if anything was.
  virtual bool AbortOnLoop(Engine& engine, const std::string& request_id,
                           tandem::v1::AbortReason reason) = 0;
  // On the loop thread: ends sequence `sequence` of `request_id` only (worker.proto, "Sibling
  // sequences"); true if it was live. Roles without siblings hold none: false.
  virtual bool AbortSequenceOnLoop(Engine& engine, const std::string& request_id, int sequence) {
    return false;
  }
  // UNAVAILABLE while unhealthy or draining, else OK.
  grpc::Status AdmitNew() const;
  // The roles' on_step_error handler (EngineLoop::Handlers): the engine broke. Records the
  // error, has the role end every request (FailAllOnLoop) and tells the listener.
  void OnEngineBroken(Engine& engine, const absl::Status& error);
  // On the loop thread, once the engine broke: ends every request the role holds with a
  // terminal error naming `error` (a failed stream, or the error event a failed batch gets)
  // and forgets it. The engine already freed their pages.
  virtual void FailAllOnLoop(Engine& engine, const absl::Status& error) = 0;
  // The message clients get for a request the broken engine ended.
  static std::string EngineFailureMessage(const absl::Status& error);

  // Pumps `channel` to `writer` until it closes; a client that goes away (or a failed write)
  // aborts the request on the loop and returns CANCELLED. Blocks the calling gRPC thread.
  template <typename Event>
  grpc::Status StreamEvents(grpc::ServerContext* ctx, grpc::ServerWriter<Event>* writer,
                            EventChannel<Event>& channel, const std::string& request_id);

  WorkerEnv env_;
  EngineLoop* loop_ = nullptr;
  std::atomic<int> num_live_{0};  // written on the loop thread
  std::atomic<bool> draining_{false};

 private:
  mutable absl::Mutex health_mu_;
  absl::Status health_ ABSL_GUARDED_BY(health_mu_);
  std::function<void()> unhealthy_listener_ ABSL_GUARDED_BY(health_mu_);
};

template <typename Event>
grpc::Status WorkerService::StreamEvents(grpc::ServerContext* ctx,
                                         grpc::ServerWriter<Event>* writer,
                                         EventChannel<Event>& channel,
                                         const std::string& request_id) {
  // How often a blocked handler checks for a client that went away.
  constexpr absl::Duration kCancelPoll = absl::Milliseconds(20);
  Event event;
  absl::Status final_status;
  while (true) {
    switch (channel.Next(&event, &final_status, kCancelPoll)) {
      case EventChannel<Event>::Result::kEvent:
        if (writer->Write(event)) continue;
        break;  // the client is gone
      case EventChannel<Event>::Result::kClosed:
        AddPeerFaultTrailer(ctx, final_status);  // the router must not blame this worker
        return ToGrpc(final_status);
      case EventChannel<Event>::Result::kTimeout:
        if (!ctx->IsCancelled()) continue;
        break;
    }
    loop_->Post([this, request_id](Engine& e) {
      AbortOnLoop(e, request_id, tandem::v1::ABORT_REASON_CLIENT_CANCELLED);
    });
    return grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled the stream");
  }
}

}  // namespace tandem
