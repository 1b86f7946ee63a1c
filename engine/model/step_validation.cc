#include "engine/model/step_validation.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace tandem {
namespace {

absl::Status Bad(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("step inputs: ", what));
}

absl::Status CheckLayout(const ModelConfig& c, const KvLayout& l) {
  if (l.num_layers != c.num_layers || l.num_kv_heads != c.num_kv_heads ||
      l.head_dim != c.head_dim) {
    return Bad(absl::StrCat("KV layout (layers ", l.num_layers, ", kv heads ", l.num_kv_heads,
                            ", head_dim ", l.head_dim, ") does not match the model (", c.num_layers,
                            ", ", c.num_kv_heads, ", ", c.head_dim, ")"));
  }
  if (l.dtype != DType::kF32 && l.dtype != DType::kBF16 && l.dtype != DType::kF8E4M3) {
    return Bad(absl::StrCat("KV dtype ", std::string(DTypeName(l.dtype)), " is not supported"));
  }
  if (l.page_size <= 0 || l.num_pages <= 0) return Bad("KV layout has no pages");
  return absl::OkStatus();
}

absl::Status CheckSizes(const StepInputs& in) {
  const size_t t = static_cast<size_t>(in.num_tokens);
  if (in.num_seqs < 0 || in.num_tokens < 0 || in.max_pages_per_seq < 0) {
    return Bad("negative count");
  }
  if (in.token_ids.size() != t || in.positions.size() != t || in.slot_mapping.size() != t) {
    return Bad(
        absl::StrCat("token_ids/positions/slot_mapping must have num_tokens (", t, ") entries"));
  }
  if (in.query_start.size() != static_cast<size_t>(in.num_seqs) + 1 ||
      in.seq_lens.size() != static_cast<size_t>(in.num_seqs)) {
    return Bad("query_start must have num_seqs + 1 entries and seq_lens num_seqs");
  }
  if (in.block_tables.size() != static_cast<size_t>(in.num_seqs) * in.max_pages_per_seq) {
    return Bad("block_tables must have num_seqs * max_pages_per_seq entries");
  }
  return absl::OkStatus();
}

absl::Status CheckSequences(const StepInputs& in, const KvLayout& l) {
  if (in.query_start[0] != 0 || in.query_start[in.num_seqs] != in.num_tokens) {
    return Bad("query_start must start at 0 and end at num_tokens");
  }
  for (int s = 0; s < in.num_seqs; ++s) {
    const int64_t q_len = int64_t{in.query_start[s + 1]} - in.query_start[s];
    if (q_len < 0) return Bad(absl::StrCat("query_start decreases at seq ", s));
    if (in.seq_lens[s] < q_len) {
      return Bad(
          absl::StrCat("seq ", s, ": seq_len ", in.seq_lens[s], " < its ", q_len, " new tokens"));
    }
    const int64_t pages = (int64_t{in.seq_lens[s]} + l.page_size - 1) / l.page_size;
    if (pages > in.max_pages_per_seq) {
      return Bad(absl::StrCat("seq ", s, ": seq_len ", in.seq_lens[s], " needs ", pages,
                              " pages, block table has ", in.max_pages_per_seq));
    }
    for (int64_t p = 0; p < pages; ++p) {
      const int32_t page = in.block_tables[s * int64_t{in.max_pages_per_seq} + p];
      if (page < 0 || page >= l.num_pages) {
        return Bad(
            absl::StrCat("seq ", s, ": page id ", page, " outside the pool of ", l.num_pages));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckTokens(const StepInputs& in, const ModelConfig& c, const KvLayout& l) {
  const int64_t num_slots = int64_t{l.num_pages} * l.page_size;
  for (int64_t t = 0; t < in.num_tokens; ++t) {
    if (in.token_ids[t] < 0 || in.token_ids[t] >= c.vocab_size) {
      return Bad(
          absl::StrCat("token id ", in.token_ids[t], " outside the vocabulary of ", c.vocab_size));
    }
    if (in.positions[t] < 0 || in.positions[t] >= c.max_position_embeddings) {
      return Bad(absl::StrCat("position ", in.positions[t], " outside [0, ",
                              c.max_position_embeddings, ")"));
    }
    if (in.slot_mapping[t] >= num_slots) {
      return Bad(absl::StrCat("slot ", in.slot_mapping[t], " outside the pool of ", num_slots));
    }
  }
  for (int32_t row : in.logits_rows) {
    if (row < 0 || row >= in.num_tokens) return Bad(absl::StrCat("logits row ", row));
  }
  return absl::OkStatus();
}

absl::Status CheckRow(const SamplingRow& r, size_t i) {
  const bool ok = std::isfinite(r.temperature) && r.temperature >= 0.0f && r.top_p > 0.0f &&
                  r.top_p <= 1.0f && r.min_p >= 0.0f && r.min_p <= 1.0f &&
                  std::isfinite(r.repetition_penalty) && r.repetition_penalty > 0.0f &&
                  std::isfinite(r.frequency_penalty) && std::isfinite(r.presence_penalty) &&
                  r.num_logprobs >= -1 && r.num_logprobs <= kMaxTopLogprobs;
  return ok ? absl::OkStatus()
            : Bad(absl::StrCat("sampling row ", i, " has a parameter out of range"));
}

// `start` is empty (no lists) or a prefix sum over `size` entries with rows + 1 values.
absl::Status CheckRanges(const std::vector<int32_t>& start, size_t rows, size_t size,
                         const char* what) {
  if (start.empty()) {
    return size == 0 ? absl::OkStatus() : Bad(absl::StrCat(what, " without row starts"));
  }
  if (start.size() != rows + 1 || start[0] != 0 || start.back() != static_cast<int32_t>(size)) {
    return Bad(absl::StrCat(what, " starts must be rows + 1 prefix sums over the list"));
  }
  for (size_t r = 0; r < rows; ++r) {
    if (start[r + 1] < start[r]) return Bad(absl::StrCat(what, " starts decrease at row ", r));
  }
  return absl::OkStatus();
}

absl::Status CheckIds(const std::vector<int32_t>& ids, int vocab, const char* what) {
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab) {
      return Bad(absl::StrCat(what, " token id ", id, " outside the vocabulary of ", vocab));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateSampling(const StepInputs& in, const ModelConfig& config) {
  const size_t rows = in.logits_rows.size();
  if (in.sampling.size() != rows) {
    return Bad(absl::StrCat(in.sampling.size(), " sampling rows for ", rows, " logits rows"));
  }
  for (size_t i = 0; i < rows; ++i) RETURN_IF_ERROR(CheckRow(in.sampling[i], i));
  RETURN_IF_ERROR(CheckRanges(in.history_start, rows, in.history_tokens.size(), "history"));
  if (!in.history_start.empty()) {
    if (in.num_prompt_history.size() != rows)
      return Bad("num_prompt_history must have rows entries");
    for (size_t r = 0; r < rows; ++r) {
      const int32_t len = in.history_start[r + 1] - in.history_start[r];
      if (in.num_prompt_history[r] < 0 || in.num_prompt_history[r] > len) {
        return Bad(absl::StrCat("row ", r, ": num_prompt_history outside its history"));
      }
    }
  }
  RETURN_IF_ERROR(CheckIds(in.history_tokens, config.vocab_size, "history"));
  RETURN_IF_ERROR(CheckRanges(in.bias_start, rows, in.bias_tokens.size(), "bias"));
  if (in.bias_values.size() != in.bias_tokens.size()) {
    return Bad("bias_values and bias_tokens differ in length");
  }
  RETURN_IF_ERROR(CheckIds(in.bias_tokens, config.vocab_size, "bias"));
  for (float v : in.bias_values) {
    if (std::isnan(v) || v == INFINITY) return Bad("a bias is NaN or +inf");
  }
  return ValidatePromptLogprobRows(in, config);
}

absl::Status ValidatePromptLogprobRows(const StepInputs& in, const ModelConfig& config) {
  const size_t n = in.prompt_logprob_rows.size();
  if (in.prompt_logprob_targets.size() != n || in.prompt_logprob_top.size() != n) {
    return Bad("prompt_logprob_rows, _targets and _top differ in length");
  }
  for (size_t i = 0; i < n; ++i) {
    const int32_t row = in.prompt_logprob_rows[i];
    if (row < 0 || row >= in.num_tokens || (i > 0 && row <= in.prompt_logprob_rows[i - 1])) {
      return Bad(absl::StrCat("prompt logprob row ", row, " is outside [0, ", in.num_tokens,
                              ") or not ascending"));
    }
    if (in.prompt_logprob_top[i] < 0 || in.prompt_logprob_top[i] > kMaxTopLogprobs) {
      return Bad(absl::StrCat("prompt logprob row ", row, ": top ", in.prompt_logprob_top[i],
                              " outside [0, ", kMaxTopLogprobs, "]"));
    }
  }
  return CheckIds(in.prompt_logprob_targets, config.vocab_size, "prompt logprob target");
}

absl::Status ValidateStep(const StepInputs& in, const ModelConfig& config, const KvLayout& layout) {
  RETURN_IF_ERROR(CheckLayout(config, layout));
  RETURN_IF_ERROR(CheckSizes(in));
  RETURN_IF_ERROR(CheckSequences(in, layout));
  return CheckTokens(in, config, layout);
}

}  // namespace tandem
