// WorkerRegistry: the workers the router knows, their health and their last load report.
//
// Workers Register (protocol version and model identity checked; a mismatch is refused with
// FAILED_PRECONDITION and a message naming both sides) and then Heartbeat. A worker whose last
// heartbeat is older than missed_heartbeats_limit * heartbeat_interval is marked down, as is one
// an RPC found unreachable (ReportUnreachable), as is one whose heartbeat reports it unhealthy
// (unhealthy_reason: its engine failed for good); a down worker gets no new requests, and the
// down-listener fails the requests in flight on it. The next heartbeat of a down or unknown
// worker is answered with reregister = true; a new registration (new epoch) replaces the old
// entry and, if the old one was still up, counts as the old one going down (it restarted).
// Only the instance that holds a worker id (RegisterRequest.instance_id) may renew it while it
// is up: another instance's Register is refused with AlreadyExists and its Heartbeat with
// PermissionDenied, changing nothing, until the holder is marked down (missed heartbeats,
// unreachable, unhealthy). A restarted worker (a new instance) therefore registers once the
// router has noticed the old one is gone: at most missed_heartbeats_limit * heartbeat_interval.
//
// Thread-safe. The listener is called without the registry lock held.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "rpc/control_plane_tls.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router {

using WorkerStub = tandem::v1::Worker::StubInterface;

// The page hashes a worker's prefix cache held at its last summary (worker.proto
// PrefixCacheSummary), for KV-aware routing. Immutable once built: snapshots share it.
struct WorkerPrefixCache {
  uint64_t version = 0;
  int page_size = 0;
  bool truncated = false;
  absl::flat_hash_set<uint64_t> hashes;
};

// A copy of one worker's state, for routing decisions and reports.
struct WorkerSnapshot {
  std::string id;
  uint64_t epoch = 0;
  tandem::v1::WorkerRole role = tandem::v1::WORKER_ROLE_UNSPECIFIED;
  std::string address;
  std::string kv_transfer_address;
  std::string instance_id;
  tandem::v1::LoadReport load;
  tandem::v1::KvPoolInfo kv_pool;  // as registered
  int outstanding = 0;             // requests this router has in flight on the worker
  bool healthy = false;
  bool draining = false;
  // The last prefix-cache summary of this epoch; null: none yet (or no prefix cache).
  std::shared_ptr<const WorkerPrefixCache> prefix_cache;
};

struct RegistryOptions {
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  int missed_heartbeats_limit = 3;
  // Model identity every worker must match; empty name / zero fields are not checked.
  tandem::v1::ModelIdentity expected_model;
  Clock* clock = Clock::Real();  // stamps heartbeats (ExpireStale compares against it)
  // Attached to every call to the workers (rpc/cluster_auth.h); empty: none.
  std::string cluster_token;
  // The router's certificate for mutual TLS to the workers (rpc/control_plane_tls.h); off when
  // empty.
  ControlPlaneTls tls;
};

class WorkerRegistry {
 public:
  using DownListener = std::function<void(const std::string& worker_id, uint64_t epoch)>;
  // Makes the stub used to call a worker at `address` (tests may inject their own).
  using StubFactory = std::function<std::shared_ptr<WorkerStub>(const std::string& address)>;

  explicit WorkerRegistry(RegistryOptions options, StubFactory stub_factory = nullptr);

  absl::StatusOr<tandem::v1::RegisterResponse> Register(const tandem::v1::RegisterRequest& request);
  // PermissionDenied (and no effect) when another instance holds the worker id.
  absl::StatusOr<tandem::v1::HeartbeatResponse> Heartbeat(
      const tandem::v1::HeartbeatRequest& request);

  // Marks workers with no heartbeat since now - limit * interval as down; returns how many.
  int ExpireStale(absl::Time now);
  // An RPC to the worker failed as unreachable: mark it down now (it re-registers when back).
  void ReportUnreachable(const std::string& worker_id, uint64_t epoch);

  std::vector<WorkerSnapshot> Snapshot() const;
  // The stub of a worker's current epoch, or null if unknown / another epoch.
  std::shared_ptr<WorkerStub> Stub(const std::string& worker_id, uint64_t epoch) const;
  // Router-side in-flight accounting used by the routing policy.
  void AddOutstanding(const std::string& worker_id, uint64_t epoch, int delta);

  void SetDownListener(DownListener listener);
  const RegistryOptions& options() const { return options_; }

 private:
  struct Entry {
    WorkerSnapshot state;
    std::shared_ptr<WorkerStub> stub;
    absl::Time last_heartbeat;
  };

  absl::Status CheckCompatible(const tandem::v1::RegisterRequest& request) const;
  // A heartbeat carried an unhealthy_reason: marks that worker down (and notifies).
  void ReportUnhealthy(const tandem::v1::HeartbeatRequest& request);
  // Marks `entry` down; returns true if it was up (the caller then notifies the listener).
  static bool MarkDown(Entry& entry, std::string_view why);
  void Notify(const std::vector<std::pair<std::string, uint64_t>>& down);

  const RegistryOptions options_;
  StubFactory stub_factory_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> workers_ ABSL_GUARDED_BY(mu_);
  uint64_t next_epoch_ ABSL_GUARDED_BY(mu_) = 1;
  DownListener listener_ ABSL_GUARDED_BY(mu_);
};

// The default stub factory: a channel with keepalive pings, so a worker that vanishes without
// closing its connection is noticed within seconds, whose calls carry `cluster_token`.
// With `tls` enabled, over mutual TLS.
std::shared_ptr<WorkerStub> MakeWorkerStub(const std::string& address,
                                           const std::string& cluster_token,
                                           const ControlPlaneTls& tls = {});

}  // namespace tandem::router
