// Cluster: the processes of one layout on this node — a router and its workers — started as
// separate programs, each with its own log, ports chosen up front (so they can be printed and
// a restarted worker comes back on the same address). Used by `tandem serve` and by the
// end-to-end tests (which also kill and restart workers). Not thread-safe.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "deploy/launcher/child_process.h"
#include "deploy/launcher/layout.h"

namespace tandem::launcher {

struct ClusterOptions {
  std::string bin_dir;    // holds tandem-router, tandem-prefill-worker, tandem-decode-worker
  std::string model_dir;  // overrides layout.model when set
  std::string log_dir;    // one <name>.log per process
  absl::Duration ready_timeout = absl::Seconds(60);
  int router_drain_timeout_s = 30;
};

struct Process {
  std::string name;          // "router", "prefill-0", "decode-1", ...
  std::string role;          // "router", "prefill", "decode", "mixed"
  std::string grpc_address;  // host:port (router: Generation API + registry)
  std::string metrics_url;   // http://host:port/metrics
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env;
  std::unique_ptr<ChildProcess> child;
};

class Cluster {
 public:
  // Starts the router then every worker and waits until the router reports each worker healthy
  // (or fails with the log tail of the process that died or stalled).
  static absl::StatusOr<std::unique_ptr<Cluster>> Start(const Layout& layout,
                                                        const ClusterOptions& options);
  ~Cluster();  // kills whatever still runs

  const std::string& http_address() const { return http_address_; }  // host:port
  const Process& router() const { return processes_[0]; }
  std::vector<Process*> workers();
  Process* Find(const std::string& name);

  // Waits until the router lists `expected` healthy workers per role ({"prefill", 2}, ...).
  absl::Status WaitForWorkers(const std::vector<std::pair<std::string, int>>& expected,
                              absl::Duration timeout);
  // Starts a worker again (same name, ports and flags) after it exited.
  absl::Status Restart(const std::string& name);
  // Names of processes that have exited since the start (with their exit codes).
  std::vector<std::pair<std::string, int>> Exited();
  // Graceful stop: SIGTERM the router (it drains in-flight requests), then the workers; SIGKILL
  // whatever is left after `grace`. OK when every process exited with code 0.
  absl::Status Shutdown(absl::Duration grace);

 private:
  Cluster() = default;
  absl::Status Launch(Process& p);

  std::string http_address_;
  std::string log_dir_;
  std::vector<std::pair<std::string, int>> expected_;
  std::vector<Process> processes_;  // [0] is the router
};

// A free TCP port on `host` right now (bind to port 0, read it, close).
absl::StatusOr<int> PickFreePort(const std::string& host);

}  // namespace tandem::launcher
