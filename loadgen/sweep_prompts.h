// Which prompts each point of a sweep sends (--sweep-prompts fresh|same). A server with a prefix
// cache serves a prompt it has already prefilled from the cache, so replaying one point's prompts
// at the next point measures cache hits, not prefill. With `fresh` (the default):
//   - datasets whose prompt text is generated from --seed (random, multi-turn, and trace: the
//     trace file fixes lengths, arrivals and hash ids, the seed the tokens) draw every point
//     afresh with the point's seed, SweepPointSeed(): point 0 keeps --seed, so its prompts are a
//     plain run's, and point i is exactly a plain run with --seed SweepPointSeed(seed, i);
//   - file datasets (ShareGPT) take disjoint slices of the file's usable entries, shuffled once by
//     --seed: point 0 takes the first --num-prompts (a plain run's), point i the next
//     --num-prompts entries whose prompt no earlier point sent. When the file holds too few for
//     every point, all points send point 0's prompts, and warning() says so.
// With `same`, every point sends point 0's prompts (identical inputs; the cache serves them).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "loadgen/config.h"
#include "loadgen/dataset.h"

namespace tandem::loadgen {

enum class SweepPromptMode { kFresh, kSame };

// "fresh" | "same".
absl::StatusOr<SweepPromptMode> ParseSweepPromptMode(const std::string& text);

// The seed of sweep point `point`: `base_seed` for point 0, else the point-th output of a
// SplitMix64 generator seeded with `base_seed` (mix(base_seed + point * 0x9E3779B97F4A7C15)).
uint64_t SweepPointSeed(uint64_t base_seed, int point);

// True for datasets whose prompt text comes from the seed (random, multi-turn, trace/mooncake);
// false for ShareGPT, whose text is the file's.
bool PromptsDrawnFromSeed(const std::string& dataset_name);

// The workload --dataset-name and its flags describe, drawn with `c.seed`.
absl::StatusOr<std::vector<RequestSpec>> MakeDataset(const Config& c, const PromptSource& source);

// What one point sends.
struct PointPrompts {
  uint64_t seed = 0;  // the seed of its prompts and arrivals (file datasets: the shuffle's)
  std::vector<RequestSpec> specs;
};

class SweepPrompts {
 public:
  // Reads the dataset (and draws point 0) for a sweep of `num_points` >= 1 points; errors are
  // the dataset's or a bad `c.sweep_prompts`.
  static absl::StatusOr<std::unique_ptr<SweepPrompts>> Create(const Config& c, int num_points,
                                                              std::unique_ptr<PromptSource> source);

  int num_points() const { return num_points_; }
  // True when two or more points send the same prompts (`same`, or a file too small).
  bool shared() const { return shared_; }
  // Why the points share prompts (printed before the first point), or "" when they do not.
  const std::string& warning() const { return warning_; }
  // The prompts of point `index` (0 <= index < num_points()). Seed-drawn points after the first
  // are drawn on demand, so a long sweep holds one point's prompts at a time.
  absl::StatusOr<PointPrompts> Point(int index) const;

 private:
  SweepPrompts(const Config& c, int num_points, std::unique_ptr<PromptSource> source)
      : config_(c), num_points_(num_points), source_(std::move(source)) {}
  absl::Status SliceFile();  // fresh file dataset: fills fixed_ with disjoint slices

  Config config_;
  int num_points_ = 1;
  std::unique_ptr<PromptSource> source_;
  bool draw_per_point_ = false;      // seed-drawn dataset, fresh: Point(i) draws with seed i
  std::vector<PointPrompts> fixed_;  // otherwise: every point's prompts (or one, shared)
  bool shared_ = false;
  std::string warning_;
};

}  // namespace tandem::loadgen
