#include "router/worker_registry.h"

#include <grpcpp/grpcpp.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "rpc/cluster_auth.h"

namespace tandem::router {
namespace {

using tandem::v1::HeartbeatRequest;
using tandem::v1::HeartbeatResponse;
using tandem::v1::ModelIdentity;
using tandem::v1::RegisterRequest;
using tandem::v1::RegisterResponse;

// One field of the model identity: mismatch only when both sides set it.
template <typename T>
absl::Status Same(const char* what, const T& router, const T& worker) {
  if (router == T() || worker == T() || router == worker) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("model mismatch: the router serves ", what, " ",
                                                    router, " but the worker has ", worker));
}

}  // namespace

std::shared_ptr<WorkerStub> MakeWorkerStub(const std::string& address,
                                           const std::string& cluster_token,
                                           const ControlPlaneTls& tls) {
  // Fail fast on a dead worker instead of backing off for a minute.
  auto channel = ClusterChannel(address, cluster_token, ControlPlaneChannelArgs(), tls);
  return std::shared_ptr<WorkerStub>(tandem::v1::Worker::NewStub(channel));
}

WorkerRegistry::WorkerRegistry(RegistryOptions options, StubFactory stub_factory)
    : options_(std::move(options)), stub_factory_(std::move(stub_factory)) {
  if (!stub_factory_) {
    stub_factory_ = [token = options_.cluster_token, tls = options_.tls](
                        const std::string& address) { return MakeWorkerStub(address, token, tls); };
  }
}

absl::Status WorkerRegistry::CheckCompatible(const RegisterRequest& request) const {
  if (request.protocol_version() != tandem::v1::PROTOCOL_VERSION_CURRENT) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker '", request.worker_id(), "' speaks control-plane protocol version ",
        static_cast<int>(request.protocol_version()), " but this router speaks version ",
        static_cast<int>(tandem::v1::PROTOCOL_VERSION_CURRENT),
        "; run the router and the workers from the same tandem build"));
  }
  if (request.worker_id().empty() || request.address().empty() || request.instance_id().empty()) {
    return absl::InvalidArgumentError("worker_id, address and instance_id are required");
  }
  if (request.role() == tandem::v1::WORKER_ROLE_UNSPECIFIED) {
    return absl::InvalidArgumentError("worker role is required");
  }
  const ModelIdentity& want = options_.expected_model;
  const ModelIdentity& got = request.model();
  for (absl::Status s : {Same("model", want.name(), got.name()),
                         Same("vocab_size", want.vocab_size(), got.vocab_size()),
                         Same("num_layers", want.num_layers(), got.num_layers()),
                         Same("num_kv_heads", want.num_kv_heads(), got.num_kv_heads()),
                         Same("head_dim", want.head_dim(), got.head_dim())}) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<RegisterResponse> WorkerRegistry::Register(const RegisterRequest& request) {
  if (absl::Status s = CheckCompatible(request); !s.ok()) {
    LOG(WARNING) << "refused worker '" << request.worker_id() << "': " << s.message();
    return s;
  }
  std::shared_ptr<WorkerStub> stub = stub_factory_(request.address());
  std::vector<std::pair<std::string, uint64_t>> down;
  RegisterResponse response;
  {
    absl::MutexLock lock(&mu_);
    auto held = workers_.find(request.worker_id());
    if (held != workers_.end() && held->second.state.healthy &&
        held->second.state.instance_id != request.instance_id()) {
      LOG(WARNING) << "refused worker '" << request.worker_id()
                   << "': the id is held by another live instance";
      return absl::AlreadyExistsError(absl::StrCat(
          "worker id '", request.worker_id(),
          "' is held by another instance that is still up; retry once it is marked down"));
    }
    Entry& entry = workers_[request.worker_id()];
    if (MarkDown(entry, "re-registered")) down.emplace_back(entry.state.id, entry.state.epoch);
    entry.state = WorkerSnapshot();
    entry.state.id = request.worker_id();
    entry.state.epoch = next_epoch_++;
    entry.state.role = request.role();
    entry.state.address = request.address();
    entry.state.kv_transfer_address = request.kv_transfer_address();
    entry.state.instance_id = request.instance_id();
    entry.state.load = request.load();
    entry.state.kv_pool = request.kv_pool();
    entry.state.healthy = true;
    entry.stub = std::move(stub);
    entry.last_heartbeat = options_.clock->Now();
    response.set_epoch(entry.state.epoch);
  }
  response.set_heartbeat_interval_ms(
      static_cast<int32_t>(absl::ToInt64Milliseconds(options_.heartbeat_interval)));
  response.set_missed_heartbeats_limit(options_.missed_heartbeats_limit);
  response.set_router_protocol_version(tandem::v1::PROTOCOL_VERSION_CURRENT);
  LOG(INFO) << "worker '" << request.worker_id() << "' registered ("
            << tandem::v1::WorkerRole_Name(request.role()) << " at " << request.address()
            << ", epoch " << response.epoch() << ")";
  Notify(down);
  return response;
}

absl::StatusOr<HeartbeatResponse> WorkerRegistry::Heartbeat(const HeartbeatRequest& request) {
  {
    absl::MutexLock lock(&mu_);
    auto it = workers_.find(request.worker_id());
    if (it != workers_.end() && it->second.state.healthy &&
        it->second.state.instance_id != request.instance_id()) {
      return absl::PermissionDeniedError(
          absl::StrCat("worker id '", request.worker_id(), "' is held by another instance"));
    }
  }
  // An unhealthy worker is marked down first: then told to register again, which it will not do.
  if (!request.unhealthy_reason().empty()) ReportUnhealthy(request);
  HeartbeatResponse response;
  std::shared_ptr<WorkerPrefixCache> cache;  // built before taking the lock
  if (request.has_prefix_cache()) {
    cache = std::make_shared<WorkerPrefixCache>();
    cache->version = request.prefix_cache().version();
    cache->page_size = request.prefix_cache().page_size();
    cache->truncated = request.prefix_cache().truncated();
    cache->hashes.insert(request.prefix_cache().page_hashes().begin(),
                         request.prefix_cache().page_hashes().end());
  }
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(request.worker_id());
  if (it == workers_.end() || it->second.state.epoch != request.epoch() ||
      !it->second.state.healthy) {
    response.set_reregister(true);
    return response;
  }
  it->second.state.load = request.load();
  it->second.state.draining = request.draining();
  if (cache != nullptr) it->second.state.prefix_cache = std::move(cache);
  it->second.last_heartbeat = options_.clock->Now();
  return response;
}

void WorkerRegistry::ReportUnhealthy(const HeartbeatRequest& request) {
  std::vector<std::pair<std::string, uint64_t>> down;
  {
    absl::MutexLock lock(&mu_);
    auto it = workers_.find(request.worker_id());
    if (it != workers_.end() && it->second.state.epoch == request.epoch() &&
        it->second.state.instance_id == request.instance_id() &&
        MarkDown(it->second, absl::StrCat("unhealthy: ", request.unhealthy_reason()))) {
      down.emplace_back(request.worker_id(), request.epoch());
    }
  }
  Notify(down);
}

bool WorkerRegistry::MarkDown(Entry& entry, std::string_view why) {
  if (!entry.state.healthy) return false;
  entry.state.healthy = false;
  LOG(WARNING) << "worker '" << entry.state.id << "' (epoch " << entry.state.epoch
               << ") is down: " << why;
  return true;
}

int WorkerRegistry::ExpireStale(absl::Time now) {
  const absl::Duration limit = options_.heartbeat_interval * options_.missed_heartbeats_limit;
  std::vector<std::pair<std::string, uint64_t>> down;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, entry] : workers_) {
      if (now - entry.last_heartbeat > limit && MarkDown(entry, "missed heartbeats")) {
        down.emplace_back(id, entry.state.epoch);
      }
    }
  }
  Notify(down);
  return static_cast<int>(down.size());
}

void WorkerRegistry::ReportUnreachable(const std::string& worker_id, uint64_t epoch) {
  std::vector<std::pair<std::string, uint64_t>> down;
  {
    absl::MutexLock lock(&mu_);
    auto it = workers_.find(worker_id);
    if (it != workers_.end() && it->second.state.epoch == epoch &&
        MarkDown(it->second, "unreachable")) {
      down.emplace_back(worker_id, epoch);
    }
  }
  Notify(down);
}

std::vector<WorkerSnapshot> WorkerRegistry::Snapshot() const {
  absl::MutexLock lock(&mu_);
  std::vector<WorkerSnapshot> out;
  out.reserve(workers_.size());
  for (const auto& [id, entry] : workers_) out.push_back(entry.state);
  return out;
}

std::shared_ptr<WorkerStub> WorkerRegistry::Stub(const std::string& worker_id,
                                                 uint64_t epoch) const {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second.state.epoch != epoch) return nullptr;
  return it->second.stub;
}

void WorkerRegistry::AddOutstanding(const std::string& worker_id, uint64_t epoch, int delta) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it != workers_.end() && it->second.state.epoch == epoch) {
    it->second.state.outstanding += delta;
  }
}

void WorkerRegistry::SetDownListener(DownListener listener) {
  absl::MutexLock lock(&mu_);
  listener_ = std::move(listener);
}

void WorkerRegistry::Notify(const std::vector<std::pair<std::string, uint64_t>>& down) {
  if (down.empty()) return;
  DownListener listener;
  {
    absl::MutexLock lock(&mu_);
    listener = listener_;
  }
  if (!listener) return;
  for (const auto& [id, epoch] : down) listener(id, epoch);
}

}  // namespace tandem::router
