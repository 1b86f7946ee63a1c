#include "worker/router_client.h"

#include <grpcpp/grpcpp.h>

#include <utility>

#include "base/logging.h"
#include "rpc/cluster_auth.h"

namespace tandem {
namespace {

constexpr absl::Duration kRpcTimeout = absl::Seconds(2);
constexpr absl::Duration kRetryInterval = absl::Milliseconds(250);
constexpr absl::Duration kRefusedRetryInterval = absl::Seconds(5);

// gRPC measures the deadline itself: real time.
void SetDeadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(absl::ToChronoTime(Clock::Real()->Now() + kRpcTimeout));
}

}  // namespace

RouterClient::RouterClient(Options options) : options_(std::move(options)) {
  // Short reconnect backoff: a restarted router is reached again within about a second.
  stub_ = tandem::v1::WorkerRegistry::NewStub(ClusterChannel(
      options_.router_address, options_.cluster_token, ControlPlaneChannelArgs(), options_.tls));
}

RouterClient::~RouterClient() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void RouterClient::PublishPrefixCache(std::function<uint64_t()> version,
                                      std::function<void(tandem::v1::PrefixCacheSummary*)> fill) {
  prefix_cache_version_ = std::move(version);
  prefix_cache_ = std::move(fill);
}

void RouterClient::Start() {
  thread_ = std::thread([this] { Run(); });
}

void RouterClient::Wake() {
  absl::MutexLock l(&mu_);
  wake_ = true;
}

bool RouterClient::registered() const {
  absl::MutexLock l(&mu_);
  return registered_;
}

int RouterClient::registrations() const {
  absl::MutexLock l(&mu_);
  return registrations_;
}

absl::Status RouterClient::Health() const {
  return options_.health ? options_.health() : absl::OkStatus();
}

bool RouterClient::Register() {
  if (absl::Status health = Health(); !health.ok()) {
    if (!said_unhealthy_) {
      LOG(ERROR) << options_.hello.worker_id()
                 << " is unhealthy and will not register again until restarted: " << health;
      said_unhealthy_ = true;
    }
    return false;
  }
  tandem::v1::RegisterRequest req = options_.hello;
  *req.mutable_load() = options_.load();
  tandem::v1::RegisterResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  const absl::Time started = options_.clock->Now();
  const grpc::Status st = stub_->Register(&ctx, req, &resp);
  if (!st.ok()) {
    if (st.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
        st.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
        st.error_code() == grpc::StatusCode::UNAUTHENTICATED) {  // not the router's token
      LOG(ERROR) << "router refused registration of " << req.worker_id() << ": "
                 << st.error_message();
      absl::MutexLock l(&mu_);
      options_.clock->AwaitWithTimeout(&mu_, absl::Condition(&stopping_), kRefusedRetryInterval);
    } else {
      LOG(DEBUG) << "register with router " << options_.router_address
                 << " failed: " << st.error_message();
    }
    return false;
  }
  int registrations;
  {
    absl::MutexLock l(&mu_);
    registrations = ++registrations_;
  }
  if (registrations > 1 && options_.on_reregistered) options_.on_reregistered(started);
  absl::MutexLock l(&mu_);
  registered_ = true;
  epoch_ = resp.epoch();
  failed_heartbeats_ = 0;
  cache_sent_ = false;
  if (resp.heartbeat_interval_ms() > 0) {
    interval_ = absl::Milliseconds(resp.heartbeat_interval_ms());
  }
  if (resp.missed_heartbeats_limit() > 0) missed_limit_ = resp.missed_heartbeats_limit();
  LOG(INFO) << "registered " << req.worker_id() << " with router " << options_.router_address
            << " (epoch " << epoch_ << ")";
  return true;
}

void RouterClient::Heartbeat() {
  tandem::v1::HeartbeatRequest req;
  req.set_worker_id(options_.hello.worker_id());
  req.set_instance_id(options_.hello.instance_id());
  bool send_cache = false;
  {
    absl::MutexLock l(&mu_);
    req.set_epoch(epoch_);
    if (prefix_cache_) {
      send_cache = !cache_sent_ || prefix_cache_version_() != cache_sent_version_;
    }
  }
  if (send_cache) prefix_cache_(req.mutable_prefix_cache());
  *req.mutable_load() = options_.load();
  req.set_draining(options_.draining && options_.draining());
  if (absl::Status health = Health(); !health.ok()) {
    req.set_unhealthy_reason(std::string(health.message()));
  }
  tandem::v1::HeartbeatResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  const grpc::Status st = stub_->Heartbeat(&ctx, req, &resp);
  absl::MutexLock l(&mu_);
  if (!st.ok()) {
    // The router may be restarting; once it has surely forgotten us, register afresh.
    if (++failed_heartbeats_ >= missed_limit_) registered_ = false;
    return;
  }
  failed_heartbeats_ = 0;
  if (send_cache && !resp.reregister()) {
    cache_sent_ = true;
    cache_sent_version_ = req.prefix_cache().version();
  }
  if (resp.reregister()) {
    LOG(INFO) << "router asked " << req.worker_id() << " to register again";
    registered_ = false;
  }
}

void RouterClient::Run() {
  while (true) {
    bool registered;
    absl::Duration wait;
    {
      absl::MutexLock l(&mu_);
      if (stopping_) return;
      registered = registered_;
    }
    if (!registered) {
      registered = Register();
      if (registered) Heartbeat();  // carries the draining flag and the first load report
    } else {
      Heartbeat();
    }
    absl::MutexLock l(&mu_);
    wait = registered_ ? interval_ : kRetryInterval;
    auto woken = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_ || wake_; };
    options_.clock->AwaitWithTimeout(&mu_, absl::Condition(&woken), wait);
    wake_ = false;
  }
}

}  // namespace tandem
