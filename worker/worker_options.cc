#include "worker/worker_options.h"

#include <CLI/CLI.hpp>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "base/cluster_token.h"
#include "base/logging.h"
#include "base/secure_random.h"
#include "worker/engine_flags.h"

namespace tandem {

const char* RoleName(WorkerRole role) {
  switch (role) {
    case WorkerRole::kPrefill:
      return "prefill";
    case WorkerRole::kDecode:
      return "decode";
    case WorkerRole::kMixed:
      return "mixed";
  }
  return "?";
}

tandem::v1::WorkerRole RoleProto(WorkerRole role) {
  switch (role) {
    case WorkerRole::kPrefill:
      return tandem::v1::WORKER_ROLE_PREFILL;
    case WorkerRole::kDecode:
      return tandem::v1::WORKER_ROLE_DECODE;
    case WorkerRole::kMixed:
      return tandem::v1::WORKER_ROLE_MIXED;
  }
  return tandem::v1::WORKER_ROLE_UNSPECIFIED;
}

absl::StatusOr<WorkerOptions> ParseWorkerOptions(int argc, char** argv, WorkerRole default_role) {
  WorkerOptions o;
  o.role = default_role;
  std::string role = RoleName(default_role);
  EngineFlags engine_flags;
  CLI::App app(absl::StrCat("tandem ", role, " worker"));
  // A flag given twice takes its last value: layouts append per-group flags after defaults.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  if (default_role != WorkerRole::kPrefill) {
    app.add_option("--role", role, "decode or mixed (one engine, both phases, no transfer)")
        ->check(CLI::IsMember({"decode", "mixed"}));
  }
  app.add_option("--model", engine_flags.engine.model_dir, "Hugging Face model directory")
      ->required();
  app.add_option("--served-model-name", o.served_model_name, "Model name (default: dir name)");
  app.add_option("--worker-id", o.worker_id, "Stable worker id (default: <role>-<port>)");
  app.add_option("--host", o.host, "Listen address (IPv4)");
  app.add_option("--port", o.port, "gRPC port (0: any free port)");
  app.add_option("--advertise-host", o.advertise_host, "Address the router uses to reach us");
  app.add_option("--router", o.router, "Router's gRPC host:port to register with");
  app.add_option("--metrics-port", o.metrics_port, "Prometheus port (0: any, -1: off)");
  app.add_option("--kv-port", o.kv_port, "KV transfer receiver port (decode; 0: any)");
  AddEngineFlags(app, &engine_flags);
  app.add_option("--kv-transfer-timeout-ms", o.kv_transfer_timeout_ms, "Per KV transfer");
  std::string kv_transport = "auto";
  app.add_option("--kv-transport", kv_transport,
                 "KV data path: tcp, ipc (CUDA IPC), nccl (NCCL, GPU to GPU) or auto");
  app.add_flag("--kv-layerwise-push,!--no-kv-layerwise-push", o.kv_layerwise_push,
               "Prefill: push each layer's KV while the next layers compute (on by default)");
  if (default_role == WorkerRole::kPrefill) {  // other roles refuse it (unknown flag)
    app.add_option("--kv-transfer-hold-ms", o.kv_transfer_hold_ms,
                   "Testing: hold each KV transfer open this long once its pages are written")
        ->check(CLI::NonNegativeNumber);
  }
  app.add_option("--reservation-ttl-ms", o.reservation_ttl_ms, "Unclaimed reservation TTL");
  app.add_option("--drain-timeout-ms", o.drain_timeout_ms, "Drain time on SIGTERM");
  std::string cluster_token_file;
  app.add_option("--cluster-token-file", cluster_token_file,
                 "File (mode 600) with the cluster token (default: $TANDEM_CLUSTER_TOKEN)");
  bool insecure = false;
  app.add_flag("--insecure-no-cluster-token", insecure,
               "Serve the Worker API and the KV port without a cluster token (development only)");
  std::string tls_ca, tls_cert, tls_key;
  app.add_option("--tls-ca", tls_ca,
                 "PEM file of the deployment CA: with --tls-cert and --tls-key, the gRPC port "
                 "takes only mutual-TLS clients of this CA, and the router is reached over TLS");
  app.add_option("--tls-cert", tls_cert, "PEM file of this worker's certificate (of --tls-ca)");
  app.add_option("--tls-key", tls_key, "PEM file (mode 600) of its private key");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return absl::CancelledError(app.help());
  } catch (const CLI::ParseError& e) {
    return absl::InvalidArgumentError(absl::StrCat(e.what(), "\n", app.help()));
  }
  o.role = role == "mixed" ? WorkerRole::kMixed : default_role;
  absl::StatusOr<KvTransportKind> kind = ParseKvTransportKind(kv_transport);
  if (!kind.ok()) return kind.status();
  o.kv_transport = *kind;
  absl::StatusOr<std::string> token = LoadClusterToken(cluster_token_file);
  if (!token.ok()) return token.status();
  if (token->empty() && !insecure) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no cluster token: set $", kClusterTokenEnv,
        " or --cluster-token-file (tandem serve does), or pass --insecure-no-cluster-token"));
  }
  o.cluster_token = *std::move(token);
  absl::StatusOr<ControlPlaneTls> tls = LoadControlPlaneTls(tls_ca, tls_cert, tls_key);
  if (!tls.ok()) return tls.status();
  o.tls = *std::move(tls);
  o.instance_id = RandomHex(16);
  if (absl::Status s = ResolveEngineFlags(&engine_flags); !s.ok()) return s;
  o.engine = engine_flags.engine;
  if (o.role == WorkerRole::kPrefill && o.engine.speculative.enabled()) {
    // A prefill worker samples only the first token; the decode worker speculates (and prefills
    // its draft model itself from the prompt tokens it receives: engine/spec/README.md).
    LOG(INFO) << "speculative decoding runs on the decode worker; this prefill worker does not "
                 "speculate";
    o.engine.speculative = SpeculativeConfig();
  }
  if (o.advertise_host.empty()) o.advertise_host = o.host;
  if (o.worker_id.empty() && o.port != 0) o.worker_id = absl::StrCat(RoleName(o.role), "-", o.port);
  if (o.served_model_name.empty()) {
    o.served_model_name =
        std::filesystem::path(o.engine.model_dir).lexically_normal().filename().string();
    if (o.served_model_name.empty()) {
      o.served_model_name =
          std::filesystem::path(o.engine.model_dir).parent_path().filename().string();
    }
  }
  return o;
}

}  // namespace tandem
