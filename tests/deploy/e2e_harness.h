// Helpers for end-to-end tests that start real router and worker processes on loopback
// (deploy/launcher Cluster): a tiny generated model, streaming gRPC generation through the
// router, the single-process reference (what `tandem generate` runs: one Engine, greedy), and
// worker load probes for leak checks.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "deploy/launcher/cluster.h"
#include "engine/request.h"
#include "rpc/control_plane_tls.h"
#include "tandem/v1/generate.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::e2e {

// The tiny model, generated once per test process into a temp dir.
const std::string& TinyModelDir();
// The small-qwen3 preset (the GPU variants' model: its transfers are long enough to fault),
// generated the same way.
const std::string& SmallQwen3ModelDir();
// Any make-model preset (engine/model/presets.h), generated the same way once per process.
const std::string& PresetModelDir(const std::string& preset);

// The whole of a file ("" when it cannot be read: a process's log not yet written).
std::string ReadFile(const std::string& path);

// Starts a cluster of `layout_yaml` (groups etc.; model, ports and logs are filled in) with
// every process's log under a fresh temp dir. Fails the test (returns null) if not ready.
// `adjust` may change the layout (its router ports are 0: picked) and the launcher's options.
std::unique_ptr<launcher::Cluster> StartCluster(
    const std::string& layout_yaml,
    const std::function<void(launcher::Layout&, launcher::ClusterOptions&)>& adjust = nullptr);
// The same, returning the launcher's error instead of failing the test.
absl::StatusOr<std::unique_ptr<launcher::Cluster>> TryStartCluster(
    const std::string& layout_yaml,
    const std::function<void(launcher::Layout&, launcher::ClusterOptions&)>& adjust = nullptr);

struct StreamResult {
  std::vector<int32_t> tokens;
  std::string text;
  tandem::v1::FinishReason finish = tandem::v1::FINISH_REASON_UNSPECIFIED;
  grpc::Status status;
  int num_messages = 0;
  std::vector<tandem::v1::TokenLogprobs> logprobs;  // when sampling.logprobs was set
  tandem::v1::GenerateResponse last;                // the terminal message (stop reason, usage)
};

struct GenerateArgs {
  std::vector<int32_t> prompt;
  int max_tokens = 8;
  bool ignore_eos = true;
  std::vector<std::string> stop;  // stop strings (the reference ignores them)
  // Called after each streamed message; return false to cancel the call (client disconnect).
  std::function<bool(const StreamResult&)> on_message;
  // Called once the call is under way, with its context (another thread may TryCancel it until
  // Generate returns).
  std::function<void(grpc::ClientContext*)> on_start;
  absl::Duration deadline = absl::Seconds(60);
  // Sets more sampling options on the request (after the fields above).
  std::function<void(tandem::v1::SamplingOptions&)> sampling;
  // The channel to the router to use (one already connected, so that several calls can start
  // together); null: a new one.
  std::shared_ptr<grpc::Channel> channel;
};

// Streams one greedy generation through the router's gRPC Generation API.
StreamResult Generate(const std::string& router_grpc, const GenerateArgs& args);

// Greedy tokens of one Engine in this process (max_tokens, ignore_eos as in `args`;
// `quantization`: EngineOptions::quantization, the --quantization flag).
std::vector<int32_t> ReferenceGreedy(const std::string& model_dir, const GenerateArgs& args,
                                     const std::string& quantization = "");

// What one Engine in this process generates for `prompt` with `sampling` (`tandem generate`).
struct ReferenceResult {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> logprobs;
  FinishReason finish = FinishReason::kNone;
};
ReferenceResult Reference(const std::string& model_dir, const std::vector<int32_t>& prompt,
                          const SamplingParams& sampling);

// The cluster's client certificate (Cluster::client_tls) loaded; disabled when TLS is off.
ControlPlaneTls ClientTls(const launcher::Cluster& cluster);
// A worker's load report, asked with the cluster's token and client certificate (num_waiting -1
// when unreachable).
tandem::v1::LoadReport GetLoad(const launcher::Cluster& cluster, const std::string& worker_grpc);
tandem::v1::LoadReport GetLoad(const std::string& worker_grpc, const std::string& cluster_token,
                               const ControlPlaneTls& tls = {});
// True when every running worker holds no reserved or owned pages and has nothing queued or
// running, within `timeout`.
bool WaitForIdle(launcher::Cluster& cluster, absl::Duration timeout, std::string* why = nullptr);

// Deterministic pseudo-random prompt of `n` token ids in [10, 300).
std::vector<int32_t> Prompt(int n, uint32_t seed);

}  // namespace tandem::e2e
