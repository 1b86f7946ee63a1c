// WorkerOptions: the command line every worker binary shares (CLI11), and what it derives from
// it (engine options, the identity the router checks). Same flag names for every role so a
// launcher, a systemd unit or a Kubernetes pod spec can start any worker the same way.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "comm/kv_ipc.h"
#include "engine/engine.h"
#include "rpc/control_plane_tls.h"
#include "tandem/v1/worker.pb.h"

namespace tandem {

enum class WorkerRole { kPrefill, kDecode, kMixed };

struct WorkerOptions {
  WorkerRole role = WorkerRole::kDecode;
  std::string worker_id;                   // default "<role>-<port>"
  std::string host = "127.0.0.1";          // listen address of the gRPC service (and KV receiver)
  int port = 0;                            // gRPC port; 0 picks a free one (printed at start-up)
  std::string advertise_host;              // address given to the router; default: host
  std::string router;                      // router's gRPC host:port; empty: do not register
  int metrics_port = 0;                    // Prometheus /metrics; 0 picks a free one, -1 disables
  int kv_port = 0;                         // decode / mixed: KV receiver port; 0 picks a free one
  std::string served_model_name;           // default: basename of the model directory
  int64_t kv_transfer_timeout_ms = 30000;  // per transfer, both sides
  // prefill: push layer l of a prompt's KV as soon as its final chunk stored it (engine/kv_push.h)
  // rather than after the whole prompt; off (--no-kv-layerwise-push) for measurement.
  bool kv_layerwise_push = true;
  // prefill, testing only (--kv-transfer-hold-ms): every outgoing KV transfer waits this long
  // once all its pages are written (IPC: its copies enqueued into the granted pages) before it
  // completes, unless its request goes away meanwhile, so that fault tests can reach the middle
  // of a transfer. 0: no wait.
  int64_t kv_transfer_hold_ms = 0;
  // The KV data path between prefill and decode (comm/kv_ipc.h): tcp, ipc (CUDA IPC, same GPU
  // or peers; fails clearly where impossible) or auto (IPC where possible, else TCP).
  KvTransportKind kv_transport = KvTransportKind::kAuto;
  int64_t reservation_ttl_ms = 30000;  // decode: unclaimed reservation lifetime
  int64_t drain_timeout_ms = 30000;    // SIGTERM: wait this long for in-flight requests
  // Every internal call to and from this worker carries it (base/cluster_token.h): from
  // --cluster-token-file or $TANDEM_CLUSTER_TOKEN. Empty only with --insecure-no-cluster-token.
  std::string cluster_token;
  // Mutual TLS on the gRPC port and to the router (rpc/control_plane_tls.h) from --tls-ca,
  // --tls-cert and --tls-key; off when none is given.
  ControlPlaneTls tls;
  std::string instance_id;  // random per process (worker.proto, Authentication)
  EngineOptions engine;
};

// Parses argv. `default_role` is the binary's role; the decode binary also accepts
// --role mixed. Returns InvalidArgument with CLI11's message (or the help text, code kCancelled,
// for --help).
absl::StatusOr<WorkerOptions> ParseWorkerOptions(int argc, char** argv, WorkerRole default_role);

const char* RoleName(WorkerRole role);
tandem::v1::WorkerRole RoleProto(WorkerRole role);

}  // namespace tandem
