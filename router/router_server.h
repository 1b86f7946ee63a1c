// RouterServer: assembles the router — served model, worker registry, routing policy,
// admission, generation service, the HTTP (OpenAI) and gRPC front ends — from a RouterConfig.
// Used by main.cc and by the tests (which start it on port 0 and point fake workers at it).
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "router/admission.h"
#include "router/generation_service.h"
#include "router/grpc_frontend.h"
#include "router/http_server.h"
#include "router/openai_api.h"
#include "router/registry_service.h"
#include "router/router_metrics.h"
#include "router/routing_policy.h"
#include "router/served_model.h"
#include "router/worker_registry.h"

namespace tandem::router {

struct RouterConfig {
  std::string model_dir;
  std::string served_model_name;
  int max_model_len = 0;
  std::string host = "127.0.0.1";  // the HTTP listen address (and gRPC's unless grpc_host)
  std::string grpc_host;           // the gRPC listen address; empty: `host`
  int http_port = 8000;            // 0: any free port
  int grpc_port = 8001;            // 0: any free port
  std::string api_key;
  // Every call to the registry and to the workers carries it (base/cluster_token.h); empty:
  // the control plane is unauthenticated (tests only; the binary refuses to run so unless told).
  std::string cluster_token;
  // Mutual TLS on the control plane (rpc/control_plane_tls.h) when enabled: the worker registry
  // is served only on control_plane_port (0: any free port), over TLS with a verified client
  // certificate of the CA; calls to it on grpc_port get UNAUTHENTICATED. Calls to the workers
  // present this certificate. Off: the registry is on grpc_port, and control_plane_port unused.
  ControlPlaneTls control_plane_tls;
  int control_plane_port = 0;
  std::string routing_policy = "least-loaded";
  int max_running = 1024;
  int max_waiting = 4096;
  // A request still waiting for admission after this gets 429 (<= 0: no bound).
  absl::Duration max_queue_time = absl::Seconds(30);
  int http_threads = 2;
  size_t max_body_bytes = size_t{8} << 20;
  absl::Duration http_idle_timeout = absl::Seconds(60);  // idle keep-alive connections close
  int heartbeat_interval_ms = 500;
  int missed_heartbeats = 3;
  int drain_timeout_s = 30;
  FlowOptions flow;  // its clock is replaced by `clock`
  // Every time decision of the router: heartbeat expiry, retry budget, timings, drain grace.
  Clock* clock = Clock::Real();
};

class RouterServer {
 public:
  static absl::StatusOr<std::unique_ptr<RouterServer>> Start(const RouterConfig& config);
  // With an already loaded model (tests use a fake tokenizer).
  static absl::StatusOr<std::unique_ptr<RouterServer>> Start(const RouterConfig& config,
                                                             ServedModel model);
  ~RouterServer();

  int http_port() const { return http_->port(); }
  int grpc_port() const { return grpc_port_; }
  // The mutual-TLS port of the worker registry; 0 when TLS is off.
  int control_plane_port() const { return control_plane_port_; }
  WorkerRegistry& registry() { return *registry_; }
  GenerationService& service() { return *service_; }
  AdmissionController& admission() { return *admission_; }

  // Stops taking requests, waits up to `grace` for in-flight ones, then cancels the rest.
  void Shutdown(absl::Duration grace);

 private:
  RouterServer() = default;

  ServedModel model_;
  std::unique_ptr<RouterMetrics> metrics_;
  std::unique_ptr<WorkerRegistry> registry_;
  std::unique_ptr<RoutingPolicy> policy_;
  std::unique_ptr<AdmissionController> admission_;
  std::unique_ptr<GenerationService> service_;
  std::unique_ptr<OpenAiApi> api_;
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<RegistryService> registry_service_;
  std::unique_ptr<GenerationGrpcService> generation_service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  int grpc_port_ = 0;
  int control_plane_port_ = 0;
  bool shut_down_ = false;
};

}  // namespace tandem::router
