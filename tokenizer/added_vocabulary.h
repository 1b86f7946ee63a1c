// Added tokens of tokenizer.json ("added_tokens"): special tokens such as <|eot_id|> and
// non-special ones such as Qwen's <tool_call>. As in `tokenizers`, tokens with
// normalized=false are found in the raw text; the text between them is normalized and then
// searched for the normalized=true tokens (by their normalized content). Matching is
// leftmost-longest (aho-corasick LeftmostLongest) and honours lstrip/rstrip (absorb
// neighbouring whitespace) and single_word.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tokenizer/string_map.h"

namespace tandem {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;  // matched after normalization
  // What it matches and decodes as: the content, normalized when normalized=true (as
  // tokenizers does: with Llama 2's normalizer a normalized "<s>" is "▁<s>").
  std::string pattern;
  // Decode(skip_special_tokens=true) drops it: special, and its pattern is its content (a
  // normalized token whose normalizer changes it is kept, as tokenizers does).
  bool skipped_when_decoding = false;
};

class AddedVocabulary {
 public:
  // `normalize` maps a normalized=true token's content to the text it is matched as (null:
  // no normalizer).
  static absl::StatusOr<AddedVocabulary> FromJson(
      const nlohmann::json& added_tokens, const std::function<void(std::string*)>& normalize);

  // A run of text [begin, end): an added token when id >= 0, else plain text to encode.
  struct Segment {
    size_t begin, end;
    int32_t id;
  };
  // Pass kRaw on the input, kNormalized on a normalized piece between raw matches.
  enum Pass { kRaw = 0, kNormalized = 1 };
  std::vector<Segment> Split(std::string_view text, Pass pass) const;
  bool has_normalized_tokens() const { return has_normalized_; }

  const AddedToken* FindById(int32_t id) const;
  const AddedToken* FindByContent(std::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  // Longest token whose content starts at text[pos], or null.
  const AddedToken* LongestAt(std::string_view text, size_t pos, Pass pass) const;

  std::vector<AddedToken> tokens_;
  absl::flat_hash_map<int32_t, size_t> by_id_;
  StringMap<size_t> by_content_;
  // Per pass and first byte: indices into tokens_, longest pattern first.
  std::vector<size_t> by_first_byte_[2][256];
  bool has_normalized_ = false;
};

}  // namespace tandem
