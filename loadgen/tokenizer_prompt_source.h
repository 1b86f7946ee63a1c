// A PromptSource that counts with the target's own tokenizer (--tokenizer DIR, a Hugging Face
// tokenizer.json loaded by tokenizer/): pieces are vocabulary tokens that decode to
// " <letters>" and encode back to themselves, so a prompt of n pieces is n tokens for byte-level
// BPE vocabularies (Llama 3, Qwen); Count() is the tokenizer's exact count (SentencePiece
// vocabularies may add a leading "▁" token, which Count() includes).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "loadgen/dataset.h"

namespace tandem::loadgen {

absl::StatusOr<std::unique_ptr<PromptSource>> MakeTokenizerPromptSource(const std::string& dir);

}  // namespace tandem::loadgen
