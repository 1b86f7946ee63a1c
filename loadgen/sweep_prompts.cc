#include "loadgen/sweep_prompts.h"

#include <algorithm>
#include <limits>
#include <string_view>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::loadgen {

absl::StatusOr<SweepPromptMode> ParseSweepPromptMode(const std::string& text) {
  if (text == "fresh") return SweepPromptMode::kFresh;
  if (text == "same") return SweepPromptMode::kSame;
  return absl::InvalidArgumentError(
      absl::StrCat("--sweep-prompts must be fresh or same, got '", text, "'"));
}

uint64_t SweepPointSeed(uint64_t base_seed, int point) {
  if (point == 0) return base_seed;
  // SplitMix64 (Steele, Lea, Flood 2014): its state advances by the golden-ratio increment and
  // each output is the state through a bijective mix, so nearby base seeds and nearby points
  // give unrelated seeds (a plain `seed + i` would make point 1 of --seed 0 equal point 0 of
  // --seed 1).
  uint64_t z = base_seed + static_cast<uint64_t>(point) * 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

bool PromptsDrawnFromSeed(const std::string& dataset_name) { return dataset_name != "sharegpt"; }

absl::StatusOr<std::vector<RequestSpec>> MakeDataset(const Config& c, const PromptSource& source) {
  if (c.dataset_name == "random") {
    RandomDatasetOptions o;
    o.num_prompts = c.num_prompts;
    o.input_len = c.random_input_len;
    o.output_len = c.random_output_len;
    o.range_ratio = c.random_range_ratio;
    o.normal = c.random_length_dist == "normal";
    o.prefix_len = c.random_prefix_len;
    o.prefix_sharing_ratio = c.prefix_sharing_ratio;
    o.num_prefix_groups = c.num_prefix_groups;
    o.seed = c.seed;
    return RandomDataset(o, source);
  }
  if (c.dataset_name == "multi-turn") {
    MultiTurnOptions o;
    o.num_prompts = c.num_prompts;
    o.system_len = c.multi_turn_system_len;
    o.num_system_prompts = c.multi_turn_system_prompts;
    o.turns = c.multi_turn_turns;
    o.user_len = c.random_input_len;
    o.output_len = c.random_output_len;
    o.seed = c.seed;
    return MultiTurnDataset(o, source);
  }
  if (c.dataset_path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dataset-name ", c.dataset_name, " needs --dataset-path"));
  }
  if (c.dataset_name == "sharegpt") {
    return ShareGptDataset(c.dataset_path, c.num_prompts, c.sharegpt_output_len, c.seed, source);
  }
  TraceOptions t;
  t.num_prompts = c.num_prompts;
  t.block_size = c.trace_block_size;
  t.time_scale = c.trace_time_scale;
  t.seed = c.seed;
  return MooncakeTraceDataset(c.dataset_path, t, source);
}

absl::StatusOr<std::unique_ptr<SweepPrompts>> SweepPrompts::Create(
    const Config& c, int num_points, std::unique_ptr<PromptSource> source) {
  if (num_points < 1) return absl::InvalidArgumentError("a sweep needs at least one point");
  auto mode = ParseSweepPromptMode(c.sweep_prompts);
  if (!mode.ok()) return mode.status();
  std::unique_ptr<SweepPrompts> p(new SweepPrompts(c, num_points, std::move(source)));
  if (num_points > 1 && *mode == SweepPromptMode::kFresh && !PromptsDrawnFromSeed(c.dataset_name) &&
      c.num_prompts > 0) {
    absl::Status sliced = p->SliceFile();
    if (!sliced.ok()) return sliced;
    return p;
  }
  auto first = MakeDataset(c, *p->source_);
  if (!first.ok()) return first.status();
  p->fixed_.push_back({c.seed, std::move(*first)});
  if (num_points > 1 && *mode == SweepPromptMode::kSame) {
    p->shared_ = true;
    p->warning_ =
        "--sweep-prompts same: every sweep point sends the same prompts, so a server's prefix "
        "cache serves the points after the first from cache (their TTFTs are not cold "
        "prefills)";
  }
  p->draw_per_point_ =
      num_points > 1 && *mode == SweepPromptMode::kFresh && PromptsDrawnFromSeed(c.dataset_name);
  return p;
}

absl::Status SweepPrompts::SliceFile() {
  // Every usable entry, in the order --seed shuffles them; a plain run takes the first
  // --num-prompts of this order (the filters run in order and the cap only truncates).
  Config all = config_;
  all.num_prompts = std::numeric_limits<int>::max();
  auto entries = MakeDataset(all, *source_);
  if (!entries.ok()) return entries.status();
  const size_t n = static_cast<size_t>(config_.num_prompts);
  const std::vector<RequestSpec>& e = *entries;
  std::vector<PointPrompts> points(1);
  points[0].seed = config_.seed;
  size_t next = std::min(n, e.size());
  points[0].specs.assign(e.begin(), e.begin() + next);
  // Prompts an earlier point sent (views into `e`): a later point skips entries that repeat one
  // (ShareGPT files hold duplicate first turns), so no prompt is sent at two points.
  std::unordered_set<std::string_view> sent;
  for (size_t k = 0; k < next; ++k) sent.insert(e[k].prompt);
  for (int i = 1; i < num_points_; ++i) {
    std::vector<size_t> taken;
    for (; taken.size() < n && next < e.size(); ++next) {
      if (!sent.contains(e[next].prompt)) taken.push_back(next);
    }
    if (taken.size() < n) {
      points.resize(1);
      shared_ = true;
      warning_ = absl::StrFormat(
          "--dataset-name %s: %s holds %d usable entries, fewer than the %d sweep points x %d "
          "prompts that distinct prompts per point need, so every point sends the first point's "
          "%d prompts and a server's prefix cache serves the points after the first from cache "
          "(their TTFTs are not cold prefills); use fewer --num-prompts or points, or a larger "
          "file",
          config_.dataset_name, config_.dataset_path, e.size(), num_points_, n,
          points[0].specs.size());
      break;
    }
    PointPrompts point;
    point.seed = config_.seed;
    for (size_t k : taken) {
      point.specs.push_back(e[k]);
      sent.insert(e[k].prompt);
    }
    points.push_back(std::move(point));
  }
  fixed_ = std::move(points);
  return absl::OkStatus();
}

absl::StatusOr<PointPrompts> SweepPrompts::Point(int index) const {
  if (index < 0 || index >= num_points_) {
    return absl::OutOfRangeError(absl::StrFormat("sweep point %d of %d", index, num_points_));
  }
  if (index < static_cast<int>(fixed_.size())) return fixed_[index];
  if (!draw_per_point_) return fixed_.front();
  Config c = config_;
  c.seed = SweepPointSeed(config_.seed, index);
  auto specs = MakeDataset(c, *source_);
  if (!specs.ok()) return specs.status();
  return PointPrompts{c.seed, std::move(*specs)};
}

}  // namespace tandem::loadgen
