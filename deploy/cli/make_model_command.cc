// tandem make-model --preset NAME --out DIR [--seed S] [--shards N] [--quantization SCHEME
//                   [--group-size G]] [--list]
#include <iostream>
#include <memory>

#include "deploy/cli/commands.h"
#include "engine/model/make_model.h"
#include "engine/model/presets.h"

namespace tandem::cli {

std::function<int()> AddMakeModelCommand(CLI::App* sub) {
  auto opts = std::make_shared<MakeModelOptions>();
  auto list = std::make_shared<bool>(false);
  sub->add_option("--preset", opts->preset, "Preset name (--list shows them)")
      ->capture_default_str();
  sub->add_option("--out", opts->out_dir, "Output folder (created if missing)");
  sub->add_option("--seed", opts->seed, "Random seed: same seed, same bytes")
      ->capture_default_str();
  sub->add_option("--shards", opts->num_shards,
                  "Number of safetensors shards (0: split at 5 GB, as transformers does)")
      ->capture_default_str();
  sub->add_option("--quantization", opts->quantization,
                  "Write the linear layers pre-quantized: fp8-block, fp8-channel, int8, awq or "
                  "gptq (engine/model/quant_make_model.h)");
  sub->add_option("--group-size", opts->quant_group_size, "Group size along k for awq / gptq")
      ->capture_default_str();
  sub->add_flag("--list", *list, "List the presets and exit");
  return [opts, list]() -> int {
    if (*list) {
      std::cout << "tiny (alias of tiny-llama3)\n";
      for (const ModelPreset& p : ModelPresets()) {
        std::cout << p.name << "\t" << p.description << "\n";
      }
      return 0;
    }
    if (opts->out_dir.empty()) {
      std::cerr << "make-model: --out DIR is required\n";
      return 2;
    }
    absl::StatusOr<ModelConfig> config = MakeModel(*opts);
    if (!config.ok()) {
      std::cerr << "make-model: " << config.status() << "\n";
      return 1;
    }
    return 0;
  };
}

}  // namespace tandem::cli
