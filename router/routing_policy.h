// Routing policies: which worker(s) serve a request, decided from a registry snapshot and
// returned as a value (docs/style.md: decisions are values, policies behind one interface).
//
// A request goes to a (prefill, decode) pair when at least one healthy, non-draining prefill and
// decode worker exist; otherwise to a mixed worker; otherwise Unavailable.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "router/worker_registry.h"

namespace tandem::router {

struct WorkerRef {
  std::string id;
  uint64_t epoch = 0;
};

struct RoutePlan {
  bool mixed = false;
  WorkerRef prefill;  // unset when mixed
  WorkerRef decode;   // the decode worker, or the mixed worker
};

struct RouteQuery {
  int num_prompt_tokens = 0;
  // The tokenized prompt (kv-aware routing hashes its pages); null: unknown. Must outlive Pick.
  const std::vector<int32_t>* prompt_tokens = nullptr;
  // Workers not to pick (e.g. a decode worker that just refused a reservation).
  absl::flat_hash_set<std::string> excluded;
};

class RoutingPolicy {
 public:
  virtual ~RoutingPolicy() = default;
  virtual absl::StatusOr<RoutePlan> Pick(const std::vector<WorkerSnapshot>& workers,
                                         const RouteQuery& query) = 0;
  virtual std::string name() const = 0;
};

// Least loaded: load = max(requests this router has in flight on the worker, the worker's
// reported waiting + running); ties go to more free KV pages (decode) or fewer queued prompt
// tokens (prefill), then rotate.
std::unique_ptr<RoutingPolicy> MakeLeastLoadedPolicy();
// Round robin over each pool, ignoring load.
std::unique_ptr<RoutingPolicy> MakeRoundRobinPolicy();
// KV-aware (Dynamo's KV router idea): a prefill (or mixed) worker's cost is the prompt tokens it
// would compute — the prompt less the longest prefix of its full pages found in the worker's
// published prefix cache (WorkerSnapshot::prefix_cache, hashed as the engine does with
// base/page_hash.h, and never the last token, as the engine) — plus load_weight x the prompt's
// length per request already on it (load as least-loaded counts it); the lowest cost wins, ties
// go to the lower load, then rotate. Decode workers keep no cache: least-loaded picks them.
std::unique_ptr<RoutingPolicy> MakeKvAwarePolicy(double load_weight = 1.0);
// The prompt tokens `w` would find in its prefix cache (0 without a summary or a prompt).
int CachedPrefixTokens(const WorkerSnapshot& w, const std::vector<int32_t>& prompt);
// "least-loaded", "round-robin" or "kv-aware"; InvalidArgument otherwise.
absl::StatusOr<std::unique_ptr<RoutingPolicy>> MakeRoutingPolicy(const std::string& name);

// True when a (prefill, decode) pair or a mixed worker is healthy and not draining.
bool HasUsableWorkers(const std::vector<WorkerSnapshot>& workers);

// Healthy, non-draining, not-excluded workers of `role`.
std::vector<const WorkerSnapshot*> Candidates(const std::vector<WorkerSnapshot>& workers,
                                              tandem::v1::WorkerRole role, const RouteQuery& query);

}  // namespace tandem::router
