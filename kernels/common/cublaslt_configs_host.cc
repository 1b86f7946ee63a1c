// The enumeration of candidate cuBLASLt configurations (cublaslt_configs.h).
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/common/cublaslt_configs.h"

namespace tandem {
namespace {

// One (split-k, reduction scheme) group; reduction is kLtReductionNone for split 1.
struct Group {
  int32_t splitk;
  uint32_t reduction;
  std::vector<LtAlgoConfig> configs;
};

// The groups a problem of depth k may use, in order: no split, then each split of
// limits.splits that leaves every part min_k_per_split, with each of limits.reductions.
std::vector<Group> GroupsFor(int64_t k, const LtEnumLimits& limits) {
  std::vector<Group> groups = {{1, kLtReductionNone, {}}};
  for (int32_t s : limits.splits) {
    if (s <= 1 || k / s < limits.min_k_per_split) continue;
    for (uint32_t r : limits.reductions) groups.push_back({s, r, {}});
  }
  return groups;
}

// Whether an algorithm with capabilities `caps` (nullptr: unknown, so no split) allows group g.
bool Allows(const LtAlgoCaps* caps, const Group& g) {
  if (g.splitk == 1) return true;
  return caps != nullptr && caps->splitk && (caps->reduction_mask & g.reduction) != 0;
}

const LtAlgoCaps* CapsOf(const std::vector<LtAlgoCaps>& caps, int32_t algo_id) {
  for (const LtAlgoCaps& c : caps) {
    if (c.algo_id == algo_id) return &c;
  }
  return nullptr;
}

// The list's defined values, or {0} (undefined: cuBLASLt's choice) when it has none.
std::vector<uint32_t> Defined(const std::vector<uint32_t>& ids, int max) {
  std::vector<uint32_t> out;
  for (uint32_t id : ids) {
    if (id != 0 && static_cast<int>(out.size()) < max) out.push_back(id);
  }
  if (out.empty()) out.push_back(0);
  return out;
}

// The heuristic's configurations with the group's split and reduction, their own swizzle first
// and then the other one where the caps allow it.
void AddSeedVariants(const std::vector<LtAlgoConfig>& heuristic,
                     const std::vector<LtAlgoCaps>& caps, Group& g) {
  for (size_t i = 0; i < heuristic.size(); ++i) {
    const LtAlgoCaps* c = CapsOf(caps, heuristic[i].algo_id);
    if (!Allows(c, g)) continue;
    std::vector<uint32_t> swizzles = {heuristic[i].swizzle};
    if (c != nullptr && c->swizzle) swizzles.push_back(heuristic[i].swizzle == 0 ? 1 : 0);
    for (uint32_t sw : swizzles) {
      LtAlgoConfig v = heuristic[i];
      v.splitk = g.splitk;
      v.reduction = g.reduction;
      v.swizzle = sw;
      v.seed = static_cast<int>(i);
      g.configs.push_back(v);
    }
  }
}

// Fresh configurations of every algorithm id for the group: swizzle, then stage rank, then tile
// rank, then algorithm id (so consecutive entries differ in algorithm and tile first).
void AddFresh(const std::vector<LtAlgoCaps>& caps, const LtEnumLimits& limits, Group& g) {
  std::vector<std::vector<uint32_t>> tiles, stages;
  size_t max_tiles = 0, max_stages = 0;
  for (const LtAlgoCaps& c : caps) {
    tiles.push_back(Defined(c.tiles, 1 << 20));
    stages.push_back(Defined(c.stages, std::max(limits.max_stages_per_tile, 1)));
    max_tiles = std::max(max_tiles, tiles.back().size());
    max_stages = std::max(max_stages, stages.back().size());
  }
  for (uint32_t sw : {0u, 1u}) {
    for (size_t si = 0; si < max_stages; ++si) {
      for (size_t ti = 0; ti < max_tiles; ++ti) {
        for (size_t a = 0; a < caps.size(); ++a) {
          if (!Allows(&caps[a], g) || (sw == 1 && !caps[a].swizzle)) continue;
          if (si >= stages[a].size() || ti >= tiles[a].size()) continue;
          LtAlgoConfig f;
          f.algo_id = caps[a].algo_id;
          f.tile = tiles[a][ti];
          f.stages = stages[a][si];
          f.splitk = g.splitk;
          f.reduction = g.reduction;
          f.swizzle = sw;
          g.configs.push_back(f);
        }
      }
    }
  }
}

bool Contains(const std::vector<LtAlgoConfig>& list, const LtAlgoConfig& c) {
  return std::any_of(list.begin(), list.end(), [&](const LtAlgoConfig& o) { return o.SameAs(c); });
}

}  // namespace

std::vector<LtAlgoConfig> EnumerateLtConfigs(const std::vector<LtAlgoConfig>& heuristic,
                                             const std::vector<LtAlgoCaps>& caps, int64_t k,
                                             const LtEnumLimits& limits) {
  std::vector<Group> groups = GroupsFor(k, limits);
  for (Group& g : groups) {
    AddSeedVariants(heuristic, caps, g);
    AddFresh(caps, limits, g);
  }
  // One from each group in turn, skipping the heuristic's and repeats, up to the bound.
  std::vector<LtAlgoConfig> out;
  std::vector<size_t> next(groups.size(), 0);
  bool any = true;
  while (any && static_cast<int>(out.size()) < limits.max_configs) {
    any = false;
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      if (static_cast<int>(out.size()) >= limits.max_configs) break;
      const std::vector<LtAlgoConfig>& list = groups[gi].configs;
      while (next[gi] < list.size()) {
        const LtAlgoConfig& c = list[next[gi]++];
        if (Contains(heuristic, c) || Contains(out, c)) continue;
        out.push_back(c);
        any = true;
        break;
      }
      if (next[gi] < list.size()) any = true;
    }
  }
  return out;
}

std::string LtConfigName(const LtAlgoConfig& c) {
  std::string s = absl::StrCat("algo ", c.algo_id, " tile ", c.tile, " stages ", c.stages,
                               " splitk ", c.splitk, " red ", c.reduction, " swz ", c.swizzle);
  if (c.cluster_shape != 0) absl::StrAppend(&s, " cluster ", c.cluster_shape);
  if (c.inner_shape != 0) absl::StrAppend(&s, " inner ", c.inner_shape);
  if (c.custom != 0) absl::StrAppend(&s, " custom ", c.custom);
  return s;
}

std::string LtCapsName(const LtAlgoCaps& c) {
  return absl::StrFormat("algo %d: splitk %s, reductions 0x%x, swizzle %s, %d tiles, %d stages",
                         c.algo_id, c.splitk ? "yes" : "no", c.reduction_mask,
                         c.swizzle ? "yes" : "no", static_cast<int>(c.tiles.size()),
                         static_cast<int>(c.stages.size()));
}

}  // namespace tandem
