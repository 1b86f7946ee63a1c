#include "router/sampling_options.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"
#include "router/api_error.h"
#include "router/json_fields.h"

namespace tandem::router {
namespace {

// Options we accept but do not implement must be at their neutral value.
absl::Status RejectUnsupported(const nlohmann::json& request, ApiKind kind) {
  ASSIGN_OR_RETURN(std::optional<int64_t> n, GetInt(request, "n"));
  if (n && *n != 1) return InvalidParam("n", "n > 1 is not supported (only n = 1)");
  ASSIGN_OR_RETURN(std::optional<int64_t> best_of, GetInt(request, "best_of"));
  if (best_of && *best_of != 1) return InvalidParam("best_of", "best_of > 1 is not supported");
  ASSIGN_OR_RETURN(std::optional<int64_t> min_tokens, GetInt(request, "min_tokens"));
  if (min_tokens && *min_tokens != 0) {
    return InvalidParam("min_tokens", "min_tokens is not supported");
  }
  if (kind == ApiKind::kChat) {
    ASSIGN_OR_RETURN(std::optional<bool> logprobs, GetBool(request, "logprobs"));
    if (logprobs.value_or(false)) return InvalidParam("logprobs", "logprobs are not supported");
  } else {
    ASSIGN_OR_RETURN(std::optional<int64_t> logprobs, GetInt(request, "logprobs"));
    if (logprobs) return InvalidParam("logprobs", "logprobs are not supported");
    ASSIGN_OR_RETURN(std::optional<bool> echo, GetBool(request, "echo"));
    if (echo.value_or(false)) return InvalidParam("echo", "echo is not supported");
    ASSIGN_OR_RETURN(std::optional<std::string> suffix, GetString(request, "suffix"));
    if (suffix && !suffix->empty()) return InvalidParam("suffix", "suffix is not supported");
  }
  for (const char* key : {"presence_penalty", "frequency_penalty"}) {
    ASSIGN_OR_RETURN(std::optional<double> penalty, GetNumber(request, key));
    if (penalty && !(*penalty >= -2.0 && *penalty <= 2.0)) {
      return InvalidParam(key, absl::StrCat(key, " must be in [-2, 2], got ", *penalty));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseMaxTokens(const nlohmann::json& request, ApiKind kind,
                            std::optional<int64_t>* max_tokens) {
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

}  // namespace

absl::Status ParseSamplingOptions(const nlohmann::json& request, ApiKind kind,
                                  SamplingSpec* sampling, std::optional<int64_t>* max_tokens) {
  RETURN_IF_ERROR(RejectUnsupported(request, kind));
  RETURN_IF_ERROR(ParseMaxTokens(request, kind, max_tokens));
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
  return absl::OkStatus();
}

}  // namespace tandem::router
