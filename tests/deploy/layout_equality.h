// For end-to-end tests that compare layouts (parallel_e2e_test, mixed_parallel_e2e_test): serve
// the same greedy prompts on a baseline layout and then on each other layout, one cluster at a
// time, and expect the same tokens prompt by prompt; plus the probes such tests make of a
// worker (the flags it was started with, its log).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "deploy/launcher/cluster.h"

namespace tandem::e2e {

// Greedy prompts of `lengths` tokens, each Prompt(n, seed_base + n), each asked for
// `max_tokens` tokens (ignore_eos).
struct GreedyPrompts {
  std::vector<int> lengths;
  int max_tokens = 0;
  uint32_t seed_base = 0;

  std::vector<int32_t> PromptOf(int n) const;
};

// The tokens of each prompt, by its length.
using TokensByLength = std::map<int, std::vector<int32_t>>;

// Serves every prompt through the cluster's router, one at a time. Expects each call OK and
// finished by length, and every worker idle (no pages held, nothing queued) afterwards.
TokensByLength ServeGreedy(launcher::Cluster& cluster, const GreedyPrompts& prompts);

// One layout of a comparison.
struct LayoutRun {
  std::string yaml;
  // The test's checks of the running cluster after it served (its workers' flags, logs, load);
  // `log_dir` holds each process's <name>.log. May be null.
  std::function<void(launcher::Cluster& cluster, const std::string& log_dir)> expect;
};

// Serves `prompts` on `baseline`, then on each of `layouts`, each cluster shut down (within
// 20 s: expected) before the next starts, with `model_dir` (empty: the tiny model). Every
// baseline answer must hold max_tokens tokens (else fatal, before any layout runs), and every
// layout's answers must equal the baseline's, prompt by prompt. Each run's `expect` runs after
// it served. A cluster that does not start is a fatal failure, which ends this call (not the
// caller's test). The baseline's tokens go to `baseline_tokens` (may be null) once it served
// every prompt in full; otherwise it is left as it was.
void ExpectLayoutsMatchBaseline(const LayoutRun& baseline, const std::vector<LayoutRun>& layouts,
                                const GreedyPrompts& prompts, const std::string& model_dir,
                                TokensByLength* baseline_tokens = nullptr);

// The value that follows `flag` on the worker's command line ("" if it has none).
std::string WorkerFlag(const launcher::Process& worker, const std::string& flag);
// The worker's log, <log_dir>/<name>.log ("" if unreadable).
std::string WorkerLog(const std::string& log_dir, const launcher::Process& worker);

}  // namespace tandem::e2e
