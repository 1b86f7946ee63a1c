// RouterTestEnv: a RouterServer on free ports with a ByteTokenizer model ("tiny", context 256)
// and FakeWorkers registered with it — the router exactly as deployed, minus real workers.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "router/router_server.h"
#include "tests/router/byte_tokenizer.h"
#include "tests/router/fake_worker.h"

namespace tandem::router::testing {

inline RouterConfig TestRouterConfig() {
  RouterConfig config;
  config.host = "127.0.0.1";
  config.http_port = 0;
  config.grpc_port = 0;
  config.heartbeat_interval_ms = 100;
  config.missed_heartbeats = 3;
  config.flow.rpc_timeout = absl::Seconds(2);
  config.flow.reserve_retry_budget = absl::Seconds(1);
  config.cluster_token = "router-test-cluster-token";  // every test runs authenticated
  return config;
}

class RouterTestEnv {
 public:
  explicit RouterTestEnv(RouterConfig config = TestRouterConfig())
      : cluster_token_(config.cluster_token) {
    ServedModel model;
    model.dir = "/models/tiny";
    model.tokenizer = std::make_unique<ByteTokenizer>();
    model.context = ByteModelContext(model.tokenizer.get());
    model.identity.set_vocab_size(258);
    absl::StatusOr<std::unique_ptr<RouterServer>> server =
        RouterServer::Start(config, std::move(model));
    if (!server.ok()) {
      start_error_ = server.status();
      return;
    }
    server_ = *std::move(server);
  }
  ~RouterTestEnv() {
    if (server_) server_->Shutdown(absl::ZeroDuration());
    workers_.clear();
  }

  absl::Status status() const { return start_error_; }
  RouterServer& server() { return *server_; }
  int http_port() { return server_->http_port(); }
  std::string grpc_address() { return "127.0.0.1:" + std::to_string(server_->grpc_port()); }

  // Starts a fake worker registered with the router; null on failure (see last_error()).
  FakeWorker* AddWorker(FakeWorkerOptions options) {
    if (options.cluster_token.empty()) options.cluster_token = cluster_token_;
    auto worker = std::make_unique<FakeWorker>(std::move(options));
    last_error_ = worker->Start(grpc_address());
    if (!last_error_.ok()) return nullptr;
    workers_.push_back(std::move(worker));
    return workers_.back().get();
  }
  const absl::Status& last_error() const { return last_error_; }
  const std::string& cluster_token() const { return cluster_token_; }

  // Waits until `predicate` holds or `timeout` passes.
  template <typename Predicate>
  static bool WaitFor(Predicate predicate, absl::Duration timeout = absl::Seconds(5)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (!predicate()) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return true;
  }

 private:
  const std::string cluster_token_;
  absl::Status start_error_;
  absl::Status last_error_;
  std::unique_ptr<RouterServer> server_;
  std::vector<std::unique_ptr<FakeWorker>> workers_;
};

inline FakeWorkerOptions Role(const std::string& id, tandem::v1::WorkerRole role,
                              int token_delay_ms = 0) {
  FakeWorkerOptions options;
  options.id = id;
  options.role = role;
  options.token_delay_ms = token_delay_ms;
  return options;
}

}  // namespace tandem::router::testing
