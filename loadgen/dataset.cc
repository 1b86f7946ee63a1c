#include "loadgen/dataset.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace tandem::loadgen {
namespace {

// Frequent English words; with a leading space each is a single token in byte-level BPE
// (Llama 3, Qwen, GPT-2) and in SentencePiece vocabularies (Llama 2, Mistral).
constexpr const char* kWords[] = {
    "the",    "of",    "and",   "to",    "in",    "is",     "that",   "for",   "it",     "as",
    "was",    "with",  "be",    "by",    "on",    "not",    "he",     "this",  "are",    "or",
    "his",    "from",  "at",    "which", "but",   "have",   "an",     "had",   "they",   "you",
    "were",   "their", "one",   "all",   "we",    "can",    "her",    "has",   "there",  "been",
    "if",     "more",  "when",  "will",  "would", "who",    "so",     "no",    "time",   "year",
    "people", "way",   "day",   "man",   "thing", "world",  "life",   "hand",  "part",   "child",
    "eye",    "place", "work",  "week",  "case",  "point",  "number", "group", "fact",   "good",
    "new",    "first", "last",  "long",  "great", "little", "own",    "other", "old",    "right",
    "big",    "high",  "small", "large", "next",  "early",  "young",  "few",   "public", "same",
    "able",   "make",  "know",  "take",  "see",   "come",   "think",  "look",  "want",   "give"};
constexpr int kNumWords = sizeof(kWords) / sizeof(kWords[0]);

class WordPromptSource : public PromptSource {
 public:
  std::vector<std::string> Pieces(std::mt19937_64& rng, int n) const override {
    std::uniform_int_distribution<int> pick(0, kNumWords - 1);
    std::vector<std::string> out;
    out.reserve(n);
    for (int i = 0; i < n; ++i) out.emplace_back(kWords[pick(rng)]);
    return out;
  }
  std::string Join(const std::vector<std::string>& pieces) const override {
    std::string text;
    for (const std::string& p : pieces) {
      if (!text.empty()) text.push_back(' ');
      text += p;
    }
    return text;
  }
  int Count(const std::string& text) const override {
    int words = 0;
    bool in_word = false;
    for (char c : text) {
      bool space = c == ' ' || c == '\n' || c == '\t' || c == '\r';
      if (!space && !in_word) ++words;
      in_word = !space;
    }
    return words;
  }
};

int DrawLength(std::mt19937_64& rng, int mean, double ratio, bool normal) {
  if (ratio <= 0) return mean;
  if (normal) {
    std::normal_distribution<double> dist(mean, mean * ratio);
    return std::clamp(static_cast<int>(std::lround(dist(rng))), 1, 2 * mean);
  }
  int lo = static_cast<int>(std::floor(mean * (1 - ratio)));
  int hi = static_cast<int>(std::ceil(mean * (1 + ratio)));
  return std::uniform_int_distribution<int>(std::max(lo, 0), hi)(rng);
}

}  // namespace

std::unique_ptr<PromptSource> MakeWordPromptSource() {
  return std::make_unique<WordPromptSource>();
}

absl::StatusOr<std::vector<RequestSpec>> RandomDataset(const RandomDatasetOptions& o,
                                                       const PromptSource& source) {
  if (o.num_prompts < 0 || o.input_len < 0 || o.output_len < 1 || o.prefix_len < 0) {
    return absl::InvalidArgumentError("random dataset: lengths must be >= 0 (output >= 1)");
  }
  if (o.range_ratio < 0 || o.range_ratio >= 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--random-range-ratio must be in [0, 1), got %g", o.range_ratio));
  }
  if (o.prefix_sharing_ratio < 0 || o.prefix_sharing_ratio > 1 || o.num_prefix_groups < 1) {
    return absl::InvalidArgumentError(
        "--prefix-sharing-ratio must be in [0, 1] and --num-prefix-groups >= 1");
  }
  std::mt19937_64 rng(o.seed);
  std::vector<std::string> common = source.Pieces(rng, o.prefix_len);
  int max_input = 2 * o.input_len + 1;
  std::vector<std::vector<std::string>> groups;
  for (int g = 0; g < o.num_prefix_groups && o.prefix_sharing_ratio > 0; ++g) {
    groups.push_back(source.Pieces(rng, max_input));
  }
  std::vector<RequestSpec> specs(o.num_prompts);
  for (int i = 0; i < o.num_prompts; ++i) {
    int input = DrawLength(rng, o.input_len, o.range_ratio, o.normal);
    specs[i].output_len = std::max(1, DrawLength(rng, o.output_len, o.range_ratio, o.normal));
    int shared = groups.empty() ? 0 : static_cast<int>(std::lround(o.prefix_sharing_ratio * input));
    std::vector<std::string> pieces = common;
    if (shared > 0) {
      const std::vector<std::string>& g = groups[i % groups.size()];
      pieces.insert(pieces.end(), g.begin(), g.begin() + std::min<size_t>(shared, g.size()));
    }
    std::vector<std::string> own = source.Pieces(rng, input - shared);
    pieces.insert(pieces.end(), own.begin(), own.end());
    specs[i].prompt = source.Join(pieces);
    specs[i].prompt_len =
        source.CountsExactly() ? source.Count(specs[i].prompt) : static_cast<int>(pieces.size());
  }
  return specs;
}

}  // namespace tandem::loadgen
