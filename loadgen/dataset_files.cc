// The file-based workloads of dataset.h: ShareGPT JSON and Mooncake trace JSON lines.
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "loadgen/dataset.h"

namespace tandem::loadgen {
namespace {

using nlohmann::json;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open dataset file ", path));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The text of a ShareGPT turn ({"from", "value"}) or an OpenAI-style message ({"role", "content"}).
std::string TurnText(const json& turn) {
  for (const char* key : {"value", "content"}) {
    if (turn.is_object() && turn.contains(key) && turn[key].is_string()) {
      return turn[key].get<std::string>();
    }
  }
  return "";
}

const json* Conversation(const json& entry) {
  for (const char* key : {"conversations", "conversation", "messages"}) {
    if (entry.is_object() && entry.contains(key) && entry[key].is_array()) return &entry[key];
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<std::vector<RequestSpec>> ShareGptDataset(const std::string& path, int num_prompts,
                                                         int output_len, uint64_t seed,
                                                         const PromptSource& source) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  json data = json::parse(*text, nullptr, false);
  if (data.is_discarded() || !data.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a ShareGPT JSON array"));
  }
  std::vector<const json*> entries;
  for (const json& entry : data) {
    const json* conv = Conversation(entry);
    if (conv != nullptr && conv->size() >= 2) entries.push_back(conv);
  }
  std::mt19937_64 rng(seed);
  std::shuffle(entries.begin(), entries.end(), rng);
  std::vector<RequestSpec> specs;
  for (const json* conv : entries) {
    if (static_cast<int>(specs.size()) == num_prompts) break;
    RequestSpec spec;
    spec.prompt = TurnText((*conv)[0]);
    spec.prompt_len = source.Count(spec.prompt);
    bool fixed = output_len >= 0;
    spec.output_len = fixed ? output_len : source.Count(TurnText((*conv)[1]));
    if (!fixed && (spec.prompt_len < 4 || spec.output_len < 4)) continue;
    if (!fixed && (spec.prompt_len > 1024 || spec.prompt_len + spec.output_len > 2048)) continue;
    if (spec.output_len < 1 || spec.prompt.empty()) continue;
    specs.push_back(std::move(spec));
  }
  if (specs.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no usable entries"));
  return specs;
}

absl::StatusOr<std::vector<RequestSpec>> MooncakeTraceDataset(const std::string& path,
                                                              const TraceOptions& options,
                                                              const PromptSource& source) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open trace file ", path));
  if (options.block_size < 1) return absl::InvalidArgumentError("--trace-block-size must be >= 1");
  std::vector<RequestSpec> specs;
  std::string line;
  double first_ms = -1;
  int line_no = 0;
  while (std::getline(in, line) &&
         (options.num_prompts < 0 || static_cast<int>(specs.size()) < options.num_prompts)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("timestamp") ||
        !j["timestamp"].is_number() || !j.contains("input_length") ||
        !j["input_length"].is_number_integer() || !j.contains("output_length") ||
        !j["output_length"].is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ":", line_no, ": expected {timestamp, input_length, output_length, hash_ids}"));
    }
    double ts = j["timestamp"].get<double>();
    if (first_ms < 0) first_ms = ts;
    int input = std::max(0, j["input_length"].get<int>());
    std::vector<std::string> pieces;
    if (j.contains("hash_ids") && j["hash_ids"].is_array()) {
      for (const json& id : j["hash_ids"]) {
        if (static_cast<int>(pieces.size()) >= input) break;
        // The same hash id always yields the same block of tokens.
        std::mt19937_64 block_rng(options.seed * 1000003 +
                                  (id.is_number() ? id.get<uint64_t>() : 0));
        std::vector<std::string> block = source.Pieces(block_rng, options.block_size);
        pieces.insert(pieces.end(), block.begin(), block.end());
      }
    }
    pieces.resize(std::min<size_t>(pieces.size(), input));
    std::mt19937_64 tail_rng(options.seed + line_no);
    std::vector<std::string> tail = source.Pieces(tail_rng, input - pieces.size());
    pieces.insert(pieces.end(), tail.begin(), tail.end());
    RequestSpec spec;
    spec.prompt = source.Join(pieces);
    spec.prompt_len = source.CountsExactly() ? source.Count(spec.prompt) : input;
    spec.output_len = std::max(1, j["output_length"].get<int>());
    spec.arrival_s = (ts - first_ms) / 1e3 * options.time_scale;
    spec.has_arrival = true;
    specs.push_back(std::move(spec));
  }
  if (specs.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": empty trace"));
  return specs;
}

}  // namespace tandem::loadgen
