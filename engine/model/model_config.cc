// ModelConfig parsing: Hugging Face config.json (transformers 4.x field names, and the 5.x
// "rope_parameters" / "dtype" spellings) and generation_config.json.
#include "engine/model/model_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using json = nlohmann::json;

constexpr double kPi = 3.14159265358979323846;

absl::Status BadField(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: field \"", field, "\" ", why));
}

// Reads an optional integer field; absent or null leaves *out unchanged.
absl::Status ReadInt(const json& j, const char* field, int* out, bool required, int min_value) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) {
    return required ? BadField(field, "is missing") : absl::OkStatus();
  }
  if (!it->is_number_integer()) return BadField(field, "must be an integer");
  const int64_t v = it->get<int64_t>();
  if (v < min_value || v > (int64_t{1} << 31) - 1) {
    return BadField(field, absl::StrCat("out of range: ", v));
  }
  *out = static_cast<int>(v);
  return absl::OkStatus();
}

absl::Status ReadFloat(const json& j, const char* field, float* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) return BadField(field, "must be a number");
  const double v = it->get<double>();
  if (!std::isfinite(v) || v <= 0) return BadField(field, absl::StrCat("must be > 0, got ", v));
  *out = static_cast<float>(v);
  return absl::OkStatus();
}

absl::Status ReadBool(const json& j, const char* field, bool* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) return BadField(field, "must be true or false");
  *out = it->get<bool>();
  return absl::OkStatus();
}

// "eos_token_id": an int, a list of ints, or null. Appends ids not already present.
absl::Status ReadTokenIds(const json& j, const char* field, std::vector<int>* ids) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  std::vector<json> items = it->is_array() ? it->get<std::vector<json>>() : std::vector<json>{*it};
  for (const json& item : items) {
    if (!item.is_number_integer() || item.get<int64_t>() < 0) {
      return BadField(field, "must be a non-negative integer or a list of them");
    }
    const int id = static_cast<int>(item.get<int64_t>());
    if (std::find(ids->begin(), ids->end(), id) == ids->end()) ids->push_back(id);
  }
  return absl::OkStatus();
}

absl::Status ReadArchitecture(const json& j, ModelConfig* c) {
  auto it = j.find("model_type");
  if (it == j.end() || !it->is_string()) {
    return BadField("model_type", "is missing or not a string");
  }
  c->model_type = it->get<std::string>();
  if (c->model_type == "llama") {
    c->architecture = Architecture::kLlama;
  } else if (c->model_type == "mistral") {
    c->architecture = Architecture::kMistral;
  } else if (c->model_type == "qwen2") {
    c->architecture = Architecture::kQwen2;
    c->qkv_bias = true;
  } else if (c->model_type == "qwen3") {
    c->architecture = Architecture::kQwen3;
    c->qk_norm = true;
  } else {
    std::string archs;
    if (auto a = j.find("architectures"); a != j.end()) archs = " (" + a->dump() + ")";
    return absl::UnimplementedError(absl::StrCat("unsupported architecture: model_type \"",
                                                 c->model_type, "\"", archs,
                                                 "; supported: llama, mistral, qwen2, qwen3"));
  }
  return absl::OkStatus();
}

absl::Status ReadDType(const json& j, ModelConfig* c) {
  for (const char* field : {"dtype", "torch_dtype"}) {
    auto it = j.find(field);
    if (it == j.end() || it->is_null()) continue;
    const std::string s = it->is_string() ? it->get<std::string>() : "";
    if (s == "bfloat16") {
      c->dtype = DType::kBF16;
    } else if (s == "float16") {
      c->dtype = DType::kF16;
    } else if (s == "float32") {
      c->dtype = DType::kF32;
    } else {
      return BadField(field, absl::StrCat("unsupported: ", it->dump()));
    }
    return absl::OkStatus();
  }
  return absl::OkStatus();
}

// rope_scaling (4.x) or rope_parameters (5.x, which also carries rope_theta).
absl::Status ReadRope(const json& j, ModelConfig* c) {
  RETURN_IF_ERROR(ReadFloat(j, "rope_theta", &c->rope_theta));
  const char* field = "rope_scaling";
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) {
    field = "rope_parameters";
    it = j.find(field);
  }
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  const json& r = *it;
  if (!r.is_object()) return BadField(field, "must be an object");
  RETURN_IF_ERROR(ReadFloat(r, "rope_theta", &c->rope_theta));
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    if (auto t = r.find(key); t != r.end() && t->is_string()) {
      type = t->get<std::string>();
      break;
    }
  }
  RopeScaling& s = c->rope_scaling;
  if (type == "default") {
    s.type = RopeScaling::Type::kNone;
    return absl::OkStatus();
  }
  if (type != "linear" && type != "llama3") {
    return absl::UnimplementedError(
        absl::StrCat("config.json: ", field, " type \"", type, "\" is not supported"));
  }
  s.type = type == "linear" ? RopeScaling::Type::kLinear : RopeScaling::Type::kLlama3;
  if (!r.contains("factor")) return BadField(field, "has no \"factor\"");
  RETURN_IF_ERROR(ReadFloat(r, "factor", &s.factor));
  if (s.type == RopeScaling::Type::kLlama3) {
    RETURN_IF_ERROR(ReadFloat(r, "low_freq_factor", &s.low_freq_factor));
    RETURN_IF_ERROR(ReadFloat(r, "high_freq_factor", &s.high_freq_factor));
    RETURN_IF_ERROR(ReadInt(r, "original_max_position_embeddings",
                            &s.original_max_position_embeddings, false, 1));
    if (s.high_freq_factor <= s.low_freq_factor) {
      return BadField(field, "needs high_freq_factor > low_freq_factor");
    }
  }
  return absl::OkStatus();
}

// Features of these families that the kernels do not implement are refused, not ignored.
absl::Status CheckUnsupported(const json& j, ModelConfig* c) {
  bool attention_bias = false, mlp_bias = false;
  RETURN_IF_ERROR(ReadBool(j, "attention_bias", &attention_bias));
  RETURN_IF_ERROR(ReadBool(j, "mlp_bias", &mlp_bias));
  if (attention_bias && c->architecture != Architecture::kQwen2) {
    return absl::UnimplementedError("config.json: attention_bias = true is not supported");
  }
  if (mlp_bias) return absl::UnimplementedError("config.json: mlp_bias = true is not supported");
  if (auto a = j.find("hidden_act"); a != j.end() && a->is_string() && *a != "silu") {
    return absl::UnimplementedError(absl::StrCat("config.json: hidden_act ", a->dump()));
  }
  // Sliding-window attention is not implemented: attention is exact up to the window, so the
  // usable context is clamped to it.
  bool use_sliding_window = c->architecture == Architecture::kMistral;
  RETURN_IF_ERROR(ReadBool(j, "use_sliding_window", &use_sliding_window));
  int window = 0;
  RETURN_IF_ERROR(ReadInt(j, "sliding_window", &window, false, 1));
  if (use_sliding_window && window > 0 && window < c->max_position_embeddings) {
    LOG(WARNING) << "sliding_window " << window << " < max_position_embeddings "
                 << c->max_position_embeddings << ": context clamped to " << window;
    c->max_position_embeddings = window;
  }
  return absl::OkStatus();
}

absl::Status ReadShape(const json& j, ModelConfig* c) {
  RETURN_IF_ERROR(ReadInt(j, "vocab_size", &c->vocab_size, true, 1));
  RETURN_IF_ERROR(ReadInt(j, "hidden_size", &c->hidden_size, true, 1));
  RETURN_IF_ERROR(ReadInt(j, "intermediate_size", &c->intermediate_size, true, 1));
  RETURN_IF_ERROR(ReadInt(j, "num_hidden_layers", &c->num_layers, true, 1));
  RETURN_IF_ERROR(ReadInt(j, "num_attention_heads", &c->num_q_heads, true, 1));
  c->num_kv_heads = c->num_q_heads;
  RETURN_IF_ERROR(ReadInt(j, "num_key_value_heads", &c->num_kv_heads, false, 1));
  if (c->num_q_heads % c->num_kv_heads != 0) {
    return BadField("num_key_value_heads",
                    absl::StrCat("(", c->num_kv_heads, ") must divide num_attention_heads (",
                                 c->num_q_heads, ")"));
  }
  if (c->hidden_size % c->num_q_heads != 0 && !j.contains("head_dim")) {
    return BadField("hidden_size", "is not a multiple of num_attention_heads");
  }
  c->head_dim = c->hidden_size / c->num_q_heads;
  RETURN_IF_ERROR(ReadInt(j, "head_dim", &c->head_dim, false, 2));
  if (c->head_dim % 2 != 0) return BadField("head_dim", "must be even (rotary embedding)");
  c->max_position_embeddings = 2048;
  RETURN_IF_ERROR(ReadInt(j, "max_position_embeddings", &c->max_position_embeddings, false, 1));
  RETURN_IF_ERROR(ReadFloat(j, "rms_norm_eps", &c->rms_norm_eps));
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfig::FromJson(const std::string& json_text) {
  const json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("config.json: not a JSON object");
  }
  ModelConfig c;
  RETURN_IF_ERROR(ReadArchitecture(j, &c));
  RETURN_IF_ERROR(ReadShape(j, &c));
  RETURN_IF_ERROR(ReadRope(j, &c));
  RETURN_IF_ERROR(CheckUnsupported(j, &c));
  RETURN_IF_ERROR(ReadBool(j, "tie_word_embeddings", &c.tie_word_embeddings));
  RETURN_IF_ERROR(ReadDType(j, &c));
  RETURN_IF_ERROR(ReadTokenIds(j, "eos_token_id", &c.eos_token_ids));
  std::vector<int> bos;
  RETURN_IF_ERROR(ReadTokenIds(j, "bos_token_id", &bos));
  if (!bos.empty()) c.bos_token_id = bos[0];
  return c;
}

absl::StatusOr<ModelConfig> ModelConfig::Load(const std::string& dir) {
  absl::StatusOr<std::string> text = ReadFile(dir + "/config.json");
  if (!text.ok()) return absl::NotFoundError(absl::StrCat("no config.json in ", dir));
  absl::StatusOr<ModelConfig> config = FromJson(*text);
  if (!config.ok()) {
    return absl::Status(config.status().code(), absl::StrCat(dir, "/", config.status().message()));
  }
  // generation_config.json's EOS ids (e.g. Llama 3 instruct's <|eot_id|>) extend config.json's.
  absl::StatusOr<std::string> gen = ReadFile(dir + "/generation_config.json");
  if (gen.ok()) {
    const json g = json::parse(*gen, nullptr, false);
    if (g.is_discarded() || !g.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir, "/generation_config.json: not a JSON object"));
    }
    absl::Status s = ReadTokenIds(g, "eos_token_id", &config->eos_token_ids);
    if (!s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(dir,
                                                     "/generation_config.json: eos_token_id "
                                                     "must be an integer or a list"));
    }
  }
  return config;
}

// HF semantics (transformers modeling_rope_utils): inv_freq[i] = theta^(-2i/d), then linear
// divides every frequency by factor; llama3 divides low frequencies (wavelength above
// original_ctx / low_freq_factor) by factor, keeps high ones (wavelength below
// original_ctx / high_freq_factor) and interpolates smoothly in between.
std::vector<float> ModelConfig::RopeInvFreq() const {
  const int half = head_dim / 2;
  std::vector<float> inv(half);
  const RopeScaling& s = rope_scaling;
  for (int i = 0; i < half; ++i) {
    // Rounded through float as PyTorch computes it in fp32.
    const float base = static_cast<float>(
        std::pow(static_cast<double>(rope_theta), static_cast<double>(2 * i) / head_dim));
    float f = 1.0f / base;
    if (s.type == RopeScaling::Type::kLinear) {
      f = f / s.factor;
    } else if (s.type == RopeScaling::Type::kLlama3) {
      const double old_ctx = s.original_max_position_embeddings;
      const double low_wavelen = old_ctx / s.low_freq_factor;
      const double high_wavelen = old_ctx / s.high_freq_factor;
      const double wavelen = 2.0 * kPi / f;
      if (wavelen > low_wavelen) {
        f = f / s.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth =
            (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = static_cast<float>((1.0 - smooth) * f / s.factor + smooth * f);
      }
    }
    inv[i] = f;
  }
  return inv;
}

}  // namespace tandem
