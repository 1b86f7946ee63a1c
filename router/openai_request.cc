#include "router/openai_request.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"
#include "router/api_error.h"
#include "router/json_fields.h"
#include "router/sampling_options.h"

namespace tandem::router {
namespace {

using nlohmann::json;

absl::Status CheckPromptChars(const ModelContext& model, size_t chars) {
  const int64_t limit = int64_t{model.max_model_len} * kMaxPromptCharsPerToken;
  if (static_cast<int64_t>(chars) > limit) {
    return InvalidParam(
        "prompt",
        absl::StrCat("This model's maximum context length is ", model.max_model_len,
                     " tokens. However, your prompt contains ", chars,
                     " characters, more than the upper bound of ", limit, " characters."));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> TokenIdsFrom(const json& ids, const ModelContext& model) {
  std::vector<int32_t> out;
  out.reserve(ids.size());
  for (const json& id : ids) {
    if (!IsIntegral(id)) return InvalidParam("prompt", "token ids must be integers");
    const double value = id.get<double>();
    if (value < 0 || value >= model.vocab_size) {
      return InvalidParam("prompt", absl::StrCat("token id ", static_cast<int64_t>(value),
                                                 " is out of range [0, ", model.vocab_size, ")"));
    }
    out.push_back(static_cast<int32_t>(value));
  }
  return out;
}

// "prompt": a string, a list of token ids, or a non-empty list of either (a batch).
absl::StatusOr<std::vector<std::vector<int32_t>>> CompletionPrompts(const json& request,
                                                                    const ModelContext& model) {
  auto it = request.find("prompt");
  if (it == request.end() || it->is_null()) {
    return InvalidParam("prompt", "'prompt' is a required field");
  }
  ASSIGN_OR_RETURN(std::optional<bool> add_special, GetBool(request, "add_special_tokens"));
  const json& prompt = *it;
  std::vector<const json*> items;
  if (prompt.is_string() || (prompt.is_array() && !prompt.empty() && prompt[0].is_number())) {
    items.push_back(&prompt);
  } else if (prompt.is_array() && !prompt.empty()) {
    for (const json& p : prompt) items.push_back(&p);
  } else {
    return InvalidParam("prompt",
                        "'prompt' must be a string, a list of token ids, or a non-empty list of "
                        "either");
  }
  if (items.size() > static_cast<size_t>(kMaxSequencesPerRequest)) {
    return InvalidParam(
        "prompt", absl::StrCat("at most ", kMaxSequencesPerRequest, " prompts in one request"));
  }
  size_t chars = 0;
  std::vector<std::vector<int32_t>> out;
  for (const json* p : items) {
    if (p->is_string()) {
      const std::string& text = p->get_ref<const std::string&>();
      chars += text.size();
      RETURN_IF_ERROR(CheckPromptChars(model, chars));
      out.push_back(model.tokenizer->Encode(text, add_special.value_or(true)));
    } else if (p->is_array() &&
               std::all_of(p->begin(), p->end(), [](const json& e) { return e.is_number(); })) {
      ASSIGN_OR_RETURN(std::vector<int32_t> ids, TokenIdsFrom(*p, model));
      out.push_back(std::move(ids));
    } else {
      return InvalidParam("prompt",
                          "each prompt of a batch must be a string or a list of token ids");
    }
  }
  return out;
}

absl::StatusOr<std::string> MessageContent(const json& message, size_t index) {
  const std::string param = absl::StrCat("messages[", index, "].content");
  auto it = message.find("content");
  if (it == message.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) return InvalidParam(param, "content must be a string or a list of parts");
  std::string text;
  for (const json& part : *it) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
        !part["text"].is_string()) {
      return InvalidParam(param, "only text content parts are supported");
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

// "stream" and "stream_options": {"include_usage"}.
absl::Status ParseStreamFlags(const json& request, GenerateSpec* spec) {
  ASSIGN_OR_RETURN(std::optional<bool> stream, GetBool(request, "stream"));
  spec->stream = stream.value_or(false);
  auto so = request.find("stream_options");
  if (so == request.end() || so->is_null()) return absl::OkStatus();
  if (!so->is_object()) return InvalidParam("stream_options", "'stream_options' must be an object");
  ASSIGN_OR_RETURN(std::optional<bool> usage, GetBool(*so, "include_usage"));
  spec->include_usage = usage.value_or(false);
  ASSIGN_OR_RETURN(std::optional<bool> continuous, GetBool(*so, "continuous_usage_stats"));
  spec->continuous_usage_stats = continuous.value_or(false);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<json> ParseJsonObject(std::string_view body) {
  if (!IsValidUtf8(body)) return absl::InvalidArgumentError("request body is not valid UTF-8");
  json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return absl::InvalidArgumentError("request body is not valid JSON");
  if (!parsed.is_object()) return absl::InvalidArgumentError("request body must be a JSON object");
  return parsed;
}

absl::Status CheckModel(const json& request, const ModelContext& model) {
  ASSIGN_OR_RETURN(std::optional<std::string> name, GetString(request, "model"));
  if (name && !name->empty() && *name != model.served_name) {
    return WithParam(absl::NotFoundError(absl::StrCat("The model `", *name, "` does not exist.")),
                     "model");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ChatMessage>> ParseMessages(const json& request) {
  auto it = request.find("messages");
  if (it == request.end() || it->is_null()) {
    return InvalidParam("messages", "'messages' is a required field");
  }
  if (!it->is_array() || it->empty()) {
    return InvalidParam("messages", "'messages' must be a non-empty list");
  }
  std::vector<ChatMessage> messages;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string param = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return InvalidParam(param, "each message must be an object");
    ASSIGN_OR_RETURN(std::optional<std::string> role, GetString(m, "role"));
    if (!role) return InvalidParam(param + ".role", "'role' is a required field");
    if (*role == "developer") role = "system";
    if (*role != "system" && *role != "user" && *role != "assistant") {
      return InvalidParam(param + ".role", absl::StrCat("unsupported role '", *role, "'"));
    }
    ASSIGN_OR_RETURN(std::string content, MessageContent(m, i));
    messages.push_back(ChatMessage{*role, std::move(content)});
  }
  return messages;
}

absl::Status ResolveMaxTokens(const ModelContext& model, std::optional<int64_t> max_tokens,
                              int default_max_tokens, GenerateSpec* spec) {
  const int64_t prompt_len = static_cast<int64_t>(spec->prompt_tokens.size());
  if (prompt_len == 0) return InvalidParam("prompt", "the prompt is empty");
  if (prompt_len >= model.max_model_len) {
    return InvalidParam("prompt",
                        absl::StrCat("This model's maximum context length is ", model.max_model_len,
                                     " tokens. However, your prompt contains ", prompt_len,
                                     " input tokens, leaving no room for output "
                                     "tokens. Please reduce the length of the prompt."));
  }
  if (max_tokens && *max_tokens < 1) {
    return InvalidParam("max_tokens",
                        absl::StrCat("max_tokens must be at least 1, got ", *max_tokens));
  }
  const int64_t requested = max_tokens.value_or(
      default_max_tokens > 0 ? default_max_tokens : model.max_model_len - prompt_len);
  if (prompt_len + requested > model.max_model_len) {
    return InvalidParam(
        "max_tokens",
        absl::StrCat("This model's maximum context length is ", model.max_model_len,
                     " tokens. However, you requested ", requested,
                     " output tokens and your prompt contains at least ", prompt_len,
                     " input tokens, for a total of at least ", prompt_len + requested,
                     " tokens. Please reduce the length of the input prompt or the number of "
                     "requested output tokens."));
  }
  spec->sampling.max_tokens = static_cast<int>(requested);
  return absl::OkStatus();
}

absl::Status CheckContextLength(const ModelContext& model, int default_max_tokens,
                                const json& request, GenerateSpec* spec) {
  std::optional<int64_t> max_tokens;
  RETURN_IF_ERROR(ParseSamplingOptions(request, spec->kind, spec, &max_tokens));
  RETURN_IF_ERROR(ResolveMaxTokens(model, max_tokens, default_max_tokens, spec));
  return ValidateSampling(spec->sampling, model.vocab_size);
}

absl::StatusOr<GenerateSpec> ParseCompletionRequest(std::string_view body,
                                                    const ModelContext& model) {
  ASSIGN_OR_RETURN(json request, ParseJsonObject(body));
  RETURN_IF_ERROR(CheckModel(request, model));
  GenerateSpec spec;
  spec.kind = ApiKind::kCompletion;
  spec.model = model.served_name;
  ASSIGN_OR_RETURN(std::vector<std::vector<int32_t>> prompts, CompletionPrompts(request, model));
  spec.prompt_tokens = std::move(prompts[0]);
  RETURN_IF_ERROR(CheckContextLength(model, kDefaultCompletionMaxTokens, request, &spec));
  for (size_t i = 1; i < prompts.size(); ++i) {
    // Every prompt of the batch must leave room for max_tokens.
    GenerateSpec other;
    other.prompt_tokens = std::move(prompts[i]);
    std::optional<int64_t> max_tokens = spec.sampling.max_tokens;
    RETURN_IF_ERROR(ResolveMaxTokens(model, max_tokens, kDefaultCompletionMaxTokens, &other));
    spec.more_prompts.push_back(std::move(other.prompt_tokens));
  }
  if (static_cast<int64_t>(prompts.size()) * spec.best_of > kMaxSequencesPerRequest) {
    return InvalidParam(
        "best_of", absl::StrCat("prompts x best_of must be at most ", kMaxSequencesPerRequest));
  }
  RETURN_IF_ERROR(ParseStreamFlags(request, &spec));
  if (spec.stream && spec.best_of > spec.n) {
    return InvalidParam("best_of", "best_of > n cannot be streamed");
  }
  return spec;
}

absl::StatusOr<GenerateSpec> ParseChatRequest(std::string_view body, const ModelContext& model) {
  ASSIGN_OR_RETURN(json request, ParseJsonObject(body));
  RETURN_IF_ERROR(CheckModel(request, model));
  GenerateSpec spec;
  spec.kind = ApiKind::kChat;
  spec.model = model.served_name;
  ASSIGN_OR_RETURN(std::vector<ChatMessage> messages, ParseMessages(request));
  size_t chars = 0;
  for (const ChatMessage& m : messages) chars += m.content.size();
  RETURN_IF_ERROR(CheckPromptChars(model, chars));
  ASSIGN_OR_RETURN(std::string prompt, model.chat_formatter(messages));
  // The template already carries BOS and the role markers (vLLM's chat default).
  ASSIGN_OR_RETURN(std::optional<bool> add_special, GetBool(request, "add_special_tokens"));
  spec.prompt_tokens = model.tokenizer->Encode(prompt, add_special.value_or(false));
  RETURN_IF_ERROR(CheckContextLength(model, /*default_max_tokens=*/-1, request, &spec));
  RETURN_IF_ERROR(ParseStreamFlags(request, &spec));
  return spec;
}

}  // namespace tandem::router
