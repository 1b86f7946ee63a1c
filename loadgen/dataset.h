// Workloads: what each request asks for. All are deterministic for a given seed.
//   random   — input/output lengths fixed, uniform in [L(1-r), L(1+r)] (vLLM's
//              --random-range-ratio) or normal (mean L, std L*r, clipped to [1, 2L]); an
//              optional shared prefix (--random-prefix-len, vLLM) and an optional prefix-sharing
//              ratio: the first ratio*len tokens of request i come from shared prefix i % G.
//   sharegpt — a ShareGPT JSON file: first human turn is the prompt, the next turn's length is
//              the output length (vLLM's filters: both >= 4 tokens, prompt <= 1024, total <= 2048).
//   multi-turn — chat conversations: each starts with one of a few shared system prompts, and
//              every turn resends the whole conversation so far (earlier user turns and
//              answers) plus a new user turn, so a prefix cache sees each conversation grow.
//   trace    — Mooncake trace replay (JSON lines: timestamp ms, input_length, output_length,
//              hash_ids): arrivals come from the timestamps; equal hash ids produce equal
//              blocks of --trace-block-size tokens, so prefix caches see the trace's sharing.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "loadgen/request_record.h"

namespace tandem::loadgen {

// Makes prompt text of a given token length. Prompts are assembled from pieces that are one
// token each, so a prefix of k pieces is exactly k tokens.
class PromptSource {
 public:
  virtual ~PromptSource() = default;
  // `n` pieces of one token each, drawn from `rng`.
  virtual std::vector<std::string> Pieces(std::mt19937_64& rng, int n) const = 0;
  // Joins pieces into prompt text.
  virtual std::string Join(const std::vector<std::string>& pieces) const = 0;
  // Token count of arbitrary text (approximate for the word source).
  virtual int Count(const std::string& text) const = 0;
  // True when Count() is the target tokenizer's exact count (then prompt lengths use it).
  virtual bool CountsExactly() const { return false; }
};

// Without a tokenizer: common English words that are one token each in Llama/Qwen/GPT-style
// vocabularies (" the", " of", ...); Count() counts words. Reported token totals then come from
// the server's usage field, which is exact.
std::unique_ptr<PromptSource> MakeWordPromptSource();

struct RandomDatasetOptions {
  int num_prompts = 1000;
  int input_len = 1024;
  int output_len = 128;
  double range_ratio = 0.0;
  bool normal = false;                // --random-length-dist normal
  int prefix_len = 0;                 // one prefix shared by every request, on top of input_len
  double prefix_sharing_ratio = 0.0;  // fraction of each input taken from a group prefix
  int num_prefix_groups = 1;
  uint64_t seed = 0;
};
absl::StatusOr<std::vector<RequestSpec>> RandomDataset(const RandomDatasetOptions& options,
                                                       const PromptSource& source);

// output_len >= 0 overrides every output length (--sharegpt-output-len).
absl::StatusOr<std::vector<RequestSpec>> ShareGptDataset(const std::string& path, int num_prompts,
                                                         int output_len, uint64_t seed,
                                                         const PromptSource& source);

struct MultiTurnOptions {
  int num_prompts = 1000;      // requests in all: conversations x turns (the last may be short)
  int system_len = 256;        // tokens of each shared system prompt
  int num_system_prompts = 1;  // conversation c uses system prompt c % num_system_prompts
  int turns = 4;               // turns per conversation
  int user_len = 64;           // tokens of each user turn
  int output_len = 64;         // max_tokens, and the length of the answer resent next turn
  uint64_t seed = 0;
};
// Requests in round order: turn 0 of every conversation, then turn 1 of every one, ...
absl::StatusOr<std::vector<RequestSpec>> MultiTurnDataset(const MultiTurnOptions& options,
                                                          const PromptSource& source);

struct TraceOptions {
  int num_prompts = -1;     // -1: the whole trace
  int block_size = 512;     // tokens per hash id (Mooncake traces use 512)
  double time_scale = 1.0;  // arrival times are multiplied by this (0.5 = twice as fast)
  uint64_t seed = 0;
};
absl::StatusOr<std::vector<RequestSpec>> MooncakeTraceDataset(const std::string& path,
                                                              const TraceOptions& options,
                                                              const PromptSource& source);

}  // namespace tandem::loadgen
