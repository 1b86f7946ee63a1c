// The engine's command-line flags, shared by every worker binary and the `tandem` commands that
// run an engine in process (generate, bench), so that one name means one thing everywhere
// (vLLM's names where vLLM has the flag: --gpu-memory-utilization, --max-num-seqs,
// --max-num-batched-tokens, --max-model-len, --cuda-graph-sizes, --enforce-eager, --quantization,
// --enable-prefix-caching / --no-enable-prefix-caching; the fields of vLLM's
// --speculative-config as --speculative-method, --num-speculative-tokens,
// --speculative-draft-model, --prompt-lookup-min, --prompt-lookup-max).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "absl/status/status.h"
#include "engine/engine.h"

namespace tandem {

struct EngineFlags {
  EngineOptions engine;
  std::string backend = "auto";             // auto | cpu | cuda
  std::string cuda_graph_sizes;             // "1,2,4,8"; empty: the default list
  std::string speculative_method = "none";  // none | ngram | draft
};

// Adds the flags to `app`, writing into `flags`.
void AddEngineFlags(CLI::App& app, EngineFlags* flags);

// After parsing: resolves --backend auto (cuda when this build has CUDA and a device is visible,
// else cpu) into flags->engine.backend, and checks the values. InvalidArgument naming the flag.
absl::Status ResolveEngineFlags(EngineFlags* flags);

}  // namespace tandem
