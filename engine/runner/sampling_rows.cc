#include "engine/runner/sampling_rows.h"

#include <limits>

namespace tandem {

void AppendSamplingRow(const Sequence& seq, const std::vector<int>& eos_token_ids, StepInputs* in,
                       int num_spec) {
  const SamplingParams& p = seq.sampling;
  const int num_output = seq.num_output_tokens() + num_spec;
  SamplingRow row;
  row.temperature = p.temperature;
  row.top_k = p.top_k;
  row.top_p = p.top_p;
  row.min_p = p.min_p;
  row.seed = seq.seed;
  row.step = static_cast<uint64_t>(num_output);
  row.repetition_penalty = p.repetition_penalty;
  row.frequency_penalty = p.frequency_penalty;
  row.presence_penalty = p.presence_penalty;
  row.num_logprobs = p.logprobs;
  in->sampling.push_back(row);

  // Penalty history: the prompt counts for the repetition penalty only.
  int32_t num_prompt = 0;
  if (row.has_penalties()) {
    const auto begin = seq.tokens.begin();
    const auto prompt_end = begin + seq.num_prompt_tokens;
    if (row.repetition_penalty != 1.0f) {
      in->history_tokens.insert(in->history_tokens.end(), begin, prompt_end);
      num_prompt = seq.num_prompt_tokens;
    }
    in->history_tokens.insert(in->history_tokens.end(), prompt_end, seq.tokens.end());
    in->history_tokens.insert(in->history_tokens.end(), seq.spec_tokens.begin(),
                              seq.spec_tokens.begin() + num_spec);
  }
  in->num_prompt_history.push_back(num_prompt);
  in->history_start.push_back(static_cast<int32_t>(in->history_tokens.size()));

  for (const auto& [token, bias] : p.logit_bias) {
    in->bias_tokens.push_back(token);
    in->bias_values.push_back(bias);
  }
  if (num_output < p.min_tokens) {
    constexpr float kBanned = -std::numeric_limits<float>::infinity();
    if (!p.ignore_eos) {
      for (int eos : eos_token_ids) {
        in->bias_tokens.push_back(eos);
        in->bias_values.push_back(kBanned);
      }
    }
    for (int32_t stop : p.stop_token_ids) {
      in->bias_tokens.push_back(stop);
      in->bias_values.push_back(kBanned);
    }
  }
  in->bias_start.push_back(static_cast<int32_t>(in->bias_tokens.size()));
}

}  // namespace tandem
