// Layout files: the shipped ones parse, and mistakes are refused with a message that names them.
#include "deploy/launcher/layout.h"

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "deploy/launcher/cluster.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::launcher {
namespace {

std::string SourceDir() {
  const char* s = std::getenv("TANDEM_SOURCE_DIR");
  return s ? s : ".";
}

TEST(Layout, ShippedLayoutsParse) {
  // Every file in deploy/layouts, so a new layout is checked without being listed here.
  int parsed = 0;
  for (const auto& entry : std::filesystem::directory_iterator(SourceDir() + "/deploy/layouts")) {
    ASSERT_EQ(entry.path().extension(), ".yaml") << entry.path() << ": not a layout";
    absl::StatusOr<Layout> l = LoadLayout(entry.path().string());
    EXPECT_TRUE(l.ok()) << entry.path() << ": " << l.status();
    if (l.ok() && !l->routing_policy.empty()) {
      EXPECT_THAT(l->routing_policy, testing::AnyOf("least-loaded", "round-robin", "kv-aware"))
          << entry.path();
    }
    ++parsed;
  }
  EXPECT_GE(parsed, 10);  // the ten layouts of this tree at least: the directory was found
  absl::StatusOr<Layout> l = LoadLayout(SourceDir() + "/deploy/layouts/2p2d.yaml");
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->groups.size(), 2u);
  EXPECT_EQ(l->groups[0].role, "prefill");
  EXPECT_EQ(l->groups[0].count, 2);
  EXPECT_EQ(l->groups[1].count, 2);
  absl::StatusOr<Layout> gpu = LoadLayout(SourceDir() + "/deploy/layouts/h200x2.yaml");
  ASSERT_TRUE(gpu.ok());
  EXPECT_EQ(gpu->backend, "cuda");
  EXPECT_EQ(gpu->groups[1].gpus, std::vector<int>{1});
  absl::StatusOr<Layout> one = LoadLayout(SourceDir() + "/deploy/layouts/h200-1p1d.yaml");
  ASSERT_TRUE(one.ok());
  // Two workers share GPU 0: each takes its share of the memory.
  EXPECT_EQ(one->groups[0].gpus, std::vector<int>{0});
  EXPECT_EQ(one->groups[1].gpus, std::vector<int>{0});
  EXPECT_LE(one->engine.gpu_memory_utilization * 2, 0.9);
  EXPECT_EQ(one->kv_transport, "ipc");  // the pair shares GPU 0: KV by CUDA IPC
  EXPECT_EQ(gpu->kv_transport, "auto");
  // Its colocated baseline: two mixed workers, one per GPU.
  absl::StatusOr<Layout> two = LoadLayout(SourceDir() + "/deploy/layouts/h200x2-mixed.yaml");
  ASSERT_TRUE(two.ok()) << two.status();
  ASSERT_EQ(two->groups.size(), 1u);
  EXPECT_EQ(two->groups[0].role, "mixed");
  EXPECT_EQ(two->groups[0].count, 2);
  EXPECT_EQ(two->groups[0].gpus, (std::vector<int>{0, 1}));
}

// kv_transport reaches the prefill and decode workers as --kv-transport (a mixed worker moves no
// KV and gets none); auto by default.
TEST(Layout, KvTransportIsPassedToPrefillAndDecodeWorkers) {
  auto flag = [](const std::vector<std::string>& flags) -> std::string {
    for (size_t i = 0; i + 1 < flags.size(); ++i) {
      if (flags[i] == "--kv-transport") return flags[i + 1];
    }
    return "(none)";
  };
  for (const char* kind : {"tcp", "ipc", "nccl", "auto"}) {
    absl::StatusOr<Layout> l =
        ParseLayout(absl::StrCat("backend: cuda\nkv_transport: ", kind,
                                 "\ngroups: [{role: prefill}, {role: decode}, {role: mixed}]"));
    ASSERT_TRUE(l.ok()) << kind << ": " << l.status();
    EXPECT_EQ(l->kv_transport, kind);
    EXPECT_EQ(flag(WorkerLayoutFlags(*l, l->groups[0])), kind);
    EXPECT_EQ(flag(WorkerLayoutFlags(*l, l->groups[1])), kind);
    EXPECT_EQ(flag(WorkerLayoutFlags(*l, l->groups[2])), "(none)");
  }
  EXPECT_EQ(DefaultLayout().kv_transport, "auto");
  EXPECT_EQ(flag(WorkerLayoutFlags(DefaultLayout(), DefaultLayout().groups[1])), "auto");
}

// The one-GPU layout for kv-aware routing over two prefill workers: three workers on GPU 0,
// each with its share of the memory, KV over CUDA IPC, and the two lines
// loadgen/measure_prefix_cache.sh replaces per run.
TEST(Layout, OneGpuTwoPrefillOneDecode) {
  absl::StatusOr<Layout> l = LoadLayout(SourceDir() + "/deploy/layouts/h200-2p1d.yaml");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->backend, "cuda");
  EXPECT_EQ(l->routing_policy, "kv-aware");
  EXPECT_TRUE(l->engine.enable_prefix_caching);
  ASSERT_EQ(l->groups.size(), 2u);
  EXPECT_EQ(l->groups[0].role, "prefill");
  EXPECT_EQ(l->groups[0].count, 2);
  EXPECT_EQ(l->groups[0].gpus, (std::vector<int>{0, 0}));
  EXPECT_EQ(l->groups[1].role, "decode");
  EXPECT_EQ(l->groups[1].count, 1);
  EXPECT_EQ(l->groups[1].gpus, std::vector<int>{0});
  EXPECT_EQ(l->kv_transport, "ipc");
  int workers = 0;
  for (const GroupSpec& g : l->groups) {
    workers += g.count;
    EXPECT_TRUE(g.args.empty()) << g.role;
  }
  EXPECT_EQ(workers, 3);
  EXPECT_LE(l->engine.gpu_memory_utilization * workers, 0.9 + 1e-9);
  // Each share of an H200's 140 GB holds Qwen3-8B's 16.4 GB of weights, the 512 MiB kept for
  // graphs (engine/kv_budget.h) and a KV pool of at least 16 GB.
  EXPECT_GE(l->engine.gpu_memory_utilization * 140e9 - 16.4e9 - 0.54e9, 16e9);
}

TEST(Layout, EngineFieldsParse) {
  absl::StatusOr<Layout> l = ParseLayout(
      "engine: {gpu_memory_utilization: 0.5, max_model_len: 4096, cuda_graph_sizes: [1, 8, 64],"
      " enforce_eager: true, kv_memory_bytes: 1024, enable_prefix_caching: false,"
      " async_scheduling: false}\n"
      "groups: [{role: mixed}]");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->engine.gpu_memory_utilization, 0.5);
  EXPECT_EQ(l->engine.max_model_len, 4096);
  EXPECT_EQ(l->engine.cuda_graph_sizes, (std::vector<int>{1, 8, 64}));
  EXPECT_TRUE(l->engine.enforce_eager);
  EXPECT_EQ(l->engine.kv_memory_bytes, 1024);
  EXPECT_FALSE(l->engine.enable_prefix_caching);
  EXPECT_TRUE(DefaultLayout().engine.enable_prefix_caching);
  EXPECT_FALSE(l->engine.async_scheduling);
  EXPECT_TRUE(DefaultLayout().engine.async_scheduling);
  EXPECT_EQ(l->engine.quantization, "");
  for (const std::string q : {"fp8", "int8", "int4"}) {
    absl::StatusOr<Layout> quant =
        ParseLayout("engine: {quantization: " + q + "}\ngroups: [{role: mixed}]");
    ASSERT_TRUE(quant.ok()) << quant.status();
    EXPECT_EQ(quant->engine.quantization, q);
    // With tensor / pipeline parallel groups too (each rank quantizes its slices).
    absl::StatusOr<Layout> parallel = ParseLayout(
        "backend: cpu\nengine: {quantization: " + q +
        "}\ngroups: [{role: prefill, tensor_parallel: 2}, {role: decode, pipeline_parallel: 2}]");
    ASSERT_TRUE(parallel.ok()) << parallel.status();
    EXPECT_EQ(parallel->engine.quantization, q);
  }
  EXPECT_EQ(l->engine.kv_cache_dtype, "auto");
  for (const std::string d : {"auto", "bf16", "fp8"}) {
    absl::StatusOr<Layout> kvd =
        ParseLayout("engine: {kv_cache_dtype: " + d + "}\ngroups: [{role: mixed}]");
    ASSERT_TRUE(kvd.ok()) << kvd.status();
    EXPECT_EQ(kvd->engine.kv_cache_dtype, d);
  }
  absl::StatusOr<Layout> kv =
      ParseLayout("router: {routing_policy: kv-aware}\ngroups: [{role: mixed}]");
  ASSERT_TRUE(kv.ok()) << kv.status();
  EXPECT_EQ(kv->routing_policy, "kv-aware");
  EXPECT_EQ(l->engine.speculative_method, "none");

  absl::StatusOr<Layout> spec = ParseLayout(
      "engine: {speculative_config: {method: draft, num_speculative_tokens: 5, model: /d,"
      " prompt_lookup_min: 2, prompt_lookup_max: 4}}\ngroups: [{role: mixed}]");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->engine.speculative_method, "draft");
  EXPECT_EQ(spec->engine.num_speculative_tokens, 5);
  EXPECT_EQ(spec->engine.speculative_draft_model, "/d");
  EXPECT_EQ(spec->engine.prompt_lookup_min, 2);
  EXPECT_EQ(spec->engine.prompt_lookup_max, 4);
}

TEST(Layout, DefaultIsOnePrefillOneDecodeOnPort8000) {
  const Layout l = DefaultLayout();
  EXPECT_EQ(l.router_port, 8000);
  EXPECT_EQ(l.backend, "auto");  // cpu unless serve is given a model and sees a GPU
  ASSERT_EQ(l.groups.size(), 2u);
  EXPECT_EQ(l.groups[0].role, "prefill");
  EXPECT_EQ(l.groups[1].role, "decode");
  EXPECT_TRUE(l.control_plane_tls);  // mutual TLS unless the layout says otherwise
}

TEST(Layout, ControlPlaneTlsParses) {
  absl::StatusOr<Layout> l = ParseLayout("groups: [{role: mixed}]");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_TRUE(l->control_plane_tls);
  EXPECT_EQ(l->router_control_plane_port, 0);
  l = ParseLayout("control_plane_tls: false\ngroups: [{role: mixed}]");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_FALSE(l->control_plane_tls);
  l = ParseLayout("router: {control_plane_port: 8002}\ngroups: [{role: mixed}]");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->router_control_plane_port, 8002);
}

// router.host is the OpenAI API's listen address only: the internal ports keep `host`.
TEST(Layout, RouterHostIsTheHttpListenAddressOnly) {
  absl::StatusOr<Layout> l = ParseLayout("router: {host: 0.0.0.0}\ngroups: [{role: mixed}]");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->router_host, "0.0.0.0");
  EXPECT_EQ(l->host, "127.0.0.1");
  EXPECT_EQ(RouterHttpHost(*l), "0.0.0.0");
  EXPECT_EQ(ConnectHost(RouterHttpHost(*l)), "127.0.0.1");
  absl::StatusOr<Layout> d = ParseLayout("host: 127.0.0.2\ngroups: [{role: mixed}]");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(RouterHttpHost(*d), "127.0.0.2");  // unset: the layout's host (loopback by default)
  EXPECT_EQ(ConnectHost("127.0.0.2"), "127.0.0.2");
  EXPECT_EQ(RouterHttpHost(DefaultLayout()), "127.0.0.1");
  EXPECT_TRUE(CheckListenHost("10.1.2.3", "--host").ok());
  EXPECT_THAT(CheckListenHost("example.com", "--host").message(),
              testing::HasSubstr("--host 'example.com' is not an IPv4 address"));
}

TEST(Layout, MistakesAreRefusedWithTheirField) {
  struct Case {
    const char* yaml;
    const char* says;
  };
  const Case cases[] = {
      {"groups: [{role: prefil}]", "role 'prefil'"},
      {"groups: [{role: prefill}]", "both prefill and decode"},
      {"groups: [{role: mixed, count: 0}]", "count"},
      {"groups: [{role: mixed, count: 2, gpus: [0]}]", "one GPU per worker"},
      {"groups: []", "at least one worker"},
      {"backend: tpu\ngroups: [{role: mixed}]", "backend"},
      {"kv_transport: rdma\ngroups: [{role: mixed}]",
       "kv_transport must be tcp, ipc, nccl or auto"},
      {"kv_transport: IPC\ngroups: [{role: mixed}]", "(got 'IPC')"},
      {"kv_transport: ''\ngroups: [{role: mixed}]", "kv_transport must be"},
      {"backend: cpu\nkv_transport: ipc\ngroups: [{role: prefill}, {role: decode}]",
       "kv_transport ipc needs the KV pools on a GPU"},
      {"backend: cpu\nkv_transport: nccl\ngroups: [{role: prefill}, {role: decode}]",
       "kv_transport nccl needs the KV pools on GPUs"},
      {"kv_transprot: tcp\ngroups: [{role: mixed}]", "unknown key 'kv_transprot'"},
      {"router: {port: eighty}\ngroups: [{role: mixed}]", "layout:"},
      {"groups: [{role: mixed, tensor_parallel: 0}]", "must be >= 1"},
      {"groups: [{role: mixed, pipeline_parallel: -1}]", "must be >= 1"},
      {"groups: [{role: mixed, tensor_parallel: two}]", "layout:"},
      {"groups: [{role: mixed", "layout:"},
      {"engine: {gpu_memory_utilization: 1.5}\ngroups: [{role: mixed}]", "gpu_memory_utilization"},
      {"engine: {speculative_config: {method: medusa, num_speculative_tokens: 2}}\n"
       "groups: [{role: mixed}]",
       "speculative_config.method"},
      {"engine: {speculative_config: {method: ngram}}\ngroups: [{role: mixed}]",
       "num_speculative_tokens"},
      {"engine: {speculative_config: {method: draft, num_speculative_tokens: 3}}\n"
       "groups: [{role: mixed}]",
       "speculative_config.model"},
      {"engine: {quantization: awq}\ngroups: [{role: mixed}]", "quantization 'awq'"},
      {"engine: {kv_cache_dtype: fp16}\ngroups: [{role: mixed}]", "kv_cache_dtype 'fp16'"},
      // A misspelt or unknown key anywhere is refused, never ignored.
      {"engine: {enable_prefix_cachng: false}\ngroups: [{role: mixed}]",
       "unknown key 'enable_prefix_cachng' in engine"},
      {"modle: /m\ngroups: [{role: mixed}]", "unknown key 'modle' in the layout"},
      {"router: {prot: 1}\ngroups: [{role: mixed}]", "unknown key 'prot' in router"},
      {"groups: [{role: mixed, gpu: [0]}]", "unknown key 'gpu' in groups"},
      {"engine: {speculative_config: {method: ngram, k: 2}}\ngroups: [{role: mixed}]",
       "unknown key 'k' in engine.speculative_config"},
      {"engine: 3\ngroups: [{role: mixed}]", "engine must be a mapping"},
      {"control_plane_tls: maybe\ngroups: [{role: mixed}]", "layout:"},
      {"control_plane_tls: false\nrouter: {control_plane_port: 8002}\ngroups: [{role: mixed}]",
       "control_plane_port is the registry's mutual-TLS port"},
      // Listen addresses: IPv4 literals only, said so.
      {"host: localhost\ngroups: [{role: mixed}]", "host 'localhost' is not an IPv4 address"},
      {"host: ''\ngroups: [{role: mixed}]", "host '' is not an IPv4 address"},
      {"router: {host: 0.0.0.256}\ngroups: [{role: mixed}]",
       "router.host '0.0.0.256' is not an IPv4 address"},
      {"router: {host: '::'}\ngroups: [{role: mixed}]", "host names and IPv6 are not supported"},
      {"router: {host: [0.0.0.0]}\ngroups: [{role: mixed}]", "layout:"},
      {"", "empty"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Layout> l = ParseLayout(c.yaml);
    ASSERT_FALSE(l.ok()) << c.yaml;
    EXPECT_NE(l.status().message().find(c.says), std::string::npos)
        << c.yaml << " -> " << l.status();
  }
  EXPECT_EQ(LoadLayout("/nonexistent.yaml").status().code(), absl::StatusCode::kNotFound);
}

TEST(Layout, TensorAndPipelineParallelAcceptedOnEitherBackend) {
  for (const char* backend : {"cpu", "cuda", "auto"}) {
    SCOPED_TRACE(backend);
    absl::StatusOr<Layout> l = ParseLayout(absl::StrCat("backend: ", backend, R"(
groups:
  - {role: prefill, count: 2, tensor_parallel: 2, pipeline_parallel: 2}
  - {role: decode, tensor_parallel: 2, pipeline_parallel: 2}
  - {role: mixed, tensor_parallel: 4}
)"));
    ASSERT_TRUE(l.ok()) << l.status();
    EXPECT_EQ(l->backend, backend);
    ASSERT_EQ(l->groups.size(), 3u);
    EXPECT_EQ(l->groups[0].tensor_parallel, 2);
    EXPECT_EQ(l->groups[0].pipeline_parallel, 2);
    EXPECT_EQ(l->groups[1].tensor_parallel, 2);
    EXPECT_EQ(l->groups[1].pipeline_parallel, 2);
    EXPECT_EQ(l->groups[2].tensor_parallel, 4);
    EXPECT_EQ(l->groups[2].pipeline_parallel, 1);
  }
  // Pipeline stages on cuda still count their ranks' GPUs: 2 x 2 ranks on 2 GPUs share them.
  const absl::Status shared =
      ParseLayout(
          "backend: cuda\ngroups: [{role: mixed, tensor_parallel: 2, pipeline_parallel: 2,"
          " gpus: [0, 1, 0, 1]}]")
          .status();
  EXPECT_EQ(shared.code(), absl::StatusCode::kInvalidArgument) << shared;
  EXPECT_NE(shared.message().find("allow_device_sharing"), std::string::npos) << shared;
}

// Groups of different sizes: the TCP transport maps their pages (tcp, or auto, which falls
// back to tcp for such a pair); ipc and nccl copy pages unchanged and are refused.
TEST(Layout, PrefillAndDecodeGroupsOfDifferentSizes) {
  for (const char* groups : {
           "[{role: prefill, tensor_parallel: 2}, {role: decode}]",
           "[{role: prefill}, {role: decode, tensor_parallel: 2}]",
           "[{role: prefill, tensor_parallel: 2}, {role: decode, tensor_parallel: 4}]",
           // Two prefill groups: each may push to the decode group.
           "[{role: prefill, tensor_parallel: 2}, {role: prefill}, {role: decode,"
           " tensor_parallel: 2}]",
           // Different PP: the same page shape, other layers in it.
           "[{role: prefill, pipeline_parallel: 2}, {role: decode}]",
           "[{role: prefill, tensor_parallel: 2, pipeline_parallel: 2}, {role: decode}]",
       }) {
    for (const char* transport : {"tcp", "auto"}) {
      const std::string yaml =
          absl::StrCat("backend: cpu\nkv_transport: ", transport, "\ngroups: ", groups);
      absl::StatusOr<Layout> l = ParseLayout(yaml);
      EXPECT_TRUE(l.ok()) << yaml << " -> " << l.status();
    }
    for (const char* transport : {"ipc", "nccl"}) {
      const std::string yaml =
          absl::StrCat("backend: auto\nkv_transport: ", transport, "\ngroups: ", groups);
      absl::StatusOr<Layout> l = ParseLayout(yaml);
      ASSERT_FALSE(l.ok()) << yaml;
      EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument) << yaml;
      EXPECT_NE(l.status().message().find(absl::StrCat(
                    "kv_transport ", transport,
                    " copies KV pages unchanged: prefill and decode groups must then have the "
                    "same tensor_parallel and pipeline_parallel")),
                std::string::npos)
          << yaml << " -> " << l.status();
      EXPECT_NE(l.status().message().find("need kv_transport tcp or auto"), std::string::npos)
          << l.status();
    }
  }
  // Equal sizes pass the transport check (ipc then fails on the parallel backend check).
  absl::StatusOr<Layout> same = ParseLayout(
      "backend: auto\nkv_transport: ipc\ngroups: [{role: prefill, tensor_parallel: 2}, {role: "
      "decode, tensor_parallel: 2}]");
  EXPECT_TRUE(same.ok()) << same.status();
  // Mixed groups transfer nothing: they may be sized apart from the disaggregated ones.
  absl::StatusOr<Layout> l = ParseLayout(
      "backend: auto\nkv_transport: nccl\ngroups: [{role: prefill, tensor_parallel: 2}, {role: "
      "decode, tensor_parallel: 2}, {role: mixed}]");
  EXPECT_TRUE(l.ok()) << l.status();
}

}  // namespace
}  // namespace tandem::launcher
