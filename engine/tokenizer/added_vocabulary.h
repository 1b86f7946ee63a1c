// Added tokens of tokenizer.json ("added_tokens"): special tokens such as <|eot_id|> and
// non-special ones such as Qwen's <tool_call>. They are found in the raw text before
// normalization, leftmost-longest (tokenizers' aho-corasick LeftmostLongest), honouring
// lstrip/rstrip (absorb neighbouring whitespace) and single_word.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/tokenizer/string_map.h"
#include "nlohmann/json.hpp"

namespace tandem {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
};

class AddedVocabulary {
 public:
  static absl::StatusOr<AddedVocabulary> FromJson(const nlohmann::json& added_tokens);

  // A run of text [begin, end): an added token when id >= 0, else plain text to encode.
  struct Segment {
    size_t begin, end;
    int32_t id;
  };
  std::vector<Segment> Split(std::string_view text) const;

  const AddedToken* FindById(int32_t id) const;
  const AddedToken* FindByContent(std::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  // Longest token whose content starts at text[pos], or null.
  const AddedToken* LongestAt(std::string_view text, size_t pos) const;

  std::vector<AddedToken> tokens_;
  absl::flat_hash_map<int32_t, size_t> by_id_;
  StringMap<size_t> by_content_;
  std::vector<size_t> by_first_byte_[256];  // indices into tokens_, longest content first
};

}  // namespace tandem
