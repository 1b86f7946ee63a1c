#include "router/sampling_options.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"
#include "router/api_error.h"
#include "router/json_fields.h"

namespace tandem::router {
namespace {

using nlohmann::json;

bool Present(const json& request, const char* key) {
  auto it = request.find(key);
  return it != request.end() && !it->is_null();
}

// OpenAI and vLLM fields that tandem does not implement: a 400 when they ask for anything but
// the default, never a 200 that ignores them.
absl::Status RejectUnsupported(const json& request, ApiKind kind) {
  for (const char* key :
       {"tools", "functions", "function_call", "prediction", "audio", "guided_json", "guided_regex",
        "guided_choice", "guided_grammar", "structured_outputs", "allowed_token_ids", "bad_words",
        "truncate_prompt_tokens", "logits_processors", "reasoning_effort", "web_search_options"}) {
    if (Present(request, key)) {
      return InvalidParam(key, absl::StrCat("'", key, "' is not supported"));
    }
  }
  if (kind == ApiKind::kChat && Present(request, "echo")) {
    ASSIGN_OR_RETURN(std::optional<bool> echo, GetBool(request, "echo"));
    if (echo.value_or(false)) {
      return InvalidParam("echo",
                          "echo is not supported on /v1/chat/completions (it is a "
                          "/v1/completions parameter here)");
    }
  }
  if (Present(request, "tool_choice")) {
    const json& choice = request["tool_choice"];
    if (!(choice.is_string() && choice.get<std::string>() == "none")) {
      return InvalidParam("tool_choice", "tool calling is not supported (tool_choice: \"none\")");
    }
  }
  if (Present(request, "response_format")) {
    const json& format = request["response_format"];
    if (!format.is_object() || format.value("type", "") != "text") {
      return InvalidParam("response_format",
                          "only response_format {\"type\": \"text\"} is supported (no JSON mode "
                          "or structured outputs)");
    }
  }
  if (Present(request, "modalities")) {
    const json& m = request["modalities"];
    if (!(m.is_array() && m.size() == 1 && m[0] == "text")) {
      return InvalidParam("modalities", "only the \"text\" modality is supported");
    }
  }
  ASSIGN_OR_RETURN(std::optional<bool> beam, GetBool(request, "use_beam_search"));
  if (beam.value_or(false)) return InvalidParam("use_beam_search", "beam search is not supported");
  ASSIGN_OR_RETURN(std::optional<double> length_penalty, GetNumber(request, "length_penalty"));
  if (length_penalty && *length_penalty != 1.0) {
    return InvalidParam("length_penalty", "length_penalty is not supported (beam search only)");
  }
  ASSIGN_OR_RETURN(std::optional<bool> spaces, GetBool(request, "spaces_between_special_tokens"));
  if (spaces && !*spaces) {
    return InvalidParam("spaces_between_special_tokens",
                        "spaces_between_special_tokens = false is not supported");
  }
  ASSIGN_OR_RETURN(std::optional<bool> store, GetBool(request, "store"));
  if (store.value_or(false)) return InvalidParam("store", "stored completions are not supported");
  if (kind != ApiKind::kChat) {
    ASSIGN_OR_RETURN(std::optional<std::string> suffix, GetString(request, "suffix"));
    if (suffix && !suffix->empty()) return InvalidParam("suffix", "suffix is not supported");
  }
  return absl::OkStatus();
}

absl::Status ParseMaxTokens(const json& request, ApiKind kind, std::optional<int64_t>* max_tokens) {
  ASSIGN_OR_RETURN(*max_tokens, GetInt(request, "max_tokens"));
  const char* param = "max_tokens";
  if (kind == ApiKind::kChat) {
    ASSIGN_OR_RETURN(std::optional<int64_t> mct, GetInt(request, "max_completion_tokens"));
    if (mct) {
      *max_tokens = mct;
      param = "max_completion_tokens";
    }
  }
  if (*max_tokens && **max_tokens < 1) {
    return InvalidParam(param, absl::StrCat("max_tokens must be at least 1, got ", **max_tokens));
  }
  return absl::OkStatus();
}

// {"<token id>": bias, ...}: keys are decimal token ids (OpenAI's form).
absl::Status ParseLogitBias(const json& request, SamplingSpec* s) {
  auto it = request.find("logit_bias");
  if (it == request.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_object()) {
    return InvalidParam("logit_bias", "'logit_bias' must be an object of token id -> bias");
  }
  if (it->size() > static_cast<size_t>(kMaxLogitBiasEntries)) {
    return InvalidParam("logit_bias",
                        absl::StrCat("at most ", kMaxLogitBiasEntries, " logit_bias entries"));
  }
  for (const auto& [key, value] : it->items()) {
    int64_t id = -1;
    const char* end = key.data() + key.size();
    auto [ptr, ec] = std::from_chars(key.data(), end, id);
    if (key.empty() || ec != std::errc() || ptr != end || id < 0 || id > INT32_MAX) {
      return InvalidParam("logit_bias",
                          absl::StrCat("logit_bias key '", key, "' is not a token id"));
    }
    if (!value.is_number()) {
      return InvalidParam("logit_bias", absl::StrCat("logit_bias['", key, "'] must be a number"));
    }
    const double bias = value.get<double>();
    if (!(bias >= -100.0 && bias <= 100.0)) {
      return InvalidParam("logit_bias", absl::StrCat("logit_bias values must be in [-100, 100], "
                                                     "got ",
                                                     bias, " for token ", key));
    }
    s->logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(bias));
  }
  std::sort(s->logit_bias.begin(), s->logit_bias.end());
  return absl::OkStatus();
}

// vLLM's "prompt_logprobs" (completions and chat; vLLM's protocol.py checks: an int, not with
// "stream", here within [0, 20] like "logprobs" — vLLM's -1, the whole vocabulary, is refused).
absl::Status ParsePromptLogprobs(const json& request, GenerateSpec* spec) {
  ASSIGN_OR_RETURN(std::optional<int64_t> n, GetInt(request, "prompt_logprobs"));
  if (!n) return absl::OkStatus();
  if (*n < 0 || *n > kMaxLogprobs) {
    return InvalidParam("prompt_logprobs", absl::StrCat("prompt_logprobs must be in [0, ",
                                                        kMaxLogprobs, "], got ", *n));
  }
  ASSIGN_OR_RETURN(std::optional<bool> stream, GetBool(request, "stream"));
  if (stream.value_or(false)) {
    return InvalidParam("prompt_logprobs",
                        "prompt_logprobs are not available when stream is true (as vLLM)");
  }
  spec->prompt_logprobs = static_cast<int>(*n);
  spec->sampling.prompt_logprobs = spec->prompt_logprobs;
  return absl::OkStatus();
}

// Completions: "logprobs": int (top alternatives) and "echo". Chat: "logprobs": bool and
// "top_logprobs": int.
absl::Status ParseLogprobs(const json& request, ApiKind kind, GenerateSpec* spec) {
  RETURN_IF_ERROR(ParsePromptLogprobs(request, spec));
  if (kind == ApiKind::kChat) {
    ASSIGN_OR_RETURN(std::optional<bool> logprobs, GetBool(request, "logprobs"));
    ASSIGN_OR_RETURN(std::optional<int64_t> top, GetInt(request, "top_logprobs"));
    if (top && !logprobs.value_or(false)) {
      return InvalidParam("top_logprobs", "top_logprobs needs logprobs: true");
    }
    if (top && (*top < 0 || *top > kMaxLogprobs)) {
      return InvalidParam("top_logprobs", absl::StrCat("top_logprobs must be in [0, ", kMaxLogprobs,
                                                       "], got ", *top));
    }
    if (logprobs.value_or(false)) spec->sampling.logprobs = static_cast<int>(top.value_or(0));
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(std::optional<int64_t> logprobs, GetInt(request, "logprobs"));
  if (logprobs) {
    if (*logprobs < 0 || *logprobs > kMaxLogprobs) {
      return InvalidParam(
          "logprobs", absl::StrCat("logprobs must be in [0, ", kMaxLogprobs, "], got ", *logprobs));
    }
    spec->sampling.logprobs = static_cast<int>(*logprobs);
  }
  ASSIGN_OR_RETURN(std::optional<bool> echo, GetBool(request, "echo"));
  spec->echo = echo.value_or(false);
  // echo with logprobs (OpenAI's legacy completions): the prompt's tokens and logprobs come
  // first in "logprobs", so the workers score the prompt too, with as many alternatives.
  if (spec->echo && logprobs) {
    spec->sampling.prompt_logprobs =
        std::max(spec->sampling.prompt_logprobs, static_cast<int>(*logprobs));
  }
  return absl::OkStatus();
}

absl::Status ParseChoices(const json& request, ApiKind kind, GenerateSpec* spec) {
  ASSIGN_OR_RETURN(std::optional<int64_t> n, GetInt(request, "n"));
  if (n && (*n < 1 || *n > kMaxSequencesPerRequest)) {
    return InvalidParam("n",
                        absl::StrCat("n must be in [1, ", kMaxSequencesPerRequest, "], got ", *n));
  }
  spec->n = static_cast<int>(n.value_or(1));
  ASSIGN_OR_RETURN(std::optional<int64_t> best_of, GetInt(request, "best_of"));
  if (best_of && kind == ApiKind::kChat && *best_of != 1) {
    return InvalidParam("best_of", "best_of is a /v1/completions parameter");
  }
  if (best_of && (*best_of < spec->n || *best_of > kMaxSequencesPerRequest)) {
    return InvalidParam("best_of", absl::StrCat("best_of must be in [n = ", spec->n, ", ",
                                                kMaxSequencesPerRequest, "], got ", *best_of));
  }
  spec->best_of = static_cast<int>(best_of.value_or(spec->n));
  return absl::OkStatus();
}

absl::Status ParsePenalties(const json& request, SamplingSpec* s) {
  ASSIGN_OR_RETURN(std::optional<double> presence, GetNumber(request, "presence_penalty"));
  if (presence) s->presence_penalty = static_cast<float>(*presence);
  ASSIGN_OR_RETURN(std::optional<double> frequency, GetNumber(request, "frequency_penalty"));
  if (frequency) s->frequency_penalty = static_cast<float>(*frequency);
  ASSIGN_OR_RETURN(std::optional<double> repetition, GetNumber(request, "repetition_penalty"));
  if (repetition) s->repetition_penalty = static_cast<float>(*repetition);
  ASSIGN_OR_RETURN(std::optional<double> min_p, GetNumber(request, "min_p"));
  if (min_p) s->min_p = static_cast<float>(*min_p);
  ASSIGN_OR_RETURN(std::optional<int64_t> min_tokens, GetInt(request, "min_tokens"));
  if (min_tokens) {
    if (*min_tokens < 0 || *min_tokens > INT32_MAX) {
      return InvalidParam("min_tokens",
                          absl::StrCat("min_tokens must be at least 0, got ", *min_tokens));
    }
    s->min_tokens = static_cast<int>(*min_tokens);
  }
  return ParseLogitBias(request, s);
}

}  // namespace

absl::Status ParseSamplingOptions(const json& request, ApiKind kind, GenerateSpec* spec,
                                  std::optional<int64_t>* max_tokens) {
  SamplingSpec* sampling = &spec->sampling;
  RETURN_IF_ERROR(RejectUnsupported(request, kind));
  RETURN_IF_ERROR(ParseMaxTokens(request, kind, max_tokens));
  RETURN_IF_ERROR(ParseChoices(request, kind, spec));
  RETURN_IF_ERROR(ParseLogprobs(request, kind, spec));
  RETURN_IF_ERROR(ParsePenalties(request, sampling));
  ASSIGN_OR_RETURN(std::optional<double> temperature, GetNumber(request, "temperature"));
  if (temperature) sampling->temperature = static_cast<float>(*temperature);
  ASSIGN_OR_RETURN(std::optional<double> top_p, GetNumber(request, "top_p"));
  if (top_p) sampling->top_p = static_cast<float>(*top_p);
  ASSIGN_OR_RETURN(std::optional<int64_t> top_k, GetInt(request, "top_k"));
  if (top_k) {
    if (*top_k < -1 || *top_k > (int64_t{1} << 30)) {
      return InvalidParam("top_k",
                          absl::StrCat("top_k must be 0 (disable), or at least 1, got ", *top_k));
    }
    sampling->top_k = static_cast<int>(*top_k);
  }
  ASSIGN_OR_RETURN(std::optional<int64_t> seed, GetInt(request, "seed"));
  if (seed && *seed != -1) sampling->seed = static_cast<uint64_t>(*seed);
  ASSIGN_OR_RETURN(sampling->stop, GetStringOrList(request, "stop"));
  ASSIGN_OR_RETURN(std::vector<int64_t> stop_ids, GetIntList(request, "stop_token_ids"));
  for (int64_t id : stop_ids) {
    if (id < 0 || id > INT32_MAX) return InvalidParam("stop_token_ids", "invalid token id");
    sampling->stop_token_ids.push_back(static_cast<int32_t>(id));
  }
  ASSIGN_OR_RETURN(std::optional<bool> ignore_eos, GetBool(request, "ignore_eos"));
  sampling->ignore_eos = ignore_eos.value_or(false);
  ASSIGN_OR_RETURN(std::optional<bool> skip, GetBool(request, "skip_special_tokens"));
  sampling->skip_special_tokens = skip.value_or(true);
  ASSIGN_OR_RETURN(std::optional<bool> include_stop,
                   GetBool(request, "include_stop_str_in_output"));
  sampling->include_stop_str_in_output = include_stop.value_or(false);
  return absl::OkStatus();
}

absl::Status ValidateSampling(const SamplingSpec& sampling, int vocab_size) {
  if (!std::isfinite(sampling.temperature) || sampling.temperature < 0.0f ||
      sampling.temperature > 2.0f) {
    return InvalidParam("temperature",
                        absl::StrCat("temperature must be in [0, 2], got ", sampling.temperature));
  }
  if (!std::isfinite(sampling.top_p) || sampling.top_p <= 0.0f || sampling.top_p > 1.0f) {
    return InvalidParam("top_p", absl::StrCat("top_p must be in (0, 1], got ", sampling.top_p));
  }
  if (sampling.top_k < -1) {
    return InvalidParam(
        "top_k", absl::StrCat("top_k must be 0 (disable), or at least 1, got ", sampling.top_k));
  }
  if (!(sampling.min_p >= 0.0f && sampling.min_p <= 1.0f)) {
    return InvalidParam("min_p", absl::StrCat("min_p must be in [0, 1], got ", sampling.min_p));
  }
  for (auto [key, value] : {std::pair{"presence_penalty", sampling.presence_penalty},
                            std::pair{"frequency_penalty", sampling.frequency_penalty}}) {
    if (!(value >= -2.0f && value <= 2.0f)) {
      return InvalidParam(key, absl::StrCat(key, " must be in [-2, 2], got ", value));
    }
  }
  if (!(std::isfinite(sampling.repetition_penalty) && sampling.repetition_penalty > 0.0f)) {
    return InvalidParam("repetition_penalty",
                        absl::StrCat("repetition_penalty must be greater than zero, got ",
                                     sampling.repetition_penalty));
  }
  if (sampling.min_tokens < 0 || sampling.min_tokens > sampling.max_tokens) {
    return InvalidParam("min_tokens",
                        absl::StrCat("min_tokens must be in [0, max_tokens = ", sampling.max_tokens,
                                     "], got ", sampling.min_tokens));
  }
  if (sampling.logprobs < -1 || sampling.logprobs > kMaxLogprobs) {
    return InvalidParam("logprobs", absl::StrCat("logprobs must be in [0, ", kMaxLogprobs,
                                                 "], got ", sampling.logprobs));
  }
  if (sampling.stop.size() > kMaxStopStrings) {
    return InvalidParam("stop", absl::StrCat("at most ", kMaxStopStrings, " stop strings"));
  }
  for (const std::string& stop : sampling.stop) {
    if (stop.empty()) return InvalidParam("stop", "stop strings must not be empty");
  }
  for (int32_t id : sampling.stop_token_ids) {
    if (id < 0 || (vocab_size > 0 && id >= vocab_size)) {
      return InvalidParam("stop_token_ids", absl::StrCat("token id ", id, " is out of range"));
    }
  }
  if (sampling.logit_bias.size() > static_cast<size_t>(kMaxLogitBiasEntries)) {
    return InvalidParam("logit_bias",
                        absl::StrCat("at most ", kMaxLogitBiasEntries, " logit_bias entries"));
  }
  for (const auto& [id, bias] : sampling.logit_bias) {
    if (id < 0 || (vocab_size > 0 && id >= vocab_size)) {
      return InvalidParam("logit_bias", absl::StrCat("logit_bias token id ", id,
                                                     " is out of range [0, ", vocab_size, ")"));
    }
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return InvalidParam("logit_bias",
                          absl::StrCat("logit_bias values must be in [-100, 100], got ", bias));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::router
