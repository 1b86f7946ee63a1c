// OpenAiApi: /tokenize, /detokenize and /v1/models (vLLM's shapes).
#include <cctype>

#include "absl/strings/numbers.h"
#include "base/status_macros.h"
#include "router/api_error.h"
#include "router/json_fields.h"
#include "router/openai_api.h"
#include "router/openai_sinks.h"

namespace tandem::router {
namespace {

using nlohmann::json;

absl::StatusOr<std::vector<int32_t>> Tokenize(const json& request, const ModelContext& model) {
  RETURN_IF_ERROR(CheckModel(request, model));
  if (request.contains("messages")) {
    ASSIGN_OR_RETURN(std::vector<ChatMessage> messages, ParseMessages(request));
    ASSIGN_OR_RETURN(std::string prompt, model.chat_formatter(messages));
    ASSIGN_OR_RETURN(std::optional<bool> add_special, GetBool(request, "add_special_tokens"));
    return model.tokenizer->Encode(prompt, add_special.value_or(false));
  }
  ASSIGN_OR_RETURN(std::optional<std::string> prompt, GetString(request, "prompt"));
  if (!prompt) return InvalidParam("prompt", "'prompt' (or 'messages') is a required field");
  ASSIGN_OR_RETURN(std::optional<bool> add_special, GetBool(request, "add_special_tokens"));
  return model.tokenizer->Encode(*prompt, add_special.value_or(true));
}

absl::StatusOr<std::string> Detokenize(const json& request, const ModelContext& model) {
  RETURN_IF_ERROR(CheckModel(request, model));
  if (!request.contains("tokens")) return InvalidParam("tokens", "'tokens' is a required field");
  ASSIGN_OR_RETURN(std::vector<int64_t> tokens, GetIntList(request, "tokens"));
  std::vector<int32_t> ids;
  for (int64_t id : tokens) {
    if (id < 0 || id >= model.tokenizer->vocab_size()) {
      return InvalidParam("tokens", absl::StrCat("token id ", id, " is out of range"));
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  return model.tokenizer->Decode(ids, /*skip_special_tokens=*/false);
}

}  // namespace

void OpenAiApi::HandleTokenize(const HttpRequest& request, HttpResponder& responder,
                               const HttpHeaders& headers) {
  absl::StatusOr<json> body = ParseJsonObject(request.body);
  absl::StatusOr<std::vector<int32_t>> tokens =
      body.ok() ? Tokenize(*body, model_) : absl::StatusOr<std::vector<int32_t>>(body.status());
  if (!tokens.ok()) return SendError(responder, metrics_, tokens.status(), headers);
  SendJson(
      responder, 200,
      {{"count", tokens->size()}, {"max_model_len", model_.max_model_len}, {"tokens", *tokens}},
      headers);
}

void OpenAiApi::HandleDetokenize(const HttpRequest& request, HttpResponder& responder,
                                 const HttpHeaders& headers) {
  absl::StatusOr<json> body = ParseJsonObject(request.body);
  absl::StatusOr<std::string> text =
      body.ok() ? Detokenize(*body, model_) : absl::StatusOr<std::string>(body.status());
  if (!text.ok()) return SendError(responder, metrics_, text.status(), headers);
  SendJson(responder, 200, {{"prompt", *text}}, headers);
}

json OpenAiApi::ModelJson() const {
  return {{"id", model_.served_name},
          {"object", "model"},
          {"created", created_},
          {"owned_by", "tandem"},
          {"root", options_.model_root},
          {"parent", nullptr},
          {"max_model_len", model_.max_model_len}};
}

void OpenAiApi::HandleModels(HttpResponder& responder, const HttpHeaders& headers) {
  SendJson(responder, 200, {{"object", "list"}, {"data", json::array({ModelJson()})}}, headers);
}

void OpenAiApi::HandleModel(const std::string& encoded_id, HttpResponder& responder,
                            const HttpHeaders& headers) {
  // Clients percent-encode the id in the path ("org%2Fname").
  std::string id;
  for (size_t i = 0; i < encoded_id.size(); ++i) {
    int byte = 0;
    if (encoded_id[i] == '%' && i + 2 < encoded_id.size() &&
        std::isxdigit(static_cast<unsigned char>(encoded_id[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(encoded_id[i + 2])) &&
        absl::SimpleHexAtoi(encoded_id.substr(i + 1, 2), &byte)) {
      id.push_back(static_cast<char>(byte));
      i += 2;
    } else {
      id.push_back(encoded_id[i]);
    }
  }
  if (id != model_.served_name) {
    return SendError(
        responder, metrics_,
        WithParam(absl::NotFoundError(absl::StrCat("The model `", id, "` does not exist.")),
                  "model"),
        headers);
  }
  SendJson(responder, 200, ModelJson(), headers);
}

}  // namespace tandem::router
