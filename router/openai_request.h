// Parsing and validation of OpenAI-style request bodies into GenerateSpec: a pure module (no I/O,
// no threads). Every rejection is an absl::Status the front end maps to the OpenAI error envelope
// (api_error.h): malformed JSON, invalid UTF-8, wrong types and missing fields → 400 naming the
// field; unknown model → 404; out-of-range sampling options, unsupported features (tools,
// response_format other than text, suffix, ...: sampling_options.h) and
// prompts or max_tokens beyond the context → 400 with vLLM's wording ("This model's maximum
// context length is N tokens..."). Fields neither OpenAI nor vLLM define are ignored (clients
// send extension fields through `extra_body`).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"
#include "router/generate_spec.h"
#include "tokenizer/tokenizer.h"

namespace tandem::router {

// Formats chat messages into prompt text (the model's chat template, generation prompt added).
using ChatFormatter =
    std::function<absl::StatusOr<std::string>(const std::vector<ChatMessage>& messages)>;

// What validation needs to know about the served model.
struct ModelContext {
  std::string served_name;
  int max_model_len = 0;
  int vocab_size = 0;                    // token ids in prompts must be below it
  const Tokenizer* tokenizer = nullptr;  // not owned; must outlive the parse calls
  ChatFormatter chat_formatter;
};

// Bodies longer than this many characters per context token are rejected before tokenizing
// (cheap guard against huge prompts; no tokenizer emits fewer than one token per 32 bytes).
inline constexpr int kMaxPromptCharsPerToken = 32;
// OpenAI's max_tokens default for completions (chat defaults to the rest of the context).
inline constexpr int kDefaultCompletionMaxTokens = 16;

// POST /v1/completions body → spec (request_id left empty).
absl::StatusOr<GenerateSpec> ParseCompletionRequest(std::string_view body,
                                                    const ModelContext& model);
// POST /v1/chat/completions body → spec (request_id left empty).
absl::StatusOr<GenerateSpec> ParseChatRequest(std::string_view body, const ModelContext& model);

// Parses `body` as a JSON object: InvalidArgument for invalid UTF-8, malformed JSON or a
// non-object top level.
absl::StatusOr<nlohmann::json> ParseJsonObject(std::string_view body);
// Checks "model" (absent or null means the served model): NotFound for another name.
absl::Status CheckModel(const nlohmann::json& request, const ModelContext& model);
// Chat "messages" → ChatMessage list (content as a string or a list of text parts), then
// ValidateChatMessages.
absl::StatusOr<std::vector<ChatMessage>> ParseMessages(const nlohmann::json& request);
// The checks both front ends (HTTP and gRPC) apply to chat messages: non-empty, roles system /
// user / assistant ("developer" becomes "system"), UTF-8 content.
absl::Status ValidateChatMessages(std::vector<ChatMessage>* messages);
// Rejects a prompt of more than kMaxPromptCharsPerToken characters per context token.
absl::Status CheckPromptChars(const ModelContext& model, size_t chars);

// Checks the prompt length against the context and sets spec->sampling.max_tokens from
// `max_tokens` (unset: default_max_tokens, or the rest of the context when that is < 0).
absl::Status ResolveMaxTokens(const ModelContext& model, std::optional<int64_t> max_tokens,
                              int default_max_tokens, GenerateSpec* spec);
// Reads the sampling options of `request`, then ResolveMaxTokens and ValidateSampling.
absl::Status CheckContextLength(const ModelContext& model, int default_max_tokens,
                                const nlohmann::json& request, GenerateSpec* spec);

// True if `text` is well-formed UTF-8 (no overlongs, surrogates or code points > U+10FFFF).
bool IsValidUtf8(std::string_view text);

}  // namespace tandem::router
