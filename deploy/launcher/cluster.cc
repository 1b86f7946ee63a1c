#include "deploy/launcher/cluster.h"

#include <signal.h>

#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "comm/socket_io.h"
#include "deploy/launcher/http_get.h"

namespace tandem::launcher {
namespace {

std::vector<std::string> EngineFlags(const Layout& l) {
  return {"--backend",
          l.backend,
          "--page-size",
          std::to_string(l.engine.page_size),
          "--num-pages",
          std::to_string(l.engine.num_pages),
          "--kv-memory-bytes",
          std::to_string(l.engine.kv_memory_bytes),
          "--max-num-seqs",
          std::to_string(l.engine.max_num_seqs),
          "--max-num-batched-tokens",
          std::to_string(l.engine.max_num_batched_tokens)};
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

absl::StatusOr<int> PickFreePort(const std::string& host) {
  // The kernel may hand the same just-closed port out twice in a row; never return a port this
  // process already returned (holding the duplicate open while asking again).
  static absl::Mutex mu;
  static auto* given = new std::set<int>;
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
  const std::string model = options.model_dir.empty() ? layout.model : options.model_dir;
  const std::string& host = layout.host;
  auto port_or_free = [&](int port) -> absl::StatusOr<int> {
    return port != 0 ? absl::StatusOr<int>(port) : PickFreePort(host);
  };
  absl::StatusOr<int> http_port = port_or_free(layout.router_port);
  absl::StatusOr<int> grpc_port = port_or_free(layout.router_grpc_port);
  if (!http_port.ok()) return http_port.status();
  if (!grpc_port.ok()) return grpc_port.status();
  c->http_address_ = absl::StrCat(host, ":", *http_port);
  Process router = MakeProcess("router", "router", absl::StrCat(host, ":", *grpc_port),
                               absl::StrCat("http://", c->http_address_, "/metrics"));
  router.argv = {options.bin_dir + "/tandem-router",
                 "--model-dir",
                 model,
                 "--host",
                 host,
                 "--port",
                 std::to_string(*http_port),
                 "--grpc-port",
                 std::to_string(*grpc_port),
                 "--drain-timeout-s",
                 std::to_string(options.router_drain_timeout_s)};
  if (!layout.served_model_name.empty()) {
    router.argv.insert(router.argv.end(), {"--served-model-name", layout.served_model_name});
  }
  router.argv.insert(router.argv.end(), layout.router_args.begin(), layout.router_args.end());
  c->processes_.push_back(std::move(router));
  std::map<std::string, int> per_role;
  for (const GroupSpec& g : layout.groups) {
    for (int i = 0; i < g.count; ++i) {
      absl::StatusOr<int> port = PickFreePort(host);
      absl::StatusOr<int> metrics_port = PickFreePort(host);
      absl::StatusOr<int> kv_port = PickFreePort(host);
      if (!port.ok() || !metrics_port.ok() || !kv_port.ok()) {
        return absl::UnavailableError("no free ports");
      }
      const std::string name = absl::StrCat(g.role, "-", per_role[g.role]++);
      Process w = MakeProcess(name, g.role, absl::StrCat(host, ":", *port),
                              absl::StrCat("http://", host, ":", *metrics_port, "/metrics"));
      const std::string binary =
          g.role == "prefill" ? "/tandem-prefill-worker" : "/tandem-decode-worker";
      w.argv = {options.bin_dir + binary,
                "--model",
                model,
                "--worker-id",
                name,
                "--host",
                host,
                "--port",
                std::to_string(*port),
                "--metrics-port",
                std::to_string(*metrics_port),
                "--router",
                c->router().grpc_address};
      if (g.role != "prefill") {
        w.argv.insert(w.argv.end(), {"--role", g.role, "--kv-port", std::to_string(*kv_port)});
      }
      if (!layout.served_model_name.empty()) {
        w.argv.insert(w.argv.end(), {"--served-model-name", layout.served_model_name});
      }
      for (std::string& f : EngineFlags(layout)) w.argv.push_back(std::move(f));
      w.argv.insert(w.argv.end(), g.args.begin(), g.args.end());
      if (!g.gpus.empty()) w.env.push_back({"CUDA_VISIBLE_DEVICES", std::to_string(g.gpus[i])});
      c->processes_.push_back(std::move(w));
    }
  }
  c->expected_.assign(per_role.begin(), per_role.end());
  for (Process& p : c->processes_) {
    if (absl::Status st = c->Launch(p); !st.ok()) return st;
  }
  if (absl::Status st = c->WaitForWorkers(c->expected_, options.ready_timeout); !st.ok()) {
    return st;
  }
  return c;
}

Cluster::~Cluster() {
  for (Process& p : processes_) p.child.reset();  // SIGKILL + reap
}

absl::Status Cluster::Launch(Process& p) {
  absl::StatusOr<std::unique_ptr<ChildProcess>> child =
      ChildProcess::Start(p.argv, p.env, absl::StrCat(log_dir_, "/", p.name, ".log"));
  if (!child.ok()) return child.status();
  p.child = *std::move(child);
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
  const absl::Time deadline = absl::Now() + timeout;
  std::string last;
  while (absl::Now() < deadline) {
    for (Process& p : processes_) {
      if (p.child != nullptr && !p.child->Running()) {
        return absl::UnavailableError(absl::StrCat(p.name, " exited with code ",
                                                   p.child->exit_code().value_or(-1),
                                                   "; log tail:\n", p.child->LogTail()));
      }
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
    absl::SleepFor(absl::Milliseconds(100));
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
  const absl::Time deadline = absl::Now() + grace;
  std::string failures;
  auto stop = [&](Process& p) {
    if (p.child == nullptr) return;
    p.child->Signal(SIGTERM);
  };
  auto reap = [&](Process& p) {
    if (p.child == nullptr) return;
    std::optional<int> code = p.child->Wait(std::max(deadline - absl::Now(), absl::ZeroDuration()));
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
