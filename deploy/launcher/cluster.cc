#include "deploy/launcher/cluster.h"

#include <signal.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "base/clock.h"
#include "base/cluster_token.h"
#include "base/listen_error.h"
#include "base/logging.h"
#include "base/secure_random.h"
#include "comm/socket_io.h"
#include "deploy/launcher/http_get.h"

namespace tandem::launcher {
namespace {

// Valid a year: far beyond one `tandem serve` run (each start makes a new CA).
constexpr absl::Duration kTlsValidity = absl::Hours(24 * 365);

std::vector<std::string> EngineFlags(const Layout& l) {
  const EngineSpec& e = l.engine;
  std::vector<std::string> flags = {"--backend",
                                    l.backend,
                                    "--page-size",
                                    std::to_string(e.page_size),
                                    "--num-pages",
                                    std::to_string(e.num_pages),
                                    "--kv-memory-bytes",
                                    std::to_string(e.kv_memory_bytes),
                                    "--gpu-memory-utilization",
                                    absl::StrCat(e.gpu_memory_utilization),
                                    "--max-num-seqs",
                                    std::to_string(e.max_num_seqs),
                                    "--max-num-batched-tokens",
                                    std::to_string(e.max_num_batched_tokens),
                                    "--max-model-len",
                                    std::to_string(e.max_model_len)};
  if (!e.cuda_graph_sizes.empty()) {
    flags.push_back("--cuda-graph-sizes");
    flags.push_back(absl::StrJoin(e.cuda_graph_sizes, ","));
  }
  if (e.enforce_eager) flags.push_back("--enforce-eager");
  if (!e.enable_prefix_caching) flags.push_back("--no-enable-prefix-caching");
  if (!e.async_scheduling) flags.push_back("--no-async-scheduling");
  if (!e.quantization.empty()) flags.insert(flags.end(), {"--quantization", e.quantization});
  if (e.kv_cache_dtype != "auto") flags.insert(flags.end(), {"--kv-cache-dtype", e.kv_cache_dtype});
  if (e.speculative_method != "none") {
    flags.insert(flags.end(), {"--speculative-method", e.speculative_method,
                               "--num-speculative-tokens", std::to_string(e.num_speculative_tokens),
                               "--prompt-lookup-min", std::to_string(e.prompt_lookup_min),
                               "--prompt-lookup-max", std::to_string(e.prompt_lookup_max)});
    if (!e.speculative_draft_model.empty()) {
      flags.insert(flags.end(), {"--speculative-draft-model", e.speculative_draft_model});
    }
  }
  return flags;
}

Process MakeProcess(std::string name, std::string role, std::string grpc_address,
                    std::string metrics_url) {
  Process p;
  p.name = std::move(name);
  p.role = std::move(role);
  p.grpc_address = std::move(grpc_address);
  p.metrics_url = std::move(metrics_url);
  return p;
}

// Counts healthy workers per role in the router's /metrics (tandem_router_workers gauge).
std::map<std::string, int> HealthyWorkers(const std::string& metrics_text) {
  std::map<std::string, int> counts;
  for (absl::string_view line : absl::StrSplit(metrics_text, '\n')) {
    if (!absl::StartsWith(line, "tandem_router_workers{") ||
        !absl::StrContains(line, "state=\"healthy\"")) {
      continue;
    }
    for (const char* role : {"prefill", "decode", "mixed"}) {
      if (!absl::StrContains(line, absl::StrCat("role=\"", role, "\""))) continue;
      const size_t space = line.rfind(' ');
      double n = 0;
      if (space != absl::string_view::npos && absl::SimpleAtod(line.substr(space + 1), &n)) {
        counts[role] += static_cast<int>(n);
      }
    }
  }
  return counts;
}

}  // namespace

std::vector<std::string> WorkerLayoutFlags(const Layout& layout, const GroupSpec& g) {
  std::vector<std::string> flags = EngineFlags(layout);
  flags.insert(flags.end(), {"--tensor-parallel-size", std::to_string(g.tensor_parallel),
                             "--pipeline-parallel-size", std::to_string(g.pipeline_parallel)});
  if (g.allow_device_sharing) flags.push_back("--allow-device-sharing");
  if (g.role != "mixed") flags.insert(flags.end(), {"--kv-transport", layout.kv_transport});
  return flags;
}

std::pair<int, int> EphemeralPortRange() {
  std::ifstream f("/proc/sys/net/ipv4/ip_local_port_range");
  int lo = 0, hi = 0;
  if (f >> lo >> hi && 0 < lo && lo <= hi && hi < 65536) return {lo, hi};
  return {32768, 60999};  // Linux's default
}

absl::StatusOr<int> PickFreePort(const std::string& host) {
  // Never return a port this process already returned: the caller may not have bound it yet.
  static absl::Mutex mu;
  static auto* given = new std::set<int>;
  static auto* rng = new std::mt19937(std::random_device{}());
  // Below the ephemeral range when it leaves room: random candidates, the first one that binds
  // without SO_REUSEADDR (so not one whose old connections linger, which a child's listener
  // without that option could not bind).
  const int below = EphemeralPortRange().first - 1;
  if (below - kFirstPickedPort >= 1000) {
    for (int attempt = 0; attempt < 256; ++attempt) {
      absl::MutexLock l(&mu);
      const int port = std::uniform_int_distribution<int>(kFirstPickedPort, below)(*rng);
      if (given->count(port) != 0 || !Listen(host, port, /*reuse_address=*/false).ok()) continue;
      given->insert(port);
      return port;
    }
  }
  // Otherwise the kernel's choice (bind to port 0); it may hand the same just-closed port out
  // twice in a row, so a duplicate is held open while asking again.
  std::vector<Socket> duplicates;
  for (int attempt = 0; attempt < 64; ++attempt) {
    absl::StatusOr<Socket> s = Listen(host, 0);
    if (!s.ok()) return s.status();
    absl::StatusOr<int> port = LocalPort(*s);
    if (!port.ok()) return port.status();
    absl::MutexLock l(&mu);
    if (given->insert(*port).second) return *port;
    duplicates.push_back(*std::move(s));
  }
  return absl::UnavailableError("no fresh free port");
}

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Start(const Layout& layout,
                                                        const ClusterOptions& options) {
  std::unique_ptr<Cluster> c(new Cluster);
  c->log_dir_ = options.log_dir;
  c->cluster_token_ = RandomHex(32);
  // Mutual TLS: a CA of this deployment only, a certificate per process. The CA's key is dropped
  // when Start returns.
  std::optional<DeploymentCa> ca;
  auto issue = [&](const std::string& name) -> absl::StatusOr<TlsFiles> {
    if (!ca.has_value()) return TlsFiles{};
    return ca->IssueFiles(c->tls_dir_, name);
  };
  if (layout.control_plane_tls) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tandem-tls-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) {  // mode 700
      return absl::InternalError(
          absl::StrCat("cannot make a folder for the control plane's certificates in ",
                       std::filesystem::temp_directory_path().string()));
    }
    c->tls_dir_ = tmpl;
    absl::StatusOr<DeploymentCa> made =
        DeploymentCa::Create(absl::StrCat("tandem deployment ", RandomHex(4)), kTlsValidity);
    if (!made.ok()) return made.status();
    ca = *std::move(made);
    absl::StatusOr<TlsFiles> client = issue("client");
    if (!client.ok()) return client.status();
    c->client_tls_ = *std::move(client);
  }
  c->restart_ = options.restart;
  const std::string model = options.model_dir.empty() ? layout.model : options.model_dir;
  const std::string host = layout.host;  // internal ports
  if (absl::Status st = CheckListenHost(host, "host"); !st.ok()) return st;
  const std::string http_host = RouterHttpHost(layout);  // the OpenAI API's
  if (absl::Status st = CheckListenHost(http_host, "router.host"); !st.ok()) return st;
  const absl::Time deadline = Clock::Real()->Now() + options.ready_timeout;
  const std::function<absl::StatusOr<int>(const std::string&)> pick =
      options.pick_port ? options.pick_port : PickFreePort;

  // The router first, on its own until it listens: the workers are given its address.
  Process router = MakeProcess("router", "router", "", "");
  const int fixed_http = layout.router_port, fixed_grpc = layout.router_grpc_port;
  const int fixed_control = layout.router_control_plane_port;
  const bool tls = layout.control_plane_tls;
  absl::StatusOr<TlsFiles> router_tls = issue("router");
  if (!router_tls.ok()) return router_tls.status();
  router.tls = *router_tls;
  std::vector<std::string> router_flags = {"--drain-timeout-s",
                                           std::to_string(options.router_drain_timeout_s)};
  if (!layout.served_model_name.empty()) {
    router_flags.insert(router_flags.end(), {"--served-model-name", layout.served_model_name});
  }
  if (!layout.routing_policy.empty()) {
    router_flags.insert(router_flags.end(), {"--routing-policy", layout.routing_policy});
  }
  router_flags.insert(router_flags.end(), layout.router_args.begin(), layout.router_args.end());
  Cluster* self = c.get();
  router.assign_ports = [self, pick, host, http_host, model, fixed_http, fixed_grpc, fixed_control,
                         tls, router_flags, bin = options.bin_dir](Process& p) -> absl::Status {
    absl::StatusOr<int> http_port = fixed_http != 0 ? fixed_http : pick(http_host);
    absl::StatusOr<int> grpc_port = fixed_grpc != 0 ? fixed_grpc : pick(host);
    absl::StatusOr<int> control_port = !tls || fixed_control != 0 ? fixed_control : pick(host);
    if (!http_port.ok()) return http_port.status();
    if (!grpc_port.ok()) return grpc_port.status();
    if (!control_port.ok()) return control_port.status();
    self->http_address_ = absl::StrCat(ConnectHost(http_host), ":", *http_port);
    self->http_listen_address_ = absl::StrCat(http_host, ":", *http_port);
    p.grpc_address = absl::StrCat(host, ":", *grpc_port);
    self->control_plane_address_ = tls ? absl::StrCat(host, ":", *control_port) : p.grpc_address;
    p.metrics_url = absl::StrCat("http://", self->http_address_, "/metrics");
    p.argv = {bin + "/tandem-router",
              "--model-dir",
              model,
              "--host",
              http_host,
              "--grpc-host",
              host,
              "--port",
              std::to_string(*http_port),
              "--grpc-port",
              std::to_string(*grpc_port)};
    if (tls) {
      p.argv.insert(p.argv.end(),
                    {"--control-plane-port", std::to_string(*control_port), "--tls-ca", p.tls.ca,
                     "--tls-cert", p.tls.cert, "--tls-key", p.tls.key});
    }
    p.argv.insert(p.argv.end(), router_flags.begin(), router_flags.end());
    return absl::OkStatus();
  };
  router.ports_picked = fixed_http == 0 || fixed_grpc == 0 || (tls && fixed_control == 0);
  router.env.push_back({kClusterTokenEnv, c->cluster_token_});
  router.restarts = RestartPolicy(options.restart);
  c->processes_.push_back(std::move(router));
  if (absl::Status st = c->LaunchPickingPorts(c->processes_[0]); !st.ok()) return st;
  if (absl::Status st = c->WaitForRouter(deadline); !st.ok()) return st;

  std::map<std::string, int> per_role;
  for (const GroupSpec& g : layout.groups) {
    for (int i = 0; i < g.count; ++i) {
      const std::string name = absl::StrCat(g.role, "-", per_role[g.role]++);
      Process w = MakeProcess(name, g.role, "", "");
      std::vector<std::string> flags = {"--worker-id", name, "--router", c->control_plane_address_};
      absl::StatusOr<TlsFiles> worker_tls = issue(name);
      if (!worker_tls.ok()) return worker_tls.status();
      w.tls = *worker_tls;
      if (tls) {
        flags.insert(flags.end(),
                     {"--tls-ca", w.tls.ca, "--tls-cert", w.tls.cert, "--tls-key", w.tls.key});
      }
      if (!layout.served_model_name.empty()) {
        flags.insert(flags.end(), {"--served-model-name", layout.served_model_name});
      }
      for (std::string& f : WorkerLayoutFlags(layout, g)) flags.push_back(std::move(f));
      flags.insert(flags.end(), g.args.begin(), g.args.end());
      const std::string binary = options.bin_dir + (g.role == "prefill" ? "/tandem-prefill-worker"
                                                                        : "/tandem-decode-worker");
      w.assign_ports = [pick, host, model, binary, role = g.role,
                        flags](Process& p) -> absl::Status {
        absl::StatusOr<int> port = pick(host);
        absl::StatusOr<int> metrics_port = pick(host);
        absl::StatusOr<int> kv_port = role != "prefill" ? pick(host) : 0;
        if (!port.ok() || !metrics_port.ok() || !kv_port.ok()) {
          return absl::UnavailableError("no free ports");
        }
        p.grpc_address = absl::StrCat(host, ":", *port);
        p.metrics_url = absl::StrCat("http://", host, ":", *metrics_port, "/metrics");
        p.argv = {binary,
                  "--model",
                  model,
                  "--host",
                  host,
                  "--port",
                  std::to_string(*port),
                  "--metrics-port",
                  std::to_string(*metrics_port)};
        if (role != "prefill") {
          p.argv.insert(p.argv.end(), {"--role", role, "--kv-port", std::to_string(*kv_port)});
        }
        p.argv.insert(p.argv.end(), flags.begin(), flags.end());
        return absl::OkStatus();
      };
      w.ports_picked = true;
      w.env.push_back({kClusterTokenEnv, c->cluster_token_});
      w.restarts = RestartPolicy(options.restart);
      if (!g.gpus.empty()) w.env.push_back({"CUDA_VISIBLE_DEVICES", WorkerGpus(g, i)});
      c->processes_.push_back(std::move(w));
    }
  }
  c->expected_.assign(per_role.begin(), per_role.end());
  for (Process* w : c->workers()) {
    if (absl::Status st = c->LaunchPickingPorts(*w); !st.ok()) return st;
  }
  if (absl::Status st = c->WaitReady(c->expected_, deadline, /*repick_taken_ports=*/true);
      !st.ok()) {
    return st;
  }
  return c;
}

absl::Status Cluster::LaunchPickingPorts(Process& p) {
  if (absl::Status st = p.assign_ports(p); !st.ok()) return st;
  ++p.launches;
  return Launch(p);
}

absl::Status Cluster::RestartIfPortTaken(Process& p, bool may_repick) {
  if (!may_repick || p.child->exit_code() != kExitCannotListen || !p.ports_picked ||
      p.launches >= kMaxLaunchesForPorts) {
    return absl::UnavailableError(absl::StrCat(p.name, " exited with code ",
                                               p.child->exit_code().value_or(-1), "; log tail:\n",
                                               p.child->LogTail()));
  }
  LOG(WARNING) << p.name << " could not listen on a port picked for it (taken since); starting it"
               << " again on new ports";
  return LaunchPickingPorts(p);
}

absl::Status Cluster::WaitForRouter(absl::Time deadline) {
  Process& router = processes_[0];
  while (Clock::Real()->Now() < deadline) {
    if (!router.child->Running()) {
      if (absl::Status st = RestartIfPortTaken(router, /*may_repick=*/true); !st.ok()) return st;
      continue;
    }
    // Short: a program that took the port may accept and never answer. And the answer must be
    // the router's, not that program's.
    absl::StatusOr<HttpResponse> r = HttpGet(http_address_, "/metrics", absl::Milliseconds(250));
    if (r.ok() && r->status == 200 && absl::StrContains(r->body, "tandem_router_workers{")) {
      return absl::OkStatus();
    }
    Clock::Real()->SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("router not listening in time (logs in ", log_dir_, ")"));
}

Cluster::~Cluster() {
  for (Process& p : processes_) p.child.reset();  // SIGKILL + reap
  if (!tls_dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(tls_dir_, ec);
  }
}

absl::Status Cluster::Launch(Process& p) {
  absl::StatusOr<std::unique_ptr<ChildProcess>> child =
      ChildProcess::Start(p.argv, p.env, absl::StrCat(log_dir_, "/", p.name, ".log"));
  if (!child.ok()) return child.status();
  p.child = *std::move(child);
  p.started = Clock::Real()->Now();
  return absl::OkStatus();
}

absl::Status Cluster::Supervise() {
  const absl::Time now = Clock::Real()->Now();
  std::string gave_up;
  for (Process& p : processes_) {
    if (p.child == nullptr || p.given_up || p.child->Running()) continue;
    if (p.restart_at == absl::InfiniteFuture()) {
      const RestartDecision d = p.restarts.OnExit(p.started, now);
      const int code = p.child->exit_code().value_or(-1);
      if (d.give_up) {
        p.given_up = true;
        LOG(ERROR) << p.name << " exited with code " << code << " (crash " << d.rapid_crashes
                   << " in a row within " << restart_.rapid
                   << " of a start): not restarting it (log " << p.child->log_path() << ")";
        absl::StrAppend(&gave_up, p.name, " crashed ", d.rapid_crashes, " times in a row within ",
                        absl::FormatDuration(restart_.rapid),
                        " of starting and is not restarted; log tail:\n", p.child->LogTail(), "\n");
        continue;
      }
      p.restart_at = d.restart_at;
      LOG(WARNING) << p.name << " exited with code " << code << "; restarting it in "
                   << (d.restart_at - now);
    }
    if (now < p.restart_at) continue;
    p.restart_at = absl::InfiniteFuture();
    if (absl::Status st = Launch(p); !st.ok()) {
      p.given_up = true;
      absl::StrAppend(&gave_up, p.name, " cannot be started again: ", st.message(), "\n");
      continue;
    }
    LOG(WARNING) << "restarted " << p.name << " (pid " << p.child->pid() << ")";
  }
  if (!gave_up.empty()) return absl::UnavailableError(gave_up);
  return absl::OkStatus();
}

std::vector<Process*> Cluster::workers() {
  std::vector<Process*> out;
  for (size_t i = 1; i < processes_.size(); ++i) out.push_back(&processes_[i]);
  return out;
}

Process* Cluster::Find(const std::string& name) {
  for (Process& p : processes_) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

absl::Status Cluster::WaitForWorkers(const std::vector<std::pair<std::string, int>>& expected,
                                     absl::Duration timeout) {
  return WaitReady(expected, Clock::Real()->Now() + timeout, /*repick_taken_ports=*/false);
}

absl::Status Cluster::WaitReady(const std::vector<std::pair<std::string, int>>& expected,
                                absl::Time deadline, bool repick_taken_ports) {
  std::string last;
  while (Clock::Real()->Now() < deadline) {
    for (Process& p : processes_) {
      if (p.child == nullptr || p.child->Running()) continue;
      // Never the router's ports: the workers were given its address.
      const bool may_repick = repick_taken_ports && &p != &processes_[0];
      if (absl::Status st = RestartIfPortTaken(p, may_repick); !st.ok()) return st;
    }
    absl::StatusOr<HttpResponse> r = HttpGet(http_address_, "/metrics", absl::Seconds(2));
    if (r.ok() && r->status == 200) {
      const std::map<std::string, int> healthy = HealthyWorkers(r->body);
      bool all = true;
      for (const auto& [role, n] : expected) {
        auto it = healthy.find(role);
        all &= it != healthy.end() && it->second >= n;
      }
      if (all) return absl::OkStatus();
      last = "workers not registered yet";
    } else {
      last = r.ok() ? absl::StrCat("router /metrics answered ", r->status)
                    : std::string(r.status().message());
    }
    Clock::Real()->SleepFor(absl::Milliseconds(100));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("cluster not ready in time: ", last, " (logs in ", log_dir_, ")"));
}

absl::Status Cluster::Restart(const std::string& name) {
  Process* p = Find(name);
  if (p == nullptr) return absl::NotFoundError(absl::StrCat("no process ", name));
  if (p->child != nullptr && p->child->Running()) {
    return absl::FailedPreconditionError(absl::StrCat(name, " is still running"));
  }
  p->restart_at = absl::InfiniteFuture();
  return Launch(*p);
}

std::vector<std::pair<std::string, int>> Cluster::Exited() {
  std::vector<std::pair<std::string, int>> out;
  for (Process& p : processes_) {
    if (p.child != nullptr && !p.child->Running()) {
      out.emplace_back(p.name, p.child->exit_code().value_or(-1));
    }
  }
  return out;
}

absl::Status Cluster::Shutdown(absl::Duration grace) {
  const absl::Time deadline = Clock::Real()->Now() + grace;
  std::string failures;
  auto stop = [&](Process& p) {
    if (p.child == nullptr) return;
    p.child->Signal(SIGTERM);
  };
  auto reap = [&](Process& p) {
    if (p.child == nullptr) return;
    std::optional<int> code =
        p.child->Wait(std::max(deadline - Clock::Real()->Now(), absl::ZeroDuration()));
    if (!code.has_value()) {
      p.child->Signal(SIGKILL);
      code = p.child->Wait(absl::Seconds(5));
      absl::StrAppend(&failures, p.name, " did not stop in time; ");
    } else if (*code != 0) {
      absl::StrAppend(&failures, p.name, " exited with ", *code, "; ");
    }
  };
  stop(processes_[0]);  // the router first: it drains requests still streaming
  reap(processes_[0]);
  for (Process* w : workers()) stop(*w);
  for (Process* w : workers()) reap(*w);
  if (!failures.empty()) return absl::InternalError(failures);
  return absl::OkStatus();
}

}  // namespace tandem::launcher
