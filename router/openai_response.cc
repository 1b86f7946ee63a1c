#include "router/openai_response.h"

#include <algorithm>

#include "router/api_error.h"

namespace tandem::router {
namespace {

using nlohmann::json;

const char* ObjectName(const ResponseMeta& meta, bool chunk) {
  if (meta.kind == ApiKind::kChat) return chunk ? "chat.completion.chunk" : "chat.completion";
  return "text_completion";
}

json Envelope(const ResponseMeta& meta, bool chunk) {
  json out = {{"id", meta.id},
              {"object", ObjectName(meta, chunk)},
              {"created", meta.created},
              {"model", meta.model}};
  if (chunk && meta.include_usage) out["usage"] = nullptr;
  return out;
}

json Choice(const ResponseMeta& meta, int index, const json& delta_or_text, const json& logprobs,
            const json& finish_reason) {
  json choice = {{"index", index}, {"logprobs", logprobs}, {"finish_reason", finish_reason}};
  if (meta.kind == ApiKind::kChat) {
    choice["delta"] = delta_or_text;
  } else {
    choice["text"] = delta_or_text;
  }
  return choice;
}

json Bytes(const std::string& token) {
  json bytes = json::array();
  for (unsigned char c : token) bytes.push_back(static_cast<int>(c));
  return bytes;
}

}  // namespace

json ErrorBody(const absl::Status& status, int http_status) {
  const std::string param = ParamOf(status);
  return {{"error",
           {{"message", std::string(status.message())},
            {"type", ErrorTypeFor(http_status)},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", http_status}}}};
}

std::string Dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string SseEvent(const json& value) { return "data: " + Dump(value) + "\n\n"; }

json FinishReasonJson(tandem::v1::FinishReason reason) {
  switch (reason) {
    case tandem::v1::FINISH_REASON_STOP:
      return "stop";
    case tandem::v1::FINISH_REASON_LENGTH:
      return "length";
    case tandem::v1::FINISH_REASON_ABORT:
      return "abort";
    case tandem::v1::FINISH_REASON_ERROR:
      return "error";
    default:
      return nullptr;
  }
}

json StopReasonJson(const FinishInfo& info) {
  if (!info.stop_string.empty()) return info.stop_string;
  if (info.stop_token_id) return *info.stop_token_id;
  return nullptr;
}

json UsageJson(const UsageCounts& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

json CompletionLogprobsJson(const std::vector<TokenLogprobInfo>& tokens, int64_t* text_offset) {
  json out = {{"tokens", json::array()},
              {"token_logprobs", json::array()},
              {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
  for (const TokenLogprobInfo& t : tokens) {
    out["tokens"].push_back(t.sampled.token);
    out["token_logprobs"].push_back(t.sampled.logprob);
    json top = json::object();
    for (const TokenLogprob& alt : t.top) {
      if (!top.contains(alt.token)) top[alt.token] = alt.logprob;
    }
    if (!top.contains(t.sampled.token)) top[t.sampled.token] = t.sampled.logprob;
    out["top_logprobs"].push_back(std::move(top));
    out["text_offset"].push_back(*text_offset);
    *text_offset += static_cast<int64_t>(t.sampled.token.size());
  }
  return out;
}

json EchoLogprobsJson(const std::string& first_token, const std::vector<TokenLogprobInfo>& prompt,
                      int top, int64_t* text_offset) {
  std::vector<TokenLogprobInfo> shown = prompt;
  for (TokenLogprobInfo& t : shown) {
    if (t.top.size() > static_cast<size_t>(top)) t.top.resize(top);
  }
  *text_offset = static_cast<int64_t>(first_token.size());
  json out = CompletionLogprobsJson(shown, text_offset);
  out["tokens"].insert(out["tokens"].begin(), first_token);
  out["token_logprobs"].insert(out["token_logprobs"].begin(), nullptr);
  out["top_logprobs"].insert(out["top_logprobs"].begin(), nullptr);
  out["text_offset"].insert(out["text_offset"].begin(), 0);
  return out;
}

void AppendCompletionLogprobs(json& into, const json& more) {
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
    for (const json& v : more[key]) into[key].push_back(v);
  }
}

json PromptLogprobsJson(const std::vector<TokenLogprobInfo>& prompt, int top) {
  json out = json::array({nullptr});
  for (const TokenLogprobInfo& t : prompt) {
    json position = json::object();
    json rank = nullptr;
    for (size_t k = 0; k < t.top.size(); ++k) {
      if (t.top[k].id == t.sampled.id) {
        rank = static_cast<int>(k) + 1;
        break;
      }
    }
    // The prompt token first, then the alternatives (vLLM's order).
    position[std::to_string(t.sampled.id)] = {
        {"logprob", t.sampled.logprob}, {"rank", rank}, {"decoded_token", t.sampled.token}};
    for (size_t k = 0; k < t.top.size() && k < static_cast<size_t>(top); ++k) {
      const std::string key = std::to_string(t.top[k].id);
      if (position.contains(key)) continue;
      position[key] = {{"logprob", t.top[k].logprob},
                       {"rank", static_cast<int>(k) + 1},
                       {"decoded_token", t.top[k].token}};
    }
    out.push_back(std::move(position));
  }
  return out;
}

json ChatLogprobsJson(const std::vector<TokenLogprobInfo>& tokens) {
  json content = json::array();
  for (const TokenLogprobInfo& t : tokens) {
    json top = json::array();
    for (const TokenLogprob& alt : t.top) {
      top.push_back({{"token", alt.token}, {"logprob", alt.logprob}, {"bytes", Bytes(alt.token)}});
    }
    content.push_back({{"token", t.sampled.token},
                       {"logprob", t.sampled.logprob},
                       {"bytes", Bytes(t.sampled.token)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}};
}

json DeltaChunk(const ResponseMeta& meta, int index, const std::string& text, bool with_role,
                const json& logprobs) {
  json out = Envelope(meta, /*chunk=*/true);
  json body = text;
  if (meta.kind == ApiKind::kChat) {
    body = {{"content", text}};
    if (with_role) body["role"] = "assistant";
  }
  out["choices"] = json::array({Choice(meta, index, body, logprobs, nullptr)});
  return out;
}

json FinishChunk(const ResponseMeta& meta, int index, const FinishInfo& info) {
  json out = Envelope(meta, /*chunk=*/true);
  json body = meta.kind == ApiKind::kChat ? json::object() : json("");
  json choice = Choice(meta, index, body, nullptr, FinishReasonJson(info.reason));
  choice["stop_reason"] = StopReasonJson(info);
  out["choices"] = json::array({std::move(choice)});
  return out;
}

json TimingsJson(const tandem::v1::PhaseTimings& t) {
  return {{"queue_s", t.queue_s()},
          {"prefill_queue_s", t.prefill_queue_s()},
          {"prefill_s", t.prefill_s()},
          {"kv_transfer_s", t.kv_transfer_s()},
          {"kv_transfer_bytes", t.kv_transfer_bytes()},
          {"first_decode_step_s", t.first_decode_step_s()},
          {"ttft_s", t.ttft_s()},
          {"e2e_s", t.e2e_s()}};
}

json UsageChunk(const ResponseMeta& meta, const UsageCounts& usage,
                const tandem::v1::PhaseTimings& timings) {
  json out = Envelope(meta, /*chunk=*/true);
  out["choices"] = json::array();
  out["usage"] = UsageJson(usage);
  out["timings"] = TimingsJson(timings);  // tandem extension: the server's TTFT phases
  return out;
}

json FullResponse(const ResponseMeta& meta, const std::vector<ChoiceResult>& choices,
                  const UsageCounts& usage, const tandem::v1::PhaseTimings& timings) {
  json out = Envelope(meta, /*chunk=*/false);
  out["choices"] = json::array();
  for (const ChoiceResult& c : choices) {
    json choice = {{"index", c.index},
                   {"logprobs", nullptr},
                   {"finish_reason", FinishReasonJson(c.info.reason)},
                   {"stop_reason", StopReasonJson(c.info)}};
    if (meta.kind == ApiKind::kChat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
      if (meta.logprobs) choice["logprobs"] = ChatLogprobsJson(c.logprobs);
    } else {
      choice["text"] = c.text;
      if (meta.logprobs) {
        int64_t offset = c.first_text_offset;
        json all = json::object();
        if (meta.echo_logprobs) {
          all =
              EchoLogprobsJson(c.first_prompt_token, c.prompt_logprobs, meta.num_logprobs, &offset);
        }
        json generated = CompletionLogprobsJson(c.logprobs, &offset);
        if (meta.echo_logprobs) {
          AppendCompletionLogprobs(all, generated);
          generated = std::move(all);
        }
        choice["logprobs"] = std::move(generated);
      }
      // vLLM's CompletionResponseChoice.prompt_logprobs: per choice.
      if (meta.prompt_logprobs >= 0) {
        choice["prompt_logprobs"] = PromptLogprobsJson(c.prompt_logprobs, meta.prompt_logprobs);
      }
    }
    out["choices"].push_back(std::move(choice));
  }
  // vLLM's ChatCompletionResponse.prompt_logprobs: once for the response (one prompt).
  if (meta.kind == ApiKind::kChat && meta.prompt_logprobs >= 0) {
    out["prompt_logprobs"] = PromptLogprobsJson(
        choices.empty() ? std::vector<TokenLogprobInfo>{} : choices[0].prompt_logprobs,
        meta.prompt_logprobs);
  }
  out["usage"] = UsageJson(usage);
  out["timings"] = TimingsJson(timings);
  return out;
}

}  // namespace tandem::router
