// tandem-router: the OpenAI-compatible HTTP front end, the gRPC Generation API and the worker
// registry in one process (no GPU). Workers register at --grpc-port.
//   tandem-router --model-dir DIR [--port 8000] [--grpc-port 8001] [--api-key KEY] ...
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdlib>

#include "absl/time/clock.h"
#include "base/cluster_token.h"
#include "base/listen_error.h"
#include "base/logging.h"
#include "router/router_server.h"
#include "rpc/control_plane_tls.h"

int main(int argc, char** argv) {
  tandem::router::RouterConfig config;
  CLI::App app{"tandem-router: OpenAI-compatible front end, gRPC API and worker registry"};
  app.add_option("--model-dir", config.model_dir, "model directory (tokenizer, config.json)")
      ->required();
  app.add_option("--served-model-name", config.served_model_name,
                 "name in /v1/models and requests (default: the directory's base name)");
  app.add_option("--max-model-len", config.max_model_len,
                 "context length (default: config.json max_position_embeddings)");
  app.add_option("--host", config.host,
                 "HTTP listen address (OpenAI API, /metrics), and gRPC's unless --grpc-host");
  app.add_option("--grpc-host", config.grpc_host,
                 "gRPC listen address (Generation API, worker registry); default: --host");
  app.add_option("--port", config.http_port, "HTTP port (OpenAI API, /metrics)");
  app.add_option("--grpc-port", config.grpc_port, "gRPC port (Generation API, worker registry)");
  app.add_option("--api-key", config.api_key, "require 'Authorization: Bearer KEY' on /v1/*")
      ->envname("TANDEM_API_KEY");
  app.add_option("--routing-policy", config.routing_policy,
                 "least-loaded | round-robin | kv-aware (prefix-cache overlap and load)");
  app.add_option("--max-running", config.max_running,
                 "requests routed to workers at once (also bounded by the KV tokens the "
                 "workers can hold: prompt + max_tokens per request)");
  app.add_option("--max-waiting", config.max_waiting,
                 "requests queued beyond --max-running before 429s");
  double max_queue_time_s = 30;
  app.add_option("--max-queue-time-s", max_queue_time_s,
                 "a request still queued for admission after this many seconds gets 429 "
                 "(0: no bound)");
  app.add_option("--http-threads", config.http_threads, "HTTP I/O threads");
  app.add_option("--max-body-bytes", config.max_body_bytes, "larger request bodies get 413");
  double http_idle_timeout_s = 60;
  app.add_option("--http-idle-timeout-s", http_idle_timeout_s,
                 "idle keep-alive HTTP connections (or ones slow to send a request) close after "
                 "this many seconds")
      ->check(CLI::PositiveNumber);
  app.add_option("--heartbeat-interval-ms", config.heartbeat_interval_ms,
                 "worker heartbeat period");
  app.add_option("--missed-heartbeats", config.missed_heartbeats,
                 "heartbeats a worker may miss before it is marked down");
  app.add_option("--drain-timeout-s", config.drain_timeout_s,
                 "on SIGTERM, how long in-flight requests may take to finish");
  std::string cluster_token_file;
  app.add_option("--cluster-token-file", cluster_token_file,
                 "file (mode 600) holding the deployment's cluster token; default: "
                 "$TANDEM_CLUSTER_TOKEN");
  bool insecure_control_plane = false;
  app.add_flag("--insecure-no-cluster-token", insecure_control_plane,
               "run the worker registry without a cluster token: anyone who reaches the gRPC "
               "port can register a worker and receive prompts (development only)");
  std::string tls_ca, tls_cert, tls_key;
  app.add_option("--tls-ca", tls_ca,
                 "PEM file of the deployment CA: with --tls-cert and --tls-key, the control "
                 "plane runs over mutual TLS (workers must present certificates of this CA)");
  app.add_option("--tls-cert", tls_cert, "PEM file of this router's certificate (of --tls-ca)");
  app.add_option("--tls-key", tls_key, "PEM file (mode 600) of its private key");
  app.add_option("--control-plane-port", config.control_plane_port,
                 "with TLS: the worker registry's port (mutual TLS; 0: any free port); the "
                 "registry then answers on it only");
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "debug | info | warning | error");
  CLI11_PARSE(app, argc, argv);
  config.http_idle_timeout = absl::Seconds(http_idle_timeout_s);
  config.max_queue_time = absl::Seconds(max_queue_time_s);
  tandem::LogLevel level;
  if (tandem::ParseLogLevel(log_level, &level)) tandem::SetLogLevel(level);
  absl::StatusOr<std::string> token = tandem::LoadClusterToken(cluster_token_file);
  if (!token.ok()) {
    LOG(ERROR) << "tandem-router: " << token.status().message();
    return 2;
  }
  if (token->empty() && !insecure_control_plane) {
    LOG(ERROR) << "tandem-router: no cluster token: set $" << tandem::kClusterTokenEnv
               << " or --cluster-token-file (tandem serve does), or pass "
                  "--insecure-no-cluster-token";
    return 2;
  }
  if (token->empty()) {
    LOG(WARNING) << "tandem-router: the control plane is unauthenticated";
  }
  config.cluster_token = *std::move(token);
  absl::StatusOr<tandem::ControlPlaneTls> tls =
      tandem::LoadControlPlaneTls(tls_ca, tls_cert, tls_key);
  if (!tls.ok()) {
    LOG(ERROR) << "tandem-router: " << tls.status().message();
    return 2;
  }
  config.control_plane_tls = *std::move(tls);

  // SIGINT / SIGTERM are taken synchronously by this thread (blocked before threads start).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  absl::StatusOr<std::unique_ptr<tandem::router::RouterServer>> server =
      tandem::router::RouterServer::Start(config);
  if (!server.ok()) {
    LOG(ERROR) << "tandem-router: " << server.status();
    return tandem::IsPortTaken(server.status()) ? tandem::kExitCannotListen : 1;
  }
  const std::string& grpc_host = config.grpc_host.empty() ? config.host : config.grpc_host;
  if (config.control_plane_tls.enabled()) {
    LOG(INFO) << "tandem-router: OpenAI API on http://" << config.host << ":"
              << (*server)->http_port() << "/v1, gRPC on " << grpc_host << ":"
              << (*server)->grpc_port() << ", worker registry (mutual TLS) on " << grpc_host << ":"
              << (*server)->control_plane_port() << ", metrics on /metrics";
  } else {
    LOG(INFO) << "tandem-router: OpenAI API on http://" << config.host << ":"
              << (*server)->http_port() << "/v1, gRPC and worker registry on " << grpc_host << ":"
              << (*server)->grpc_port() << ", metrics on /metrics";
  }
  int received = 0;
  sigwait(&signals, &received);
  LOG(INFO) << "tandem-router: signal " << received << ", draining";
  (*server)->Shutdown(absl::Seconds(config.drain_timeout_s));
  return 0;
}
