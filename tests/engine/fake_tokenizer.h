// FakeTokenizer: token id i decodes to one lower-case letter, 'a' + i % 26, except the ids
// listed as special, which decode to "<s{id}>" (dropped with skip_special_tokens). Enough to
// stream an engine test's output through a TextStream without a tokenizer.json.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace tandem::testing {

class FakeTokenizer : public Tokenizer {
 public:
  FakeTokenizer(int vocab_size, std::vector<int32_t> special_ids)
      : vocab_size_(vocab_size), special_(std::move(special_ids)) {}

  static std::string Piece(int32_t id) { return std::string(1, static_cast<char>('a' + id % 26)); }

  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens) const override {
    std::vector<int32_t> ids;
    for (char c : text) ids.push_back(c - 'a');
    return ids;
  }
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const override {
    std::string text;
    for (int32_t id : ids) {
      if (!IsSpecial(id)) {
        text += Piece(id);
      } else if (!skip_special_tokens) {
        text += "<s" + std::to_string(id) + ">";
      }
    }
    return text;
  }
  int vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> TokenToId(std::string_view token) const override { return std::nullopt; }
  bool IsSpecial(int32_t id) const override {
    return std::find(special_.begin(), special_.end(), id) != special_.end();
  }
  std::optional<int32_t> bos_id() const override { return std::nullopt; }
  std::optional<int32_t> eos_id() const override {
    return special_.empty() ? std::nullopt : std::optional<int32_t>(special_[0]);
  }

 private:
  int vocab_size_;
  std::vector<int32_t> special_;
};

}  // namespace tandem::testing
