#include "engine/model/presets.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using ojson = nlohmann::ordered_json;

// Learned tokenizer vocabulary of the tiny presets (special tokens come on top).
constexpr int kTinyVocab = 1024;

struct Shape {
  int vocab, hidden, intermediate, layers, q_heads, kv_heads, head_dim, max_pos;
};

ModelConfig Make(Architecture arch, const Shape& s, float theta, float eps, DType dtype,
                 bool tied) {
  ModelConfig c;
  c.architecture = arch;
  c.model_type = arch == Architecture::kLlama     ? "llama"
                 : arch == Architecture::kMistral ? "mistral"
                 : arch == Architecture::kQwen2   ? "qwen2"
                                                  : "qwen3";
  c.vocab_size = s.vocab;
  c.hidden_size = s.hidden;
  c.intermediate_size = s.intermediate;
  c.num_layers = s.layers;
  c.num_q_heads = s.q_heads;
  c.num_kv_heads = s.kv_heads;
  c.head_dim = s.head_dim;
  c.max_position_embeddings = s.max_pos;
  c.rope_theta = theta;
  c.rms_norm_eps = eps;
  c.dtype = dtype;
  c.tie_word_embeddings = tied;
  c.qkv_bias = arch == Architecture::kQwen2;
  c.qk_norm = arch == Architecture::kQwen3;
  return c;
}

RopeScaling Llama3Scaling(int original_max_pos) {
  return RopeScaling{RopeScaling::Type::kLlama3, 8.0f, 1.0f, 4.0f, original_max_pos};
}

std::vector<ModelPreset> BuildPresets() {
  using A = Architecture;
  using T = TokenizerFamily;
  const DType bf16 = DType::kBF16;
  std::vector<ModelPreset> p;
  // Tiny: vocab_size 0 is replaced by the generated tokenizer's size. Shapes are deliberately
  // uneven (odd intermediate sizes, head_dim != hidden / heads for Qwen3) to catch shape bugs.
  auto tiny = [&](std::string name, std::string desc, T tok, ModelConfig c) {
    p.push_back(
        {std::move(name), std::move(desc), tok, TokenizerSpec{kTinyVocab, 0}, std::move(c), true});
  };
  tiny("tiny-llama3", "Llama 3 shape, GQA 4:2, untied", T::kLlama3,
       Make(A::kLlama, {0, 64, 176, 2, 4, 2, 16, 2048}, 500000.0f, 1e-5f, bf16, false));
  tiny("tiny-llama3-tied", "Llama 3.2 shape (tied embeddings)", T::kLlama3,
       Make(A::kLlama, {0, 96, 200, 3, 6, 2, 16, 2048}, 500000.0f, 1e-5f, bf16, true));
  ModelConfig l31 =
      Make(A::kLlama, {0, 128, 256, 2, 4, 1, 32, 4096}, 500000.0f, 1e-5f, bf16, false);
  l31.rope_scaling = Llama3Scaling(64);  // small original context: every band is exercised
  tiny("tiny-llama31", "Llama 3.1 shape with llama3 rope scaling", T::kLlama3, l31);
  tiny("tiny-llama2", "Llama 2 shape: MHA, theta 1e4, f16 weights", T::kLlama2,
       Make(A::kLlama, {0, 64, 160, 2, 4, 4, 16, 2048}, 10000.0f, 1e-5f, DType::kF16, false));
  ModelConfig linear =
      Make(A::kLlama, {0, 64, 128, 2, 2, 1, 32, 4096}, 10000.0f, 1e-6f, bf16, false);
  linear.rope_scaling = RopeScaling{RopeScaling::Type::kLinear, 2.0f};
  tiny("tiny-llama2-linear", "Llama 2 shape with linear rope scaling", T::kLlama2, linear);
  tiny("tiny-mistral", "Mistral shape: GQA 8:2, theta 1e6", T::kMistral,
       Make(A::kMistral, {0, 128, 224, 2, 8, 2, 16, 4096}, 1e6f, 1e-5f, bf16, false));
  tiny("tiny-qwen2", "Qwen2.5 shape: qkv bias, tied, f32 weights", T::kQwen2,
       Make(A::kQwen2, {0, 64, 192, 3, 4, 2, 16, 4096}, 1e6f, 1e-6f, DType::kF32, true));
  tiny("tiny-qwen2-untied", "Qwen2 shape: qkv bias, untied", T::kQwen2,
       Make(A::kQwen2, {0, 96, 160, 2, 6, 3, 16, 4096}, 1e6f, 1e-6f, bf16, false));
  tiny("tiny-qwen3", "Qwen3 shape: QK-norm, head_dim 32 != hidden/heads, tied", T::kQwen2,
       Make(A::kQwen3, {0, 64, 192, 2, 4, 2, 32, 4096}, 1e6f, 1e-6f, bf16, true));
  tiny("tiny-qwen3-untied", "Qwen3 shape: QK-norm, untied", T::kQwen2,
       Make(A::kQwen3, {0, 128, 256, 2, 4, 2, 32, 4096}, 1e6f, 1e-6f, bf16, false));
  // Small: what the CUDA kernels cover (head_dim 64 / 128, dimensions multiples of 8) at a size
  // that loads in a second, for GPU tests against the CPU backend and transformers. The config's
  // vocabulary is padded past the tokenizer's, as real checkpoints pad theirs.
  auto small = [&](std::string name, std::string desc, T tok, ModelConfig c) {
    p.push_back(
        {std::move(name), std::move(desc), tok, TokenizerSpec{3840, 0}, std::move(c), false});
  };
  small("small-llama3", "Llama 3 layout at 1024 hidden: GQA 8:2, head_dim 128", T::kLlama3,
        Make(A::kLlama, {4096, 1024, 2816, 4, 8, 2, 128, 8192}, 500000.0f, 1e-5f, bf16, false));
  ModelConfig small31 =
      Make(A::kLlama, {4096, 1024, 2816, 4, 8, 2, 128, 16384}, 500000.0f, 1e-5f, bf16, true);
  small31.rope_scaling = Llama3Scaling(1024);
  small("small-llama31", "Llama 3.1/3.2 layout: llama3 rope scaling, tied", T::kLlama3, small31);
  small("small-llama2", "Llama 2 layout: MHA 8:8, theta 1e4", T::kLlama2,
        Make(A::kLlama, {4096, 1024, 2752, 4, 8, 8, 128, 4096}, 10000.0f, 1e-5f, bf16, false));
  small("small-mistral", "Mistral layout: GQA 8:2, theta 1e6", T::kMistral,
        Make(A::kMistral, {4096, 1024, 3584, 4, 8, 2, 128, 8192}, 1e6f, 1e-5f, bf16, false));
  small("small-qwen2", "Qwen2.5-0.5B layout: qkv bias, GQA 14:2, head_dim 64, tied", T::kQwen2,
        Make(A::kQwen2, {4096, 896, 4864, 4, 14, 2, 64, 8192}, 1e6f, 1e-6f, bf16, true));
  small("small-qwen3", "Qwen3 layout: QK-norm, head_dim 128 != hidden / heads, GQA 16:8", T::kQwen2,
        Make(A::kQwen3, {4096, 1024, 3072, 4, 16, 8, 128, 8192}, 1e6f, 1e-6f, bf16, false));
  // Full shapes: the tokenizer covers the real vocabulary (learned size as in the real files,
  // Llama 3 with its 256 special tokens), so every id a random model emits decodes to text.
  auto full = [&](std::string name, std::string desc, T tok, ModelConfig c) {
    const int learned = tok == T::kLlama3 ? 128000 : tok == T::kQwen2 ? 151643 : c.vocab_size;
    const int reserved = tok == T::kLlama3 ? 245 : 0;
    p.push_back({std::move(name), std::move(desc), tok, TokenizerSpec{learned, reserved},
                 std::move(c), false});
  };
  full("llama3-8b", "Meta-Llama-3-8B-Instruct shapes", T::kLlama3,
       Make(A::kLlama, {128256, 4096, 14336, 32, 32, 8, 128, 8192}, 500000.0f, 1e-5f, bf16, false));
  ModelConfig l31_8b =
      Make(A::kLlama, {128256, 4096, 14336, 32, 32, 8, 128, 131072}, 500000.0f, 1e-5f, bf16, false);
  l31_8b.rope_scaling = Llama3Scaling(8192);
  full("llama31-8b", "Llama-3.1-8B-Instruct shapes (llama3 rope scaling)", T::kLlama3, l31_8b);
  ModelConfig l32_1b =
      Make(A::kLlama, {128256, 2048, 8192, 16, 32, 8, 64, 131072}, 500000.0f, 1e-5f, bf16, true);
  l32_1b.rope_scaling = Llama3Scaling(8192);
  full("llama32-1b", "Llama-3.2-1B shapes (tied; a draft model for the Llama 3 8B shapes)",
       T::kLlama3, l32_1b);
  full("qwen3-8b", "Qwen3-8B shapes", T::kQwen2,
       Make(A::kQwen3, {151936, 4096, 12288, 36, 32, 8, 128, 40960}, 1e6f, 1e-6f, bf16, false));
  full("qwen25-7b", "Qwen2.5-7B-Instruct shapes", T::kQwen2,
       Make(A::kQwen2, {152064, 3584, 18944, 28, 28, 4, 128, 32768}, 1e6f, 1e-6f, bf16, false));
  full("mistral-7b", "Mistral-7B-Instruct-v0.3 shapes", T::kMistral,
       Make(A::kMistral, {32768, 4096, 14336, 32, 32, 8, 128, 32768}, 1e6f, 1e-5f, bf16, false));
  full("llama2-7b", "Llama-2-7b shapes", T::kLlama2,
       Make(A::kLlama, {32000, 4096, 11008, 32, 32, 32, 128, 4096}, 10000.0f, 1e-5f, bf16, false));
  return p;
}

const char* ArchitectureClass(Architecture a) {
  switch (a) {
    case Architecture::kLlama:
      return "LlamaForCausalLM";
    case Architecture::kMistral:
      return "MistralForCausalLM";
    case Architecture::kQwen2:
      return "Qwen2ForCausalLM";
    case Architecture::kQwen3:
      return "Qwen3ForCausalLM";
  }
  return "?";
}

// The shortest decimal that reads back as the same float: 1e-5f prints as 1e-05, not
// 9.999999747378752e-06.
double ShortFloat(float f) {
  for (int precision = 6; precision < 9; ++precision) {
    const double d = std::strtod(absl::StrFormat("%.*g", precision, f).c_str(), nullptr);
    if (static_cast<float>(d) == f) return d;
  }
  return f;
}

const char* TorchDType(DType t) {
  return t == DType::kF32 ? "float32" : t == DType::kF16 ? "float16" : "bfloat16";
}

ojson TokenIds(const std::vector<int>& ids) {
  if (ids.empty()) return nullptr;
  if (ids.size() == 1) return ids[0];
  return ids;
}

ojson RopeScalingJson(const RopeScaling& s) {
  switch (s.type) {
    case RopeScaling::Type::kNone:
      return nullptr;
    case RopeScaling::Type::kLinear:
      return {{"factor", ShortFloat(s.factor)}, {"rope_type", "linear"}, {"type", "linear"}};
    case RopeScaling::Type::kLlama3:
      return {{"factor", ShortFloat(s.factor)},
              {"high_freq_factor", ShortFloat(s.high_freq_factor)},
              {"low_freq_factor", ShortFloat(s.low_freq_factor)},
              {"original_max_position_embeddings", s.original_max_position_embeddings},
              {"rope_type", "llama3"}};
  }
  return nullptr;
}

}  // namespace

const std::vector<ModelPreset>& ModelPresets() {
  static const std::vector<ModelPreset>* presets = new std::vector<ModelPreset>(BuildPresets());
  return *presets;
}

absl::StatusOr<ModelPreset> FindModelPreset(const std::string& name) {
  const std::string wanted = name == "tiny" ? "tiny-llama3" : name;
  std::vector<std::string> names = {"tiny"};
  for (const ModelPreset& p : ModelPresets()) {
    if (p.name == wanted) return p;
    names.push_back(p.name);
  }
  return absl::NotFoundError(
      absl::StrCat("unknown preset \"", name, "\"; known: ", absl::StrJoin(names, ", ")));
}

std::string HfConfigJson(const ModelConfig& c) {
  ojson j;
  j["architectures"] = {ArchitectureClass(c.architecture)};
  j["attention_bias"] = c.qkv_bias;
  j["attention_dropout"] = 0.0;
  j["bos_token_id"] = c.bos_token_id >= 0 ? ojson(c.bos_token_id) : ojson(nullptr);
  j["eos_token_id"] = TokenIds(c.eos_token_ids);
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["hidden_size"] = c.hidden_size;
  j["initializer_range"] = 0.02;
  j["intermediate_size"] = c.intermediate_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
  if (c.architecture == Architecture::kLlama) j["mlp_bias"] = false;
  j["model_type"] = c.model_type;
  j["num_attention_heads"] = c.num_q_heads;
  j["num_hidden_layers"] = c.num_layers;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["rms_norm_eps"] = ShortFloat(c.rms_norm_eps);
  j["rope_scaling"] = RopeScalingJson(c.rope_scaling);
  j["rope_theta"] = ShortFloat(c.rope_theta);
  if (c.architecture != Architecture::kLlama) {
    j["sliding_window"] = nullptr;
    if (c.architecture != Architecture::kMistral) {
      j["use_sliding_window"] = false;
      j["max_window_layers"] = c.num_layers;
    }
  }
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["torch_dtype"] = TorchDType(c.dtype);
  j["transformers_version"] = "4.51.0";
  j["use_cache"] = true;
  j["vocab_size"] = c.vocab_size;
  return j.dump(2) + "\n";
}

std::string HfGenerationConfigJson(const ModelConfig& c) {
  ojson j;
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  j["eos_token_id"] = TokenIds(c.eos_token_ids);
  j["transformers_version"] = "4.51.0";
  return j.dump(2) + "\n";
}

}  // namespace tandem
