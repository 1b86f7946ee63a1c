// RouterClient: registers this worker with the router's WorkerRegistry and heartbeats with a
// load report. Keeps doing so for the life of the process: if the router is unreachable it
// retries; if a heartbeat answers `reregister` (router restarted, or it had marked us down) it
// registers again. A refused registration (FAILED_PRECONDITION: protocol or model mismatch;
// UNAUTHENTICATED: not the router's cluster token) is logged loudly and retried slowly: the
// operator must fix the deployment. An unhealthy worker
// (Options::health not OK) says so in its heartbeats, so the router marks it down, and never
// registers again: only a restart heals it.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "rpc/control_plane_tls.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem {

class RouterClient {
 public:
  struct Options {
    std::string router_address;         // host:port of the router's gRPC server
    std::string cluster_token;          // carried by every call (rpc/cluster_auth.h)
    ControlPlaneTls tls;                // mutual TLS to the router when enabled
    tandem::v1::RegisterRequest hello;  // everything but the load report
    std::function<tandem::v1::LoadReport()> load;
    std::function<bool()> draining;
    std::function<absl::Status()> health;  // null: always healthy
    Clock* clock = Clock::Real();          // heartbeat and retry intervals; outlives the client
    // After each registration but the first, with the clock's time the Register call started.
    std::function<void(absl::Time)> on_reregistered = nullptr;
  };

  explicit RouterClient(Options options);
  ~RouterClient();  // stops the heartbeat thread

  // KV-aware routing; call before Start (not called: no prefix cache to publish). `version`
  // reads the current version of the prefix cache's page hashes, `fill` writes a summary of
  // them. The first heartbeat after a registration and every heartbeat after the version moved
  // carry the summary; the others leave it out.
  void PublishPrefixCache(std::function<uint64_t()> version,
                          std::function<void(tandem::v1::PrefixCacheSummary*)> fill);
  void Start();
  // Sends a heartbeat now (e.g. to announce draining) instead of at the next interval.
  void Wake();
  bool registered() const;
  // Number of successful registrations so far (a re-registration counts again).
  int registrations() const;

 private:
  void Run();
  bool Register();
  void Heartbeat();
  absl::Status Health() const;

  Options options_;
  std::function<uint64_t()> prefix_cache_version_;  // set before Start: read-only after
  std::function<void(tandem::v1::PrefixCacheSummary*)> prefix_cache_;
  std::unique_ptr<tandem::v1::WorkerRegistry::Stub> stub_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  int registrations_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration interval_ ABSL_GUARDED_BY(mu_) = absl::Milliseconds(500);
  int missed_limit_ ABSL_GUARDED_BY(mu_) = 3;
  int failed_heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  // The prefix-cache version the router last accepted in this epoch (cache_sent_: any at all).
  bool cache_sent_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t cache_sent_version_ ABSL_GUARDED_BY(mu_) = 0;
  bool said_unhealthy_ = false;  // heartbeat thread only: logged why it stays unregistered
};

}  // namespace tandem
