// ModelConfig: the architecture hyper-parameters read from a Hugging Face config.json
// (Llama 2/3/3.1, Mistral, Qwen2/2.5, Qwen3).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/common/dtype.h"

namespace tandem {

enum class Architecture { kLlama, kMistral, kQwen2, kQwen3 };

struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3 };
  Type type = Type::kNone;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;                 // llama3
  float high_freq_factor = 4.0f;                // llama3
  int original_max_position_embeddings = 8192;  // llama3
};

struct ModelConfig {
  Architecture architecture = Architecture::kLlama;
  std::string model_type;  // config.json "model_type", e.g. "llama", "qwen3"
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int max_position_embeddings = 0;
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2/2.5
  bool qk_norm = false;   // Qwen3
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;  // from config.json and generation_config.json
  DType dtype = DType::kBF16;      // config.json "torch_dtype" / "dtype"

  // Parses config.json text; InvalidArgument naming the bad field, Unimplemented for an
  // unsupported architecture.
  static absl::StatusOr<ModelConfig> FromJson(const std::string& json_text);
  // Reads DIR/config.json (and DIR/generation_config.json for EOS ids, if present).
  static absl::StatusOr<ModelConfig> Load(const std::string& dir);

  // Rotary inverse frequencies [head_dim / 2] with rope_scaling applied (HF semantics).
  std::vector<float> RopeInvFreq() const;
};

}  // namespace tandem
