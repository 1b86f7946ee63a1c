// tandem serve [--layout FILE] [--model DIR] [--port N] [--host ADDR]: brings up the router and the
// workers of a layout (deploy/launcher/) as separate processes, waits until every worker is
// registered, prints where to point a client, and on SIGTERM / Ctrl-C drains in-flight requests and
// stops everything. With no arguments: the embedded default — 1 prefill + 1 decode worker on the
// CPU backend with a generated tiny model (cached), OpenAI API on port 8000.
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "deploy/cli/commands.h"
#include "deploy/launcher/cluster.h"
#include "engine/cuda/cuda_device.h"
#include "engine/model/make_model.h"

namespace tandem::cli {
namespace {

namespace fs = std::filesystem;

struct ServeFlags {
  std::string layout;
  std::string model;
  int port = -1;
  std::string host;  // empty: the layout's router.host (default loopback)
  std::string log_dir;
  std::string cache_dir;
  int ready_timeout_s = 120;
  int drain_timeout_s = 30;
};

std::string DefaultCacheDir() {
  if (const char* d = std::getenv("TANDEM_CACHE_DIR")) return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME")) return absl::StrCat(d, "/tandem");
  if (const char* d = std::getenv("HOME")) return absl::StrCat(d, "/.cache/tandem");
  return "/tmp/tandem-cache";
}

// The generated tiny model, made once per cache dir (make-model is deterministic).
absl::StatusOr<std::string> TinyModel(const std::string& cache_dir) {
  const std::string dir = absl::StrCat(cache_dir, "/models/tiny");
  if (fs::exists(dir + "/config.json") && fs::exists(dir + "/tokenizer.json")) return dir;
  std::cout << "tandem serve: generating the tiny random-weight model in " << dir << std::endl;
  MakeModelOptions options;
  options.preset = "tiny";
  options.out_dir = dir;
  absl::StatusOr<ModelConfig> config = MakeModel(options);
  if (!config.ok()) return config.status();
  return dir;
}

// Where the other binaries live: $TANDEM_BIN_DIR, else next to this executable.
std::string BinDir() {
  if (const char* d = std::getenv("TANDEM_BIN_DIR")) return d;
  std::error_code ec;
  return fs::read_symlink("/proc/self/exe", ec).parent_path().string();
}

void PrintReady(launcher::Cluster& cluster, const std::string& model_name,
                const std::string& log_dir) {
  const std::string http = cluster.http_address();
  std::cout << "tandem serve: ready at http://" << http << "\n";
  if (cluster.http_listen_address() != http) {
    std::cout << "  listening on   " << cluster.http_listen_address()
              << "  (every interface; the internal ports stay on the layout's host)\n";
  }
  std::cout << "  OpenAI API     http://" << http << "/v1  (model \"" << model_name << "\")\n"
            << "  gRPC API       " << cluster.router().grpc_address << "\n";
  if (!cluster.client_tls().ca.empty()) {
    std::cout << "  registry       " << cluster.control_plane_address()
              << "  (mutual TLS; certificates in "
              << fs::path(cluster.client_tls().ca).parent_path().string() << ")\n";
  }
  std::cout << "  metrics        " << cluster.router().metrics_url << "  (router)\n";
  for (launcher::Process* w : cluster.workers()) {
    std::cout << "                 " << w->metrics_url << "  (" << w->name << ", grpc "
              << w->grpc_address << ", pid " << w->child->pid() << ")\n";
  }
  std::cout << "  logs           " << log_dir << "\n"
            << "Try:\n  curl http://" << http
            << "/v1/completions -H 'Content-Type: application/json' \\\n"
            << "    -d '{\"model\": \"" << model_name
            << "\", \"prompt\": \"Hello\", \"max_tokens\": 16}'\n"
            << "Ctrl-C (or SIGTERM) drains in-flight requests and stops everything." << std::endl;
}

// Blocks until SIGINT / SIGTERM, restarting processes that die meanwhile (Cluster::Supervise).
// Returns false if the router was given up on (crashed again and again): nothing can be served.
bool WaitForStop(launcher::Cluster& cluster) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  const timespec timeout{0, 100 * 1000 * 1000};
  while (sigtimedwait(&set, nullptr, &timeout) < 0) {
    if (absl::Status st = cluster.Supervise(); !st.ok()) {
      std::cerr << "tandem serve: " << st.message() << std::endl;
      const launcher::Process& router = cluster.router();
      if (router.given_up) return false;
    }
  }
  return true;
}

int RunServe(const ServeFlags& f) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // taken synchronously; children unblock them
  absl::StatusOr<launcher::Layout> layout =
      f.layout.empty() ? launcher::DefaultLayout() : launcher::LoadLayout(f.layout);
  if (!layout.ok()) {
    std::cerr << "tandem serve: " << layout.status().message() << std::endl;
    return 2;
  }
  if (f.port >= 0) layout->router_port = f.port;
  if (!f.host.empty()) {
    if (absl::Status st = launcher::CheckListenHost(f.host, "--host"); !st.ok()) {
      std::cerr << "tandem serve: " << st.message() << std::endl;
      return 2;
    }
    layout->router_host = f.host;
  }
  std::string model = f.model.empty() ? layout->model : f.model;
  // auto: the CUDA backend when a model is given and a GPU is visible (the generated tiny model
  // is CPU-only: its head_dim is below what the CUDA kernels cover).
  if (layout->backend == "auto") {
    layout->backend = !model.empty() && CudaDeviceAvailable() ? "cuda" : "cpu";
  }
  if (model.empty()) {
    if (layout->backend != "cpu") {
      std::cerr << "tandem serve: --model DIR is required with the cuda backend" << std::endl;
      return 2;
    }
    absl::StatusOr<std::string> tiny =
        TinyModel(f.cache_dir.empty() ? DefaultCacheDir() : f.cache_dir);
    if (!tiny.ok()) {
      std::cerr << "tandem serve: cannot generate the tiny model: " << tiny.status() << std::endl;
      return 1;
    }
    model = *tiny;
  }
  launcher::ClusterOptions options;
  options.bin_dir = BinDir();
  options.model_dir = model;
  options.log_dir = f.log_dir;
  if (options.log_dir.empty()) {
    char tmpl[] = "/tmp/tandem-serve-XXXXXX";
    options.log_dir = mkdtemp(tmpl) ? tmpl : "/tmp";
  }
  fs::create_directories(options.log_dir);
  options.ready_timeout = absl::Seconds(f.ready_timeout_s);
  options.router_drain_timeout_s = f.drain_timeout_s;
  absl::StatusOr<std::unique_ptr<launcher::Cluster>> cluster =
      launcher::Cluster::Start(*layout, options);
  if (!cluster.ok()) {
    std::cerr << "tandem serve: " << cluster.status().message() << std::endl;
    return 1;
  }
  const std::string name = layout->served_model_name.empty()
                               ? fs::path(model).lexically_normal().filename().string()
                               : layout->served_model_name;
  PrintReady(**cluster, name, options.log_dir);
  if (!WaitForStop(**cluster)) {
    std::cerr << "tandem serve: the router keeps crashing; stopping everything" << std::endl;
    (void)(*cluster)->Shutdown(absl::Seconds(5));
    return 1;
  }
  std::cout << "tandem serve: draining in-flight requests, then stopping" << std::endl;
  absl::Status st = (*cluster)->Shutdown(absl::Seconds(f.drain_timeout_s + 10));
  if (!st.ok()) {
    std::cerr << "tandem serve: " << st.message() << std::endl;
    return 1;
  }
  std::cout << "tandem serve: stopped" << std::endl;
  return 0;
}

}  // namespace

std::function<int()> AddServeCommand(CLI::App* sub) {
  auto f = std::make_shared<ServeFlags>();
  sub->add_option("--layout", f->layout, "Layout YAML (deploy/layouts/); default: 1P + 1D CPU");
  sub->add_option("--model", f->model, "Hugging Face model directory (default: tiny, generated)");
  sub->add_option("--port", f->port, "OpenAI HTTP port (default: the layout's, 8000; 0: any)");
  sub->add_option("--host", f->host,
                  "OpenAI HTTP listen address (default: the layout's router.host, else "
                  "127.0.0.1; 0.0.0.0: every interface, e.g. in a container). The internal "
                  "ports stay on the layout's host");
  sub->add_option("--log-dir", f->log_dir, "Where each process's log goes (default: a temp dir)");
  sub->add_option("--cache-dir", f->cache_dir, "Where the generated tiny model is cached");
  sub->add_option("--ready-timeout-s", f->ready_timeout_s, "Wait this long for readiness");
  sub->add_option("--drain-timeout-s", f->drain_timeout_s, "On stop, in-flight request limit");
  return [f] { return RunServe(*f); };
}

}  // namespace tandem::cli
