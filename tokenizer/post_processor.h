// Post-processors of tokenizer.json ("post_processor"), reduced to what matters for a single
// sequence's ids: the special tokens placed before and after it (TemplateProcessing's "single"
// template, RobertaProcessing/BertProcessing's cls/sep). ByteLevel only trims offsets, so it
// adds nothing; Sequence concatenates its parts' effects.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem {

struct PostProcessor {
  std::vector<int32_t> prefix;  // ids before the sequence when add_special_tokens
  std::vector<int32_t> suffix;  // ids after it

  void Apply(std::vector<int32_t>* ids) const;
};

absl::StatusOr<PostProcessor> PostProcessorFromJson(const nlohmann::json& j,
                                                    std::string_view where);

}  // namespace tandem
