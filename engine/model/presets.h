// Model presets for make-model: tiny versions of every supported architecture (for tests and
// the CPU demo) and the full 7-8B shapes (for GPU benchmarks), plus the Hugging Face
// config.json / generation_config.json text for any ModelConfig.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"
#include "tokenizer/tokenizer.h"

namespace tandem {

struct ModelPreset {
  std::string name;
  std::string description;
  TokenizerFamily tokenizer = TokenizerFamily::kLlama3;
  TokenizerSpec tokenizer_spec;
  // vocab_size 0 (tiny presets) means the generated tokenizer's size; full presets keep the real
  // model's (larger than the generated tokenizer, as real checkpoints pad theirs). bos/eos ids
  // always come from the generated tokenizer, so the checkpoint is self-consistent.
  ModelConfig config;
  bool tiny = false;
};

// All presets, tiny first; "tiny" is an alias of "tiny-llama3".
const std::vector<ModelPreset>& ModelPresets();
// NotFound listing the known names.
absl::StatusOr<ModelPreset> FindModelPreset(const std::string& name);

// Hugging Face config.json for `config`, as transformers writes it for the architecture.
std::string HfConfigJson(const ModelConfig& config);
// generation_config.json: bos and eos ids (a list when there are several).
std::string HfGenerationConfigJson(const ModelConfig& config);

}  // namespace tandem
