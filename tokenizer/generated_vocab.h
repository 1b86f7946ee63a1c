// Learns the vocabulary of a generated checkpoint's tokenizer from the embedded corpus
// (training_corpus.h), pre-tokenized the way that family's tokenizer.json will split text.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace tandem {

// The patterns of the real checkpoints' Split pre-tokenizers.
inline constexpr std::string_view kLlama3SplitRegex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kQwen2SplitRegex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // "▁" U+2581

struct GeneratedVocab {
  // Model vocabulary by id (no special tokens for byte-level families; <unk> <s> </s> first for
  // SentencePiece-style ones, then <0x00>..<0xFF>, characters, merges).
  std::vector<std::string> tokens;
  std::vector<std::pair<std::string, std::string>> merges;  // rank order
};

// vocab_size counts the model vocabulary above. Deterministic.
GeneratedVocab TrainGeneratedVocab(TokenizerFamily family, int vocab_size);

}  // namespace tandem
