#include "router/openai_response.h"

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

json Choice(const ResponseMeta& meta, const json& delta_or_text, const json& finish_reason) {
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_reason}};
  if (meta.kind == ApiKind::kChat) {
    choice["delta"] = delta_or_text;
  } else {
    choice["text"] = delta_or_text;
  }
  return choice;
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

json UsageJson(const FinishInfo& info) {
  return {{"prompt_tokens", info.prompt_tokens},
          {"completion_tokens", info.completion_tokens},
          {"total_tokens", info.prompt_tokens + info.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", info.cached_tokens}}}};
}

json DeltaChunk(const ResponseMeta& meta, const std::string& text, bool with_role) {
  json out = Envelope(meta, /*chunk=*/true);
  json body = text;
  if (meta.kind == ApiKind::kChat) {
    body = {{"content", text}};
    if (with_role) body["role"] = "assistant";
  }
  out["choices"] = json::array({Choice(meta, body, nullptr)});
  return out;
}

json FinishChunk(const ResponseMeta& meta, tandem::v1::FinishReason reason) {
  json out = Envelope(meta, /*chunk=*/true);
  json body = meta.kind == ApiKind::kChat ? json::object() : json("");
  out["choices"] = json::array({Choice(meta, body, FinishReasonJson(reason))});
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

json UsageChunk(const ResponseMeta& meta, const FinishInfo& info) {
  json out = Envelope(meta, /*chunk=*/true);
  out["choices"] = json::array();
  out["usage"] = UsageJson(info);
  out["timings"] = TimingsJson(info.timings);  // tandem extension: the server's TTFT phases
  return out;
}

json FullResponse(const ResponseMeta& meta, const std::string& text, const FinishInfo& info) {
  json out = Envelope(meta, /*chunk=*/false);
  json choice = {
      {"index", 0}, {"logprobs", nullptr}, {"finish_reason", FinishReasonJson(info.reason)}};
  if (meta.kind == ApiKind::kChat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
    choice["stop_reason"] = nullptr;
  }
  out["choices"] = json::array({choice});
  out["usage"] = UsageJson(info);
  out["timings"] = TimingsJson(info.timings);
  return out;
}

}  // namespace tandem::router
