#include "deploy/launcher/layout.h"

#include <arpa/inet.h>
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <initializer_list>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem::launcher {
namespace {

// Reads an optional scalar field; yaml-cpp throws on a type mismatch (caught by ParseLayout).
template <typename T>
void Read(const YAML::Node& node, const char* key, T* out) {
  if (node[key]) *out = node[key].as<T>();
}

// A key this parser does not read is an error (a misspelt setting must not be ignored).
void CheckKeys(const YAML::Node& node, const std::string& where,
               std::initializer_list<const char*> known) {
  if (!node.IsMap()) throw YAML::Exception(node.Mark(), where + " must be a mapping");
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    bool found = false;
    for (const char* k : known) found |= key == k;
    if (!found) throw YAML::Exception(kv.first.Mark(), "unknown key '" + key + "' in " + where);
  }
}

GroupSpec ParseGroup(const YAML::Node& g) {
  CheckKeys(g, "groups",
            {"role", "count", "gpus", "tensor_parallel", "pipeline_parallel",
             "allow_device_sharing", "args"});
  GroupSpec s;
  Read(g, "role", &s.role);
  Read(g, "count", &s.count);
  Read(g, "gpus", &s.gpus);
  Read(g, "tensor_parallel", &s.tensor_parallel);
  Read(g, "pipeline_parallel", &s.pipeline_parallel);
  Read(g, "allow_device_sharing", &s.allow_device_sharing);
  Read(g, "args", &s.args);
  return s;
}

absl::Status Validate(const Layout& l) {
  if (absl::Status st = CheckListenHost(l.host, "host"); !st.ok()) return st;
  if (!l.router_host.empty()) {
    if (absl::Status st = CheckListenHost(l.router_host, "router.host"); !st.ok()) return st;
  }
  bool prefill = false, decode = false, mixed = false;
  for (const GroupSpec& g : l.groups) {
    if (g.role != "prefill" && g.role != "decode" && g.role != "mixed") {
      return absl::InvalidArgumentError(
          absl::StrCat("groups: role '", g.role, "' (want prefill, decode or mixed)"));
    }
    if (g.count < 1) return absl::InvalidArgumentError("groups: count must be >= 1");
    if (g.tensor_parallel < 1 || g.pipeline_parallel < 1) {
      return absl::InvalidArgumentError(
          "groups: tensor_parallel and pipeline_parallel must be >= 1");
    }
    if (absl::Status st = CheckGroupGpus(g); !st.ok()) return st;
    prefill |= g.role == "prefill";
    decode |= g.role == "decode";
    mixed |= g.role == "mixed";
  }
  if (prefill != decode) {
    return absl::InvalidArgumentError("a layout needs both prefill and decode groups (or mixed)");
  }
  if (!prefill && !mixed) return absl::InvalidArgumentError("a layout needs at least one worker");
  if (l.router_control_plane_port != 0 && !l.control_plane_tls) {
    return absl::InvalidArgumentError(
        "router: control_plane_port is the registry's mutual-TLS port; it needs "
        "control_plane_tls: true");
  }
  if (l.backend != "auto" && l.backend != "cpu" && l.backend != "cuda") {
    return absl::InvalidArgumentError("backend must be auto, cpu or cuda");
  }
  if (l.kv_transport != "tcp" && l.kv_transport != "ipc" && l.kv_transport != "nccl" &&
      l.kv_transport != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_transport must be tcp, ipc, nccl or auto (got '", l.kv_transport, "')"));
  }
  if (l.kv_transport == "ipc" && l.backend == "cpu") {
    return absl::InvalidArgumentError(
        "kv_transport ipc needs the KV pools on a GPU (backend cuda or auto); use tcp or auto");
  }
  if (l.kv_transport == "nccl" && l.backend == "cpu") {
    return absl::InvalidArgumentError(
        "kv_transport nccl needs the KV pools on GPUs (backend cuda or auto); use tcp or auto");
  }
  // Every prefill group may push its KV to every decode group. Groups of different
  // tensor_parallel / pipeline_parallel stack their ranks' pages differently: the TCP transport
  // maps them (comm/kv_head_map.h), CUDA IPC and NCCL copy pages unchanged and cannot.
  if (l.kv_transport == "ipc" || l.kv_transport == "nccl") {
    const GroupSpec* first_disagg = nullptr;
    for (const GroupSpec& g : l.groups) {
      if (g.role == "mixed") continue;
      if (first_disagg == nullptr) {
        first_disagg = &g;
        continue;
      }
      if (g.tensor_parallel != first_disagg->tensor_parallel ||
          g.pipeline_parallel != first_disagg->pipeline_parallel) {
        return absl::InvalidArgumentError(absl::StrCat(
            "kv_transport ", l.kv_transport,
            " copies KV pages unchanged: prefill and decode groups must then have the same "
            "tensor_parallel and pipeline_parallel (",
            first_disagg->role, ": TP ", first_disagg->tensor_parallel, " PP ",
            first_disagg->pipeline_parallel, ", ", g.role, ": TP ", g.tensor_parallel, " PP ",
            g.pipeline_parallel, "); groups of different sizes need kv_transport tcp or auto"));
      }
    }
  }
  if (!(l.engine.gpu_memory_utilization > 0.0 && l.engine.gpu_memory_utilization <= 1.0)) {
    return absl::InvalidArgumentError("engine: gpu_memory_utilization must be in (0, 1]");
  }
  const std::string& q = l.engine.quantization;
  if (!q.empty() && q != "fp8" && q != "int8" && q != "int4") {
    return absl::InvalidArgumentError(
        absl::StrCat("engine: quantization '", q, "' (want fp8, int8 or int4, or none)"));
  }
  const std::string& kv = l.engine.kv_cache_dtype;
  if (kv != "auto" && kv != "bf16" && kv != "fp8") {
    return absl::InvalidArgumentError(
        absl::StrCat("engine: kv_cache_dtype '", kv, "' (want auto, bf16 or fp8)"));
  }
  const std::string& method = l.engine.speculative_method;
  if (method != "none" && method != "ngram" && method != "draft") {
    return absl::InvalidArgumentError(
        "engine: speculative_config.method must be none, ngram or draft");
  }
  if (method != "none" && l.engine.num_speculative_tokens < 1) {
    return absl::InvalidArgumentError(
        "engine: speculative_config.num_speculative_tokens must be >= 1");
  }
  if (method == "draft" && l.engine.speculative_draft_model.empty()) {
    return absl::InvalidArgumentError("engine: speculative_config.model (the draft) is missing");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckListenHost(const std::string& host, const std::string& what) {
  in_addr addr{};
  if (inet_pton(AF_INET, host.c_str(), &addr) == 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, " '", host,
                   "' is not an IPv4 address (want e.g. 127.0.0.1, or 0.0.0.0 for every "
                   "interface; host names and IPv6 are not supported)"));
}

std::string RouterHttpHost(const Layout& l) {
  return l.router_host.empty() ? l.host : l.router_host;
}

std::string ConnectHost(const std::string& host) { return host == "0.0.0.0" ? "127.0.0.1" : host; }

namespace {

// How many of the group's gpus each worker gets: one, or one per rank (CheckGroupGpus).
int GpusPerWorker(const GroupSpec& g) {
  if (g.gpus.empty()) return 0;
  return static_cast<int>(g.gpus.size()) == g.count ? 1 : g.tensor_parallel * g.pipeline_parallel;
}

}  // namespace

absl::Status CheckGroupGpus(const GroupSpec& g) {
  if (g.gpus.empty()) return absl::OkStatus();
  const int ranks = g.tensor_parallel * g.pipeline_parallel;
  const int n = static_cast<int>(g.gpus.size());
  if (n != g.count && n != g.count * ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("groups: gpus lists ", n, " GPUs for ", g.count, " ", g.role,
                     " worker(s) of TP ", g.tensor_parallel, " x PP ", g.pipeline_parallel,
                     ": list one GPU per worker, or one per rank (", g.count * ranks, ")"));
  }
  for (int w = 0; w < g.count; ++w) {
    const int per = GpusPerWorker(g);
    std::set<int> mine;
    for (int i = 0; i < per; ++i) {
      const int gpu = g.gpus[w * per + i];
      if (gpu < 0) return absl::InvalidArgumentError("groups: gpus must be >= 0");
      mine.insert(gpu);
    }
    if (static_cast<int>(mine.size()) < ranks && !g.allow_device_sharing) {
      return absl::InvalidArgumentError(absl::StrCat(
          "groups: a ", g.role, " worker of TP ", g.tensor_parallel, " x PP ", g.pipeline_parallel,
          " gets ", mine.size(), " distinct GPU(s) for its ", ranks,
          " ranks: list one GPU per rank (count x TP x PP of them), or set "
          "allow_device_sharing: true to share (slower; for trying a layout)"));
    }
  }
  return absl::OkStatus();
}

std::string WorkerGpus(const GroupSpec& g, int worker) {
  const int per = GpusPerWorker(g);
  std::vector<int> mine(g.gpus.begin() + worker * per, g.gpus.begin() + (worker + 1) * per);
  return absl::StrJoin(mine, ",");
}

Layout DefaultLayout() {
  Layout l;
  GroupSpec prefill;
  prefill.role = "prefill";
  GroupSpec decode;
  decode.role = "decode";
  l.groups = {prefill, decode};
  return l;
}

absl::StatusOr<Layout> ParseLayout(const std::string& yaml_text) {
  Layout l;
  try {  // yaml-cpp reports syntax and type errors by throwing
    const YAML::Node root = YAML::Load(yaml_text);
    if (root.IsNull()) return absl::InvalidArgumentError("layout: the file is empty");
    CheckKeys(root, "the layout",
              {"model", "served_model_name", "backend", "host", "kv_transport", "control_plane_tls",
               "router", "engine", "groups"});
    Read(root, "model", &l.model);
    Read(root, "served_model_name", &l.served_model_name);
    Read(root, "backend", &l.backend);
    Read(root, "host", &l.host);
    Read(root, "kv_transport", &l.kv_transport);
    Read(root, "control_plane_tls", &l.control_plane_tls);
    if (const YAML::Node r = root["router"]) {
      CheckKeys(r, "router",
                {"host", "port", "grpc_port", "control_plane_port", "args", "routing_policy"});
      Read(r, "host", &l.router_host);
      Read(r, "port", &l.router_port);
      Read(r, "grpc_port", &l.router_grpc_port);
      Read(r, "control_plane_port", &l.router_control_plane_port);
      Read(r, "args", &l.router_args);
      Read(r, "routing_policy", &l.routing_policy);
    }
    if (const YAML::Node e = root["engine"]) {
      CheckKeys(e, "engine",
                {"page_size", "num_pages", "kv_memory_bytes", "max_num_seqs",
                 "max_num_batched_tokens", "gpu_memory_utilization", "max_model_len",
                 "cuda_graph_sizes", "enforce_eager", "enable_prefix_caching", "async_scheduling",
                 "quantization", "kv_cache_dtype", "speculative_config"});
      Read(e, "page_size", &l.engine.page_size);
      Read(e, "num_pages", &l.engine.num_pages);
      Read(e, "kv_memory_bytes", &l.engine.kv_memory_bytes);
      Read(e, "max_num_seqs", &l.engine.max_num_seqs);
      Read(e, "max_num_batched_tokens", &l.engine.max_num_batched_tokens);
      Read(e, "gpu_memory_utilization", &l.engine.gpu_memory_utilization);
      Read(e, "max_model_len", &l.engine.max_model_len);
      Read(e, "cuda_graph_sizes", &l.engine.cuda_graph_sizes);
      Read(e, "enforce_eager", &l.engine.enforce_eager);
      Read(e, "enable_prefix_caching", &l.engine.enable_prefix_caching);
      Read(e, "async_scheduling", &l.engine.async_scheduling);
      Read(e, "quantization", &l.engine.quantization);
      Read(e, "kv_cache_dtype", &l.engine.kv_cache_dtype);
      if (const YAML::Node s = e["speculative_config"]) {
        CheckKeys(s, "engine.speculative_config",
                  {"method", "num_speculative_tokens", "model", "prompt_lookup_min",
                   "prompt_lookup_max"});
        Read(s, "method", &l.engine.speculative_method);
        Read(s, "num_speculative_tokens", &l.engine.num_speculative_tokens);
        Read(s, "model", &l.engine.speculative_draft_model);
        Read(s, "prompt_lookup_min", &l.engine.prompt_lookup_min);
        Read(s, "prompt_lookup_max", &l.engine.prompt_lookup_max);
      }
    }
    if (const YAML::Node groups = root["groups"]) {
      for (const YAML::Node& g : groups) l.groups.push_back(ParseGroup(g));
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("layout: ", e.what()));
  }
  if (absl::Status st = Validate(l); !st.ok()) return st;
  return l;
}

absl::StatusOr<Layout> LoadLayout(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read layout file ", path));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<Layout> l = ParseLayout(text.str());
  if (!l.ok())
    return absl::Status(l.status().code(), absl::StrCat(path, ": ", l.status().message()));
  return l;
}

}  // namespace tandem::launcher
