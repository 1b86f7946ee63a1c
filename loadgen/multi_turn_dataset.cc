// The multi-turn chat workload (dataset.h, MultiTurnDataset): conversations that share system
// prompts and resend the whole conversation at every turn, as chat clients and agents do.
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "loadgen/dataset.h"

namespace tandem::loadgen {

absl::StatusOr<std::vector<RequestSpec>> MultiTurnDataset(const MultiTurnOptions& o,
                                                          const PromptSource& source) {
  if (o.num_prompts < 0 || o.system_len < 0 || o.user_len < 1 || o.output_len < 1 ||
      o.num_system_prompts < 1 || o.turns < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "multi-turn dataset: need --num-prompts >= 0, --multi-turn-system-len >= 0, "
        "--random-input-len >= 1, --random-output-len >= 1, --multi-turn-system-prompts >= 1 "
        "and --multi-turn-turns >= 1 (got %d, %d, %d, %d, %d, %d)",
        o.num_prompts, o.system_len, o.user_len, o.output_len, o.num_system_prompts, o.turns));
  }
  std::mt19937_64 rng(o.seed);
  std::vector<std::vector<std::string>> systems;
  for (int s = 0; s < o.num_system_prompts; ++s)
    systems.push_back(source.Pieces(rng, o.system_len));
  const int conversations = (o.num_prompts + o.turns - 1) / o.turns;
  std::vector<std::vector<std::string>> history(conversations);
  for (int c = 0; c < conversations; ++c) history[c] = systems[c % systems.size()];
  std::vector<RequestSpec> specs;
  specs.reserve(o.num_prompts);
  // Round t of every conversation before round t + 1: a conversation's next turn arrives after
  // the other conversations' turns, as users take turns with a server.
  for (int t = 0; t < o.turns && static_cast<int>(specs.size()) < o.num_prompts; ++t) {
    for (int c = 0; c < conversations && static_cast<int>(specs.size()) < o.num_prompts; ++c) {
      std::vector<std::string>& h = history[c];
      if (t > 0) {
        // The previous answer goes back into the conversation: a stand-in of the answer's
        // length (the text the server generated is not known when the dataset is built).
        const std::vector<std::string> answer = source.Pieces(rng, o.output_len);
        h.insert(h.end(), answer.begin(), answer.end());
      }
      const std::vector<std::string> user = source.Pieces(rng, o.user_len);
      h.insert(h.end(), user.begin(), user.end());
      RequestSpec spec;
      spec.prompt = source.Join(h);
      spec.prompt_len =
          source.CountsExactly() ? source.Count(spec.prompt) : static_cast<int>(h.size());
      spec.output_len = o.output_len;
      specs.push_back(std::move(spec));
    }
  }
  return specs;
}

}  // namespace tandem::loadgen
