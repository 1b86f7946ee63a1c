// Layout: what `tandem serve` brings up on one node, read from a YAML file (deploy/layouts/).
// One router plus worker groups; each group is `count` identical worker processes of one role.
// tensor_parallel / pipeline_parallel become each worker's --tensor-parallel-size /
// --pipeline-parallel-size: one engine of TP x PP ranks (threads) per worker, on either backend
// (on cuda rank r on the worker's r-th GPU). Prefill and
// decode groups may differ in sizes: the TCP KV transport maps their pages (comm/kv_head_map.h);
// kv_transport ipc / nccl copy pages unchanged and need equal sizes (refused otherwise; auto then
// uses tcp). Every group's TP must split the model (checked as each worker loads it). GPU lists set
// CUDA_VISIBLE_DEVICES: one GPU per worker, or one per rank; a worker whose ranks would share a GPU
// is refused unless the group sets allow_device_sharing.
//
//   model: /models/llama          # HF directory; empty: generate the tiny model (CPU)
//   served_model_name: ""         # default: the directory's name
//   backend: auto                 # auto (cuda with a model and a visible GPU, else cpu),
//                                 # cpu or cuda
//   host: 127.0.0.1               # every internal port (router gRPC, workers, KV receivers)
//   kv_transport: auto            # prefill -> decode KV data path, the workers' --kv-transport:
//                                 # tcp, ipc (CUDA IPC, both on one GPU), nccl (NCCL, on two
//                                 # GPUs) or auto (nccl to a pool on another GPU, else ipc where
//                                 # the decode pool can be mapped, else tcp); ipc, nccl need cuda
//   control_plane_tls: true       # mutual TLS between router and workers: a fresh deployment
//                                 # CA and one certificate per process (deployment_ca.h); the
//                                 # cluster token is checked as well
//   router: {port: 8000, grpc_port: 0, args: [],  # 0: any free port
//            host: "",            # the OpenAI HTTP listen address; "": `host` (loopback);
//                                 # 0.0.0.0: every interface (a container); serve's --host
//            control_plane_port: 0,  # the worker registry's mutual-TLS port (0: any free)
//            routing_policy: ""}  # "": the router's (least-loaded) | round-robin | kv-aware
//   engine: {page_size: 16, num_pages: 0, kv_memory_bytes: 0, gpu_memory_utilization: 0.9,
//            max_num_seqs: 256, max_num_batched_tokens: 2048, max_model_len: 0,
//            cuda_graph_sizes: [], enforce_eager: false,      # worker flags of the same names
//            enable_prefix_caching: true, async_scheduling: true,
//            quantization: "",     # --quantization: "" | fp8 | int8 | int4 (load time, on an
//                                  # unquantized checkpoint; not with TP / PP > 1)
//            kv_cache_dtype: auto, # --kv-cache-dtype: auto | bf16 | fp8 (every group alike:
//                                  # prefill and decode pages must match)
//            speculative_config: {method: ngram, num_speculative_tokens: 4,   # vLLM's fields
//                                 prompt_lookup_min: 1, prompt_lookup_max: 3, model: /draft}}
//   groups:
//     - {role: prefill, count: 1, gpus: [0], tensor_parallel: 1, pipeline_parallel: 1,
//        allow_device_sharing: false, args: []}
//     - {role: decode, count: 1, gpus: [1]}
// A key not listed here is an error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::launcher {

struct GroupSpec {
  std::string role;  // "prefill", "decode" or "mixed"
  int count = 1;     // worker processes
  // CUDA_VISIBLE_DEVICES of each worker: one GPU per worker, or one per rank (count x TP x PP,
  // worker w's ranks in order at [w · TP · PP, (w + 1) · TP · PP)); empty: none set.
  std::vector<int> gpus;
  int tensor_parallel = 1;
  int pipeline_parallel = 1;
  // Lets a worker's ranks share a GPU (the workers' --allow-device-sharing): needed when gpus
  // gives a worker fewer distinct GPUs than it has ranks.
  bool allow_device_sharing = false;
  std::vector<std::string> args;  // extra worker flags
};

struct EngineSpec {
  int page_size = 16;
  int num_pages = 0;
  int64_t kv_memory_bytes = 0;  // 0: 256 MiB on cpu; gpu_memory_utilization on cuda
  double gpu_memory_utilization = 0.9;
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  int max_model_len = 0;
  std::vector<int> cuda_graph_sizes;  // empty: the engine's default list
  bool enforce_eager = false;
  bool enable_prefix_caching = true;
  bool async_scheduling = true;
  std::string quantization;  // the workers' --quantization; empty: none (or the checkpoint's)
  std::string kv_cache_dtype = "auto";  // the workers' --kv-cache-dtype
  // speculative_config (decode and mixed workers; prefill workers do not speculate).
  std::string speculative_method = "none";  // none | ngram | draft
  int num_speculative_tokens = 0;
  std::string speculative_draft_model;
  int prompt_lookup_min = 1;
  int prompt_lookup_max = 3;
};

struct Layout {
  std::string model;
  std::string served_model_name;
  std::string backend = "auto";
  std::string host = "127.0.0.1";
  std::string kv_transport = "auto";  // tcp | ipc | nccl | auto (prefill and decode workers)
  bool control_plane_tls = true;
  std::string router_host;  // the router's HTTP listen address; empty: `host`
  int router_port = 8000;
  int router_grpc_port = 0;
  int router_control_plane_port = 0;  // with control_plane_tls; 0: picked
  std::vector<std::string> router_args;
  std::string routing_policy;  // router --routing-policy; empty: the router's default
  EngineSpec engine;
  std::vector<GroupSpec> groups;
};

// The embedded default: 1 prefill + 1 decode worker on the CPU backend, port 8000.
Layout DefaultLayout();
// InvalidArgument naming the bad field (unknown role, count < 1, a prefill group without a
// decode group, ...).
absl::StatusOr<Layout> ParseLayout(const std::string& yaml_text);
absl::StatusOr<Layout> LoadLayout(const std::string& path);
// InvalidArgument unless `host` is an IPv4 address literal (0.0.0.0: every interface); `what`
// names the setting in the message. Host names and IPv6 are not supported (the launcher and the
// workers listen and connect over IPv4 only).
absl::Status CheckListenHost(const std::string& host, const std::string& what);
// The router's HTTP listen address: router_host, else host.
std::string RouterHttpHost(const Layout& l);
// An address a client on this machine connects to for a listener bound to `host`: 127.0.0.1
// for 0.0.0.0, else `host`.
std::string ConnectHost(const std::string& host);

// A group's gpus against its workers and ranks (GroupSpec::gpus): InvalidArgument for a list of
// another length, a negative GPU, or a worker whose ranks would share a GPU without
// allow_device_sharing. ParseLayout checks every group.
absl::Status CheckGroupGpus(const GroupSpec& g);
// Worker `worker`'s CUDA_VISIBLE_DEVICES ("3" or "2,3"); "" when the group lists none.
std::string WorkerGpus(const GroupSpec& g, int worker);

}  // namespace tandem::launcher
