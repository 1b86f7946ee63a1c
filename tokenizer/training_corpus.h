// The text the generated tokenizers' BPE merges are learned from: original multilingual prose,
// code, numbers, CJK, emoji and accented Latin, so tiny models get realistic token boundaries.
#pragma once

#include <string_view>

namespace tandem {

std::string_view TrainingCorpus();

}  // namespace tandem
