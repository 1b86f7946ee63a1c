// MakeModel: writes a random-weight checkpoint of a preset in the exact Hugging Face layout —
// config.json, generation_config.json, model*.safetensors (+ index when sharded) and the
// generated tokenizer files — deterministic from the seed. Behind `tandem make-model`.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"

namespace tandem {

struct MakeModelOptions {
  std::string preset = "tiny";  // engine/model/presets.h
  std::string out_dir;          // created if missing
  uint64_t seed = 0;
  int num_shards = 0;  // 0: one file up to 5 GB per shard (HF's default split); else exactly N
};

// Returns the config written. NotFound for an unknown preset; Internal on I/O failure.
absl::StatusOr<ModelConfig> MakeModel(const MakeModelOptions& options);

}  // namespace tandem
