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

enum class Value { kAbsent, kNull, kEmptyString, kOther };

Value Classify(std::string_view p, size_t v) {
  if (p[v] == 'n') return Value::kNull;
  if (p[v] == '"' && v + 1 < p.size() && p[v + 1] == '"') return Value::kEmptyString;
  return Value::kOther;
}

// The first value of each key the fast path looks at.
struct KeyValues {
  Value text = Value::kAbsent, content = Value::kAbsent, reasoning = Value::kAbsent;
  Value role = Value::kAbsent, finish = Value::kAbsent;
  bool choices_empty = false, has_choices = false;
};

// Records the value at `v` of `key`; returns false if the payload needs the full parser.
bool NoteKey(std::string_view key, std::string_view p, size_t v, KeyValues* kv) {
  auto first = [&](Value* slot) {
    if (*slot == Value::kAbsent) *slot = Classify(p, v);
  };
  if (key == "error" || key == "timings" || key == "server_timing") return false;
  if (key == "usage" || key == "logprobs") return Classify(p, v) == Value::kNull;
  if (key == "object") return p.substr(v, 7) != "\"error\"";
  if (key == "choices" && !kv->has_choices) {
    if (p[v] != '[') return false;
    size_t next = p.find_first_not_of(" \t\r\n", v + 1);
    kv->has_choices = true;
    kv->choices_empty = next != std::string_view::npos && p[next] == ']';
  } else if (key == "text") {
    first(&kv->text);
  } else if (key == "content") {
    first(&kv->content);
  } else if (key == "reasoning_content") {
    first(&kv->reasoning);
  } else if (key == "role") {
    first(&kv->role);
  } else if (key == "finish_reason") {
    first(&kv->finish);
  }
  return true;
}

// The common token chunk without building a JSON tree (the loadgen's hottest path): one pass
// that walks the strings of the payload (escapes skipped, so text never looks like a key).
// Returns false when the payload needs the full parser: usage, errors, timings, logprobs.
bool FastTokenCheck(std::string_view p, bool* is_token) {
  if (p.empty() || p[0] != '{') return false;
  KeyValues kv;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] != '"') continue;
    size_t j = i + 1;
    while (j < p.size() && p[j] != '"') j += p[j] == '\\' ? 2 : 1;
    if (j >= p.size()) return false;
    size_t k = j + 1;
    while (k < p.size() && (p[k] == ' ' || p[k] == '\t')) ++k;
    if (k < p.size() && p[k] == ':') {
      size_t v = k + 1;
      while (v < p.size() && (p[v] == ' ' || p[v] == '\t')) ++v;
      if (v >= p.size() || !NoteKey(p.substr(i + 1, j - i - 1), p, v, &kv)) return false;
    }
    i = j;
  }
  if (!kv.has_choices) return false;
  *is_token = false;
  if (kv.choices_empty) return true;
  bool finished = kv.finish == Value::kOther;
  if (kv.text != Value::kAbsent) {
    *is_token = !(finished && kv.text != Value::kOther);
    return true;
  }
  for (Value v : {kv.content, kv.reasoning}) {
    if (v == Value::kAbsent || v == Value::kNull) continue;
    if (v == Value::kEmptyString && (finished || kv.role != Value::kAbsent)) continue;
    *is_token = true;
  }
  return true;
}

}  // namespace

ChunkInfo ParseChunk(std::string_view payload, bool want_text) {
  ChunkInfo info;
  if (payload == "[DONE]") {
    info.done = true;
    return info;
  }
  if (!want_text && FastTokenCheck(payload, &info.is_token)) return info;
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
