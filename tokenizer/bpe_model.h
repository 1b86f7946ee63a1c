// The BPE model of tokenizer.json ("model": {"type": "BPE", ...}): vocab, ranked merges,
// byte_fallback (<0xXX> tokens for characters missing from the vocab), unk/fuse_unk and
// ignore_merges (a word that is itself in the vocab becomes one token, as Llama 3 sets).
// Merging follows tokenizers' Word::merge_all: always the lowest-ranked pair, leftmost first,
// with a heap, so long words stay O(n log n).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tokenizer/string_map.h"

namespace tandem {

class BpeModel {
 public:
  // InvalidArgument for a malformed model object (missing vocab, a merge naming a token that is
  // not in the vocab, ...); Unimplemented for features we do not support (dropout,
  // continuing_subword_prefix, end_of_word_suffix).
  static absl::StatusOr<std::unique_ptr<BpeModel>> FromJson(const nlohmann::json& model);

  // Appends the ids of one pre-tokenized word to *ids.
  void Tokenize(std::string_view word, std::vector<int32_t>* ids) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // Empty string_view for an id outside the vocab.
  std::string_view IdToToken(int32_t id) const;
  // One past the largest id in the vocab.
  int32_t size() const { return static_cast<int32_t>(id_to_token_.size()); }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  absl::Status LoadMerges(const nlohmann::json& merges);
  // Initial symbols: one per character, or byte tokens / unk for characters not in the vocab.
  std::vector<int32_t> InitialSymbols(std::string_view word) const;
  void MergeAll(std::vector<int32_t>* symbols) const;

  StringMap<int32_t> vocab_;
  std::vector<std::string> id_to_token_;  // empty strings for ids the vocab skips
  absl::flat_hash_map<uint64_t, Merge> merges_;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  int32_t byte_ids_[256];  // <0xXX> ids when byte_fallback and all 256 exist, else -1
};

}  // namespace tandem
