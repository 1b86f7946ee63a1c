#include "router/routing_policy.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "base/page_hash.h"
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

int Load(const WorkerSnapshot& w) {
  return std::max(w.outstanding, w.load.num_waiting() + w.load.num_running());
}

size_t Rotated(size_t i, size_t rotate, size_t n) { return (i + n - rotate % n) % n; }

const WorkerSnapshot* LeastLoaded(const Pool& pool, bool is_decode, size_t rotate) {
  auto key = [&](size_t i) {
    const WorkerSnapshot* w = pool[i];
    // Cached pages are evictable: room for a reservation as much as free ones.
    const int secondary = is_decode ? -(w->load.num_pages_free() + w->load.num_pages_cached())
                                    : w->load.num_waiting_tokens();
    return std::make_tuple(Load(*w), secondary, Rotated(i, rotate, pool.size()));
  };
  size_t best = 0;
  for (size_t i = 1; i < pool.size(); ++i) {
    if (key(i) < key(best)) best = i;
  }
  return pool[best];
}

class LeastLoadedPolicy : public RoutingPolicy {
 public:
  absl::StatusOr<RoutePlan> Pick(const std::vector<WorkerSnapshot>& workers,
                                 const RouteQuery& query) override {
    const size_t rotate = next_++;
    return PickWith(workers, query, [rotate](const Pool& pool, bool is_decode) {
      return LeastLoaded(pool, is_decode, rotate);
    });
  }
  std::string name() const override { return "least-loaded"; }

 private:
  std::atomic<size_t> next_{0};
};

class KvAwarePolicy : public RoutingPolicy {
 public:
  explicit KvAwarePolicy(double load_weight) : load_weight_(load_weight) {}
  absl::StatusOr<RoutePlan> Pick(const std::vector<WorkerSnapshot>& workers,
                                 const RouteQuery& query) override {
    const size_t rotate = next_++;
    // Decode workers keep no cache, and the mixed pool is scored like the prefill pool.
    return PickWith(workers, query, [&](const Pool& pool, bool is_decode) {
      const bool decode_pool =
          is_decode && !pool.empty() && pool[0]->role == tandem::v1::WORKER_ROLE_DECODE;
      if (decode_pool || query.prompt_tokens == nullptr) {
        return LeastLoaded(pool, is_decode, rotate);
      }
      const double n = static_cast<double>(query.prompt_tokens->size());
      auto key = [&](size_t i) {
        const WorkerSnapshot& w = *pool[i];
        const double cost =
            n - CachedPrefixTokens(w, *query.prompt_tokens) + load_weight_ * Load(w) * n;
        return std::make_tuple(cost, Load(w), Rotated(i, rotate, pool.size()));
      };
      size_t best = 0;
      for (size_t i = 1; i < pool.size(); ++i) {
        if (key(i) < key(best)) best = i;
      }
      return pool[best];
    });
  }
  std::string name() const override { return "kv-aware"; }

 private:
  const double load_weight_;
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
std::unique_ptr<RoutingPolicy> MakeKvAwarePolicy(double load_weight) {
  return std::make_unique<KvAwarePolicy>(load_weight);
}

int CachedPrefixTokens(const WorkerSnapshot& w, const std::vector<int32_t>& prompt) {
  if (w.prefix_cache == nullptr || w.prefix_cache->page_size < 1 || prompt.empty()) return 0;
  const int page_size = w.prefix_cache->page_size;
  // As the engine: full pages only, and the last token is always computed.
  const int max_pages = static_cast<int>((prompt.size() - 1) / page_size);
  uint64_t parent = kPageHashSeed;
  int pages = 0;
  for (; pages < max_pages; ++pages) {
    parent = ChainPageHash(
        parent, absl::MakeConstSpan(prompt.data() + int64_t{pages} * page_size, page_size));
    if (!w.prefix_cache->hashes.contains(parent)) break;
  }
  return pages * page_size;
}

absl::StatusOr<std::unique_ptr<RoutingPolicy>> MakeRoutingPolicy(const std::string& name) {
  if (name == "least-loaded") return MakeLeastLoadedPolicy();
  if (name == "round-robin") return MakeRoundRobinPolicy();
  if (name == "kv-aware") return MakeKvAwarePolicy();
  return absl::InvalidArgumentError(
      absl::StrCat("unknown routing policy '", name, "' (least-loaded, round-robin, kv-aware)"));
}

}  // namespace tandem::router
