#include "loadgen/stream_chunk.h"

#include <nlohmann/json.hpp>

namespace tandem::loadgen {
namespace {

using nlohmann::json;

std::optional<double> OptionalMs(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

// The token text of choices[0], or nullopt when the choice carries no token.
std::optional<std::string> ChoiceToken(const json& choice) {
  if (!choice.is_object()) return std::nullopt;
  auto text = choice.find("text");
  if (text != choice.end()) {
    std::string s = text->is_string() ? text->get<std::string>() : std::string();
    auto finish = choice.find("finish_reason");
    bool finished = finish != choice.end() && !finish->is_null();
    if (s.empty() && finished) return std::nullopt;  // bare finish chunk
    return s;
  }
  auto delta = choice.find("delta");
  if (delta == choice.end() || !delta->is_object()) return std::nullopt;
  for (const char* key : {"content", "reasoning_content"}) {
    auto it = delta->find(key);
    if (it == delta->end() || it->is_null()) continue;
    std::string s = it->is_string() ? it->get<std::string>() : std::string();
    auto finish = choice.find("finish_reason");
    bool finished = finish != choice.end() && !finish->is_null();
    if (s.empty() && (finished || delta->contains("role"))) continue;
    return s;
  }
  return std::nullopt;
}

int IntOr(const json& obj, const char* key, int fallback) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_number_integer() ? it->get<int>() : fallback;
}

std::optional<double> Sum(std::optional<double> a, std::optional<double> b) {
  if (!a) return b;
  if (!b) return a;
  return *a + *b;
}

// "timings": tandem.v1.PhaseTimings with proto field names, in seconds (the router's shape);
// "server_timing": the same phases in milliseconds. See loadgen/README.md.
void ReadTimings(const json& j, ChunkInfo* info) {
  ServerTiming t;
  auto proto = j.find("timings");
  if (proto != j.end() && proto->is_object()) {
    auto ms = [&](const char* key) {
      std::optional<double> s = OptionalMs(*proto, key);
      return s ? std::optional<double>(*s * 1e3) : std::nullopt;
    };
    t.queue_ms = Sum(ms("queue_s"), ms("prefill_queue_s"));
    t.prefill_ms = ms("prefill_s");
    t.kv_transfer_ms = ms("kv_transfer_s");
    t.first_decode_ms = ms("first_decode_step_s");
  }
  auto timing = j.find("server_timing");
  if (timing != j.end() && timing->is_object()) {
    t.queue_ms = OptionalMs(*timing, "queue_ms");
    t.prefill_ms = OptionalMs(*timing, "prefill_ms");
    t.kv_transfer_ms = OptionalMs(*timing, "kv_transfer_ms");
    t.first_decode_ms = OptionalMs(*timing, "first_decode_ms");
  }
  if (t.any()) info->server_timing = t;
}

void ReadErrorEvent(const json& j, ChunkInfo* info) {
  auto err = j.find("error");
  if (err != j.end() && !err->is_null()) {
    if (err->is_object() && err->contains("message") && (*err)["message"].is_string()) {
      info->error = (*err)["message"].get<std::string>();
    } else {
      info->error = err->dump();
    }
    return;
  }
  auto object = j.find("object");
  if (object != j.end() && *object == "error") {
    auto message = j.find("message");
    info->error = message != j.end() && message->is_string() ? message->get<std::string>()
                                                             : std::string("error");
  }
}

}  // namespace

ChunkInfo ParseChunk(std::string_view payload, bool want_text) {
  ChunkInfo info;
  if (payload == "[DONE]") {
    info.done = true;
    return info;
  }
  json j = json::parse(payload.begin(), payload.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    info.error = "malformed stream chunk: " + std::string(payload.substr(0, 200));
    return info;
  }
  ReadErrorEvent(j, &info);
  if (info.error) return info;
  auto choices = j.find("choices");
  if (choices != j.end() && choices->is_array() && !choices->empty()) {
    std::optional<std::string> token = ChoiceToken((*choices)[0]);
    if (token) {
      info.is_token = true;
      if (want_text) info.text = std::move(*token);
    }
  }
  auto usage = j.find("usage");
  if (usage != j.end() && usage->is_object()) {
    info.prompt_tokens = IntOr(*usage, "prompt_tokens", -1);
    info.completion_tokens = IntOr(*usage, "completion_tokens", -1);
  }
  ReadTimings(j, &info);
  return info;
}

}  // namespace tandem::loadgen
