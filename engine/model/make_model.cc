#include "engine/model/make_model.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "engine/model/presets.h"
#include "engine/model/quant_make_model.h"
#include "engine/model/random_weights.h"
#include "nlohmann/json.hpp"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

absl::Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> MakeModel(const MakeModelOptions& options) {
  ASSIGN_OR_RETURN(ModelPreset preset, FindModelPreset(options.preset));
  if (options.out_dir.empty()) return absl::InvalidArgumentError("make-model: no output folder");
  if (options.num_shards < 0) return absl::InvalidArgumentError("make-model: shards must be >= 0");
  std::error_code ec;
  std::filesystem::create_directories(options.out_dir, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot create ", options.out_dir, ": ", ec.message()));
  }
  GeneratedTokenizerInfo info;
  RETURN_IF_ERROR(
      WriteTokenizerFiles(options.out_dir, preset.tokenizer, preset.tokenizer_spec, &info));
  ModelConfig config = options.config.value_or(preset.config);
  if (config.vocab_size < info.vocab_size) config.vocab_size = info.vocab_size;
  config.bos_token_id = info.bos_id.value_or(-1);
  config.eos_token_ids.assign(info.eos_ids.begin(), info.eos_ids.end());
  std::string config_json = HfConfigJson(config);
  if (!options.quantization.empty()) {
    ASSIGN_OR_RETURN(const std::string q,
                     QuantizationConfigJson(options.quantization, options.quant_group_size));
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(config_json, nullptr, false);
    j["quantization_config"] = nlohmann::ordered_json::parse(q, nullptr, false);
    config_json = j.dump(2) + "\n";
  }
  RETURN_IF_ERROR(WriteText(options.out_dir + "/config.json", config_json));
  RETURN_IF_ERROR(
      WriteText(options.out_dir + "/generation_config.json", HfGenerationConfigJson(config)));
  CheckpointWriteOptions write;
  write.num_shards = options.num_shards;
  if (options.quantization.empty()) {
    RETURN_IF_ERROR(WriteRandomWeights(config, options.seed, options.out_dir, write));
  } else {
    RETURN_IF_ERROR(WriteQuantizedRandomWeights(config, options.seed, options.out_dir, write,
                                                options.quantization, options.quant_group_size));
  }
  LOG(INFO) << "make-model: wrote " << preset.name << " (" << config.model_type << ", "
            << config.num_layers << " layers, hidden " << config.hidden_size << ", vocab "
            << config.vocab_size << ", seed " << options.seed
            << (options.quantization.empty() ? "" : ", quantization " + options.quantization)
            << ") to " << options.out_dir;
  return config;
}

}  // namespace tandem
