// Cluster: the processes of one layout on this node — a router and its workers — started as
// separate programs, each with its own log, ports chosen up front (so they can be printed and
// a restarted worker comes back on the same address). Used by `tandem serve` and by the
// end-to-end tests (which also kill and restart workers). Not thread-safe. Real time throughout
// (Clock::Real()): it waits on real processes and sockets.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "deploy/launcher/child_process.h"
#include "deploy/launcher/deployment_ca.h"
#include "deploy/launcher/layout.h"
#include "deploy/launcher/restart_policy.h"

namespace tandem::launcher {

struct ClusterOptions {
  std::string bin_dir;    // holds tandem-router, tandem-prefill-worker, tandem-decode-worker
  std::string model_dir;  // overrides layout.model when set
  std::string log_dir;    // one <name>.log per process
  absl::Duration ready_timeout = absl::Seconds(60);
  int router_drain_timeout_s = 30;
  // Picks each port the layout leaves to the launcher; PickFreePort when unset (tests set it to
  // hand out a port that is taken).
  std::function<absl::StatusOr<int>(const std::string& host)> pick_port;
  // When Supervise starts a process that died again (restart_policy.h).
  RestartOptions restart;
};

struct Process {
  std::string name;          // "router", "prefill-0", "decode-1", ...
  std::string role;          // "router", "prefill", "decode", "mixed"
  std::string grpc_address;  // host:port (router: Generation API + registry)
  std::string metrics_url;   // http://host:port/metrics
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env;
  // With control_plane_tls: its certificate and key, and the CA's (in Cluster's TLS folder).
  TlsFiles tls;
  std::unique_ptr<ChildProcess> child;
  // Picks the process's ports (those the layout leaves to the launcher) and writes argv and the
  // addresses above. ports_picked: some were picked, so a start that finds one taken (the child
  // exits with kExitCannotListen) is retried on new ones, up to kMaxLaunchesForPorts starts.
  std::function<absl::Status(Process&)> assign_ports;
  bool ports_picked = false;
  int launches = 0;
  // Supervise's state: when the current child started, when a dead one is due to start again
  // (InfiniteFuture: not scheduled), and whether it was given up on.
  absl::Time started;
  absl::Time restart_at = absl::InfiniteFuture();
  bool given_up = false;
  RestartPolicy restarts;
};

class Cluster {
 public:
  // Starts the router, waits until it listens, then starts every worker and waits until the
  // router reports each worker healthy (or fails with the log tail of the process that died or
  // stalled). A process that finds a port picked for it taken by the time it binds it (another
  // program got there first) is started again on new ports.
  static absl::StatusOr<std::unique_ptr<Cluster>> Start(const Layout& layout,
                                                        const ClusterOptions& options);
  ~Cluster();  // kills whatever still runs

  // Where a client on this machine reaches the router's HTTP API (host:port; 127.0.0.1 when it
  // listens on 0.0.0.0), and the address it listens on.
  const std::string& http_address() const { return http_address_; }
  const std::string& http_listen_address() const { return http_listen_address_; }
  // This deployment's cluster token (fresh per Start, 256 random bits): every child gets it in
  // $TANDEM_CLUSTER_TOKEN, never on its command line. Tests use it to call workers directly.
  const std::string& cluster_token() const { return cluster_token_; }
  // With the layout's control_plane_tls: the router's worker-registry port (mutual TLS), which
  // the workers register with; otherwise its gRPC address.
  const std::string& control_plane_address() const { return control_plane_address_; }
  // With control_plane_tls: a certificate of this deployment's CA for a client that is none of
  // its processes (tests calling workers directly; `tandem serve` prints the folder); empty
  // otherwise. The folder (mode 700) is removed with the Cluster.
  const TlsFiles& client_tls() const { return client_tls_; }
  const Process& router() const { return processes_[0]; }
  std::vector<Process*> workers();
  Process* Find(const std::string& name);

  // Waits until the router lists `expected` healthy workers per role ({"prefill", 2}, ...).
  absl::Status WaitForWorkers(const std::vector<std::pair<std::string, int>>& expected,
                              absl::Duration timeout);
  // Starts a worker again (same name, ports and flags) after it exited.
  absl::Status Restart(const std::string& name);
  // Restarts what died (same name, ports and flags) under options.restart: logs each exit and
  // restart; after too many rapid crashes in a row gives the process up and returns an error
  // naming it, with its log tail (once per process). Call it every ~100 ms; never blocks long.
  absl::Status Supervise();
  // Names of processes that have exited since the start (with their exit codes).
  std::vector<std::pair<std::string, int>> Exited();
  // Graceful stop: SIGTERM the router (it drains in-flight requests), then the workers; SIGKILL
  // whatever is left after `grace`. OK when every process exited with code 0.
  absl::Status Shutdown(absl::Duration grace);

 private:
  static constexpr int kMaxLaunchesForPorts = 4;

  Cluster() = default;
  absl::Status Launch(Process& p);
  absl::Status LaunchPickingPorts(Process& p);  // assign_ports, then Launch
  // For a process that has exited: when it exited because a port picked for it was taken (and
  // may_repick), picks new ports and starts it again; OK unless that start failed. Otherwise the
  // error "<name> exited with code ...", with its log tail.
  absl::Status RestartIfPortTaken(Process& p, bool may_repick);
  absl::Status WaitForRouter(absl::Time deadline);  // until its HTTP port answers
  absl::Status WaitReady(const std::vector<std::pair<std::string, int>>& expected,
                         absl::Time deadline, bool repick_taken_ports);

  std::string http_address_;
  std::string control_plane_address_;
  std::string http_listen_address_;
  std::string cluster_token_;
  std::string tls_dir_;  // empty: TLS off
  TlsFiles client_tls_;
  RestartOptions restart_;
  std::string log_dir_;
  std::vector<std::pair<std::string, int>> expected_;
  std::vector<Process> processes_;  // [0] is the router
};

// A TCP port on `host` that is free right now, for a child process to listen on. It is picked at
// random in [kFirstPickedPort, the ephemeral range's start) and checked by binding it: the kernel
// hands ports of the ephemeral range (net.ipv4.ip_local_port_range) to every outgoing connection
// and every bind to port 0, so one found free there (by binding port 0, then closing it) can be
// taken by some connection before the child binds it, and on a busy host it was. Where the range
// leaves no room below it, the kernel's choice. Never the same port twice in one process.
inline constexpr int kFirstPickedPort = 10000;
absl::StatusOr<int> PickFreePort(const std::string& host);

// The flags a worker of group `g` gets from the layout: the engine's, the group's parallel sizes
// and, for prefill and decode workers, --kv-transport (a mixed worker moves no KV). The group's
// own `args` follow them on the command line.
std::vector<std::string> WorkerLayoutFlags(const Layout& layout, const GroupSpec& g);
// net.ipv4.ip_local_port_range as {first, last}; Linux's default if it cannot be read.
std::pair<int, int> EphemeralPortRange();

}  // namespace tandem::launcher
