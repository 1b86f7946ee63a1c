#include "router/routing_policy.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace tandem::router {
namespace {

using tandem::v1::WORKER_ROLE_DECODE;
using tandem::v1::WORKER_ROLE_MIXED;
using tandem::v1::WORKER_ROLE_PREFILL;
using Pool = std::vector<const WorkerSnapshot*>;

WorkerRef Ref(const WorkerSnapshot* w) { return WorkerRef{w->id, w->epoch}; }

absl::Status NoWorker() {
  return absl::UnavailableError(
      "no healthy worker can serve the request (need a prefill and a decode worker, or a mixed "
      "worker)");
}

// Chooses the pools and delegates the choice inside a pool to `choose`.
template <typename Choose>
absl::StatusOr<RoutePlan> PickWith(const std::vector<WorkerSnapshot>& workers,
                                   const RouteQuery& query, Choose choose) {
  Pool prefill = Candidates(workers, WORKER_ROLE_PREFILL, query);
  Pool decode = Candidates(workers, WORKER_ROLE_DECODE, query);
  RoutePlan plan;
  if (!prefill.empty() && !decode.empty()) {
    plan.prefill = Ref(choose(prefill, /*is_decode=*/false));
    plan.decode = Ref(choose(decode, /*is_decode=*/true));
    return plan;
  }
  Pool mixed = Candidates(workers, WORKER_ROLE_MIXED, query);
  if (mixed.empty()) return NoWorker();
  plan.mixed = true;
  plan.decode = Ref(choose(mixed, /*is_decode=*/true));
  return plan;
}

class LeastLoadedPolicy : public RoutingPolicy {
 public:
  absl::StatusOr<RoutePlan> Pick(const std::vector<WorkerSnapshot>& workers,
                                 const RouteQuery& query) override {
    const size_t rotate = next_++;
    return PickWith(workers, query, [rotate](const Pool& pool, bool is_decode) {
      auto key = [&](size_t i) {
        const WorkerSnapshot* w = pool[i];
        const int load = std::max(w->outstanding, w->load.num_waiting() + w->load.num_running());
        const int secondary = is_decode ? -w->load.num_pages_free() : w->load.num_waiting_tokens();
        return std::make_tuple(load, secondary,
                               (i + pool.size() - rotate % pool.size()) % pool.size());
      };
      size_t best = 0;
      for (size_t i = 1; i < pool.size(); ++i) {
        if (key(i) < key(best)) best = i;
      }
      return pool[best];
    });
  }
  std::string name() const override { return "least-loaded"; }

 private:
  std::atomic<size_t> next_{0};
};

class RoundRobinPolicy : public RoutingPolicy {
 public:
  absl::StatusOr<RoutePlan> Pick(const std::vector<WorkerSnapshot>& workers,
                                 const RouteQuery& query) override {
    const size_t n = next_++;
    return PickWith(workers, query, [n](const Pool& pool, bool) { return pool[n % pool.size()]; });
  }
  std::string name() const override { return "round-robin"; }

 private:
  std::atomic<size_t> next_{0};
};

}  // namespace

std::vector<const WorkerSnapshot*> Candidates(const std::vector<WorkerSnapshot>& workers,
                                              tandem::v1::WorkerRole role,
                                              const RouteQuery& query) {
  Pool out;
  for (const WorkerSnapshot& w : workers) {
    if (w.role == role && w.healthy && !w.draining && !query.excluded.contains(w.id)) {
      out.push_back(&w);
    }
  }
  // Snapshots come from a hash map: order by id so rotation is stable.
  std::sort(out.begin(), out.end(),
            [](const WorkerSnapshot* a, const WorkerSnapshot* b) { return a->id < b->id; });
  return out;
}

bool HasUsableWorkers(const std::vector<WorkerSnapshot>& workers) {
  const RouteQuery all;
  return (!Candidates(workers, WORKER_ROLE_PREFILL, all).empty() &&
          !Candidates(workers, WORKER_ROLE_DECODE, all).empty()) ||
         !Candidates(workers, WORKER_ROLE_MIXED, all).empty();
}

std::unique_ptr<RoutingPolicy> MakeLeastLoadedPolicy() {
  return std::make_unique<LeastLoadedPolicy>();
}
std::unique_ptr<RoutingPolicy> MakeRoundRobinPolicy() {
  return std::make_unique<RoundRobinPolicy>();
}

absl::StatusOr<std::unique_ptr<RoutingPolicy>> MakeRoutingPolicy(const std::string& name) {
  if (name == "least-loaded") return MakeLeastLoadedPolicy();
  if (name == "round-robin") return MakeRoundRobinPolicy();
  return absl::InvalidArgumentError(
      absl::StrCat("unknown routing policy '", name, "' (least-loaded, round-robin)"));
}

}  // namespace tandem::router
