// Parsing config.json's "quantization_config" (quant_config.h says which formats and fields).
#include "engine/model/quant_config.h"

#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using json = nlohmann::json;

absl::Status Bad(const std::string& field, const std::string& why) {
  return absl::InvalidArgumentError(
      absl::StrCat("config.json: quantization_config.", field, " ", why));
}
absl::Status Unsupported(const std::string& field, const std::string& why) {
  return absl::UnimplementedError(
      absl::StrCat("config.json: quantization_config.", field, " ", why));
}

const json* Find(const json& j, const char* field) {
  auto it = j.find(field);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

absl::StatusOr<std::string> String(const json& j, const char* field, const std::string& dflt) {
  const json* v = Find(j, field);
  if (v == nullptr) return dflt;
  if (!v->is_string()) return Bad(field, "must be a string");
  return v->get<std::string>();
}

absl::StatusOr<int64_t> Int(const json& j, const char* field, std::optional<int64_t> dflt) {
  const json* v = Find(j, field);
  if (v == nullptr) {
    if (dflt) return *dflt;
    return Bad(field, "is missing");
  }
  if (!v->is_number_integer()) return Bad(field, "must be an integer");
  return v->get<int64_t>();
}

absl::StatusOr<bool> Bool(const json& j, const char* field, bool dflt) {
  const json* v = Find(j, field);
  if (v == nullptr) return dflt;
  if (!v->is_boolean()) return Bad(field, "must be true or false");
  return v->get<bool>();
}

// Lists of modules left unquantized: only the lm_head (never quantized here anyway) may be named.
absl::Status CheckOnlyLmHead(const json& q, const char* field) {
  const json* v = Find(q, field);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_array()) return Bad(field, "must be a list of module names");
  for (const json& name : *v) {
    if (!name.is_string()) return Bad(field, "must be a list of module names");
    const std::string s = name.get<std::string>();
    if (s != "lm_head" && s != "re:.*lm_head" && s != "re:lm_head") {
      return Unsupported(field, absl::StrCat("leaves \"", s, "\" unquantized; only lm_head may be",
                                             " (per-layer exceptions are not supported)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ReadFp8(const json& q, QuantConfig* c) {
  ASSIGN_OR_RETURN(std::string fmt, String(q, "fmt", "e4m3"));
  if (fmt != "e4m3") return Unsupported("fmt", absl::StrCat("\"", fmt, "\" (only e4m3)"));
  ASSIGN_OR_RETURN(std::string act, String(q, "activation_scheme", "dynamic"));
  if (act != "dynamic") {
    return Unsupported("activation_scheme",
                       absl::StrCat("\"", act, "\": only dynamic activation scales are supported"));
  }
  RETURN_IF_ERROR(CheckOnlyLmHead(q, "modules_to_not_convert"));
  RETURN_IF_ERROR(CheckOnlyLmHead(q, "ignored_layers"));
  const json* block = Find(q, "weight_block_size");
  if (block == nullptr) {
    c->format = QuantConfig::Format::kFp8PerTensor;
    c->act_quant = ActQuant::kFp8PerToken;
    return absl::OkStatus();
  }
  if (!block->is_array() || block->size() != 2 || !(*block)[0].is_number_integer() ||
      !(*block)[1].is_number_integer() || (*block)[0].get<int64_t>() < 1 ||
      (*block)[1].get<int64_t>() < 1) {
    return Bad("weight_block_size", absl::StrCat("must be [rows, cols] > 0, got ", block->dump()));
  }
  c->format = QuantConfig::Format::kFp8Block;
  c->block_n = (*block)[0].get<int64_t>();
  c->block_k = (*block)[1].get<int64_t>();
  // Activations: one dynamic scale per token and block_k columns (as the block GEMM consumes).
  c->act_quant = ActQuant::kFp8PerTokenGroup;
  c->act_group_size = c->block_k;
  return absl::OkStatus();
}

absl::Status ReadCompressedTensors(const json& q, QuantConfig* c) {
  ASSIGN_OR_RETURN(std::string format, String(q, "format", ""));
  ASSIGN_OR_RETURN(std::string status, String(q, "quantization_status", "compressed"));
  if (status != "compressed") {
    return Unsupported("quantization_status",
                       absl::StrCat("\"", status, "\": only compressed checkpoints are read"));
  }
  RETURN_IF_ERROR(CheckOnlyLmHead(q, "ignore"));
  if (Find(q, "kv_cache_scheme") != nullptr) {
    return Unsupported("kv_cache_scheme", "is set: quantized KV caches are not supported");
  }
  const json* groups = Find(q, "config_groups");
  if (groups == nullptr || !groups->is_object() || groups->size() != 1) {
    return Unsupported("config_groups", "must hold exactly one scheme");
  }
  const json& g = groups->begin().value();
  const std::string gname = "config_groups." + groups->begin().key() + ".";
  const json* targets = Find(g, "targets");
  if (targets == nullptr || *targets != json::array({"Linear"})) {
    return Unsupported(gname + "targets", "must be [\"Linear\"]");
  }
  if (Find(g, "output_activations") != nullptr) {
    return Unsupported(gname + "output_activations", "is set: not supported");
  }
  const json* w = Find(g, "weights");
  if (w == nullptr || !w->is_object()) return Bad(gname + "weights", "is missing");
  ASSIGN_OR_RETURN(int64_t bits, Int(*w, "num_bits", std::nullopt));
  ASSIGN_OR_RETURN(std::string type, String(*w, "type", "int"));
  ASSIGN_OR_RETURN(std::string strategy, String(*w, "strategy", ""));
  ASSIGN_OR_RETURN(bool symmetric, Bool(*w, "symmetric", true));
  ASSIGN_OR_RETURN(bool dynamic, Bool(*w, "dynamic", false));
  if (bits != 8) return Unsupported(gname + "weights.num_bits", absl::StrCat(bits, " (only 8)"));
  if (!symmetric) return Unsupported(gname + "weights.symmetric", "false (only symmetric)");
  if (dynamic) return Unsupported(gname + "weights.dynamic", "true");
  if (strategy != "channel" && strategy != "tensor") {
    return Unsupported(gname + "weights.strategy",
                       absl::StrCat("\"", strategy, "\" (only channel or tensor)"));
  }
  if (Find(*w, "group_size") != nullptr || Find(*w, "block_structure") != nullptr ||
      Find(*w, "actorder") != nullptr) {
    return Unsupported(gname + "weights",
                       "group_size / block_structure / actorder are not supported");
  }
  if (type == "float" && format == "float-quantized") {
    c->format = QuantConfig::Format::kCompressedFp8;
  } else if (type == "int" && format == "int-quantized") {
    c->format = QuantConfig::Format::kCompressedInt8;
  } else {
    return Unsupported("format", absl::StrCat("\"", format, "\" with ", type,
                                              " weights (supported: float-quantized with float, ",
                                              "int-quantized with int)"));
  }
  c->per_tensor = strategy == "tensor";
  const json* in = Find(g, "input_activations");
  if (in == nullptr) return absl::OkStatus();  // weight-only
  ASSIGN_OR_RETURN(int64_t in_bits, Int(*in, "num_bits", std::nullopt));
  ASSIGN_OR_RETURN(std::string in_type, String(*in, "type", "int"));
  ASSIGN_OR_RETURN(std::string in_strategy, String(*in, "strategy", ""));
  ASSIGN_OR_RETURN(bool in_dynamic, Bool(*in, "dynamic", false));
  ASSIGN_OR_RETURN(bool in_symmetric, Bool(*in, "symmetric", true));
  if (in_bits != 8 || in_type != "float" || in_strategy != "token" || !in_dynamic ||
      !in_symmetric) {
    return Unsupported(gname + "input_activations",
                       absl::StrCat(in->dump(), ": only dynamic symmetric FP8 per token"));
  }
  c->act_quant = ActQuant::kFp8PerToken;
  return absl::OkStatus();
}

absl::Status ReadInt4(const json& q, QuantConfig* c, bool awq) {
  ASSIGN_OR_RETURN(int64_t bits, Int(q, awq ? "w_bit" : "bits", int64_t{0}));
  if (bits == 0) {
    ASSIGN_OR_RETURN(bits, Int(q, "bits", std::nullopt));
  }
  if (bits != 4) return Unsupported("bits", absl::StrCat(bits, " (only 4)"));
  ASSIGN_OR_RETURN(c->group_size, Int(q, awq ? "q_group_size" : "group_size", int64_t{0}));
  if (c->group_size == 0) {
    ASSIGN_OR_RETURN(c->group_size, Int(q, "group_size", std::nullopt));
  }
  if (c->group_size < 1 && !(c->group_size == -1 && !awq)) {
    return Bad("group_size",
               absl::StrCat(c->group_size, " (must be >= 1", awq ? "" : " or -1", ")"));
  }
  if (awq) {
    c->format = QuantConfig::Format::kAwq;
    ASSIGN_OR_RETURN(bool zero_point, Bool(q, "zero_point", true));
    if (!zero_point) return Unsupported("zero_point", "false (only AWQ with zero points)");
    ASSIGN_OR_RETURN(std::string version, String(q, "version", "gemm"));
    if (version != "gemm" && version != "GEMM") {
      return Unsupported("version", absl::StrCat("\"", version, "\" (only the gemm layout)"));
    }
    return CheckOnlyLmHead(q, "modules_to_not_convert");
  }
  c->format = QuantConfig::Format::kGptq;
  ASSIGN_OR_RETURN(bool desc_act, Bool(q, "desc_act", false));
  if (desc_act) return Unsupported("desc_act", "true (act-order g_idx is not supported)");
  ASSIGN_OR_RETURN(std::string fmt, String(q, "checkpoint_format", "gptq"));
  if (fmt != "gptq" && fmt != "gptq_v2") {
    return Unsupported("checkpoint_format", absl::StrCat("\"", fmt, "\" (gptq or gptq_v2)"));
  }
  c->gptq_v2 = fmt == "gptq_v2";
  if (const json* dyn = Find(q, "dynamic"); dyn != nullptr && !dyn->empty()) {
    return Unsupported("dynamic", "per-module overrides are not supported");
  }
  return CheckOnlyLmHead(q, "modules_to_not_convert");
}

}  // namespace

bool QuantConfig::load_time() const {
  return format == Format::kLoadTimeFp8 || format == Format::kLoadTimeInt8 ||
         format == Format::kLoadTimeInt4;
}

std::string QuantConfig::Describe() const {
  std::string act;
  if (act_quant == ActQuant::kFp8PerToken) act = ", activations fp8 per token";
  if (act_quant == ActQuant::kFp8PerTokenGroup) {
    act = absl::StrCat(", activations fp8 per token and ", act_group_size, " columns");
  }
  const std::string scale = per_tensor ? "per tensor" : "per channel";
  switch (format) {
    case Format::kNone:
      return "none";
    case Format::kFp8Block:
      return absl::StrCat("fp8 e4m3, ", block_n, "x", block_k, " block scales", act);
    case Format::kFp8PerTensor:
      return absl::StrCat("fp8 e4m3, per-tensor scale", act);
    case Format::kCompressedFp8:
      return absl::StrCat("compressed-tensors fp8 e4m3, ", scale, act);
    case Format::kCompressedInt8:
      return absl::StrCat("compressed-tensors int8, ", scale, act);
    case Format::kAwq:
      return absl::StrCat("awq int4, group ", group_size);
    case Format::kGptq:
      return absl::StrCat("gptq int4, group ", group_size, gptq_v2 ? " (gptq_v2)" : "");
    case Format::kLoadTimeFp8:
      return absl::StrCat("fp8 e4m3 (quantized at load), per channel", act);
    case Format::kLoadTimeInt8:
      return "int8 (quantized at load), per channel";
    case Format::kLoadTimeInt4:
      return absl::StrCat("int4 (quantized at load), group ", group_size);
  }
  return "?";
}

absl::StatusOr<QuantConfig> QuantConfig::FromConfigJson(const std::string& text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("config.json: not a JSON object");
  }
  QuantConfig c;
  const json* q = Find(j, "quantization_config");
  if (q == nullptr) return c;
  if (!q->is_object()) {
    return absl::InvalidArgumentError("config.json: quantization_config must be an object");
  }
  ASSIGN_OR_RETURN(std::string method, String(*q, "quant_method", ""));
  if (method == "fp8") {
    RETURN_IF_ERROR(ReadFp8(*q, &c));
  } else if (method == "compressed-tensors") {
    RETURN_IF_ERROR(ReadCompressedTensors(*q, &c));
  } else if (method == "awq") {
    RETURN_IF_ERROR(ReadInt4(*q, &c, /*awq=*/true));
  } else if (method == "gptq") {
    RETURN_IF_ERROR(ReadInt4(*q, &c, /*awq=*/false));
  } else {
    return Unsupported(
        "quant_method",
        absl::StrCat("\"", method, "\" (supported: fp8, compressed-tensors, awq, ", "gptq)"));
  }
  return c;
}

absl::StatusOr<QuantConfig> QuantConfig::Resolve(const std::string& dir, const std::string& flag) {
  std::ifstream in(dir + "/config.json", std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(dir, "/config.json: cannot open"));
  std::stringstream ss;
  ss << in.rdbuf();
  ASSIGN_OR_RETURN(QuantConfig c, FromConfigJson(ss.str()));
  if (flag.empty()) return c;
  if (c.quantized()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--quantization ", flag, ": ", dir, " is already quantized (", c.Describe(),
                     "); the flag quantizes unquantized checkpoints at load time"));
  }
  if (flag == "fp8") {
    c.format = Format::kLoadTimeFp8;
    c.act_quant = ActQuant::kFp8PerToken;
  } else if (flag == "int8") {
    c.format = Format::kLoadTimeInt8;
  } else if (flag == "int4") {
    c.format = Format::kLoadTimeInt4;
    c.group_size = 128;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--quantization \"", flag, "\": expected fp8, int8 or int4"));
  }
  return c;
}

}  // namespace tandem
