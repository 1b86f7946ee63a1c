// MakeModel: writes a random-weight checkpoint of a preset in the exact Hugging Face layout —
// config.json, generation_config.json, model*.safetensors (+ index when sharded) and the
// generated tokenizer files — deterministic from the seed. Behind `tandem make-model`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"

namespace tandem {

struct MakeModelOptions {
  std::string preset = "tiny";  // engine/model/presets.h
  std::string out_dir;          // created if missing
  uint64_t seed = 0;
  int num_shards = 0;  // 0: one file up to 5 GB per shard (HF's default split); else exactly N
  // "" (unquantized) or a scheme of quant_make_model.h (fp8-block, fp8-channel, int8, awq,
  // gptq): the same random weights with the decoder's linear layers quantized in that layout.
  std::string quantization = "";
  int64_t quant_group_size = 128;  // awq, gptq (gptq: -1 is one group per row)
  // Tests: these shapes instead of the preset's (the preset's tokenizer is kept; vocab_size is
  // raised to the tokenizer's as for a preset).
  std::optional<ModelConfig> config = std::nullopt;
};

// Returns the config written. NotFound for an unknown preset; Internal on I/O failure.
absl::StatusOr<ModelConfig> MakeModel(const MakeModelOptions& options);

}  // namespace tandem
