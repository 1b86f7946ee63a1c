// ByteTokenizer: a test tokenizer whose ids 0..255 are the bytes themselves, 256 is BOS and 257
// EOS (both special). Decode replaces invalid or incomplete UTF-8 with U+FFFD, as `tokenizers`
// does, so multi-byte characters split across tokens exercise the incremental detokenizer.
// Shared by the tokenizer's text-stream tests and the router's tests.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace tandem::testing {

class ByteTokenizer : public Tokenizer {
 public:
  static constexpr int32_t kBos = 256;
  static constexpr int32_t kEos = 257;

  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens) const override {
    std::vector<int32_t> ids;
    if (add_special_tokens) ids.push_back(kBos);
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const override {
    std::string bytes;
    for (int32_t id : ids) {
      if (id < 256) {
        bytes += static_cast<char>(id);
      } else if (!skip_special_tokens) {
        bytes += id == kBos ? "<s>" : "</s>";
      }
    }
    return Sanitize(bytes);
  }
  int vocab_size() const override { return 258; }
  std::optional<int32_t> TokenToId(std::string_view) const override { return std::nullopt; }
  bool IsSpecial(int32_t id) const override { return id >= 256; }
  std::optional<int32_t> bos_id() const override { return kBos; }
  std::optional<int32_t> eos_id() const override { return kEos; }

  static std::vector<int32_t> Ids(const std::string& text) {
    std::vector<int32_t> ids;
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }

 private:
  // Replaces each maximal invalid / truncated sequence with U+FFFD.
  static std::string Sanitize(const std::string& s) {
    std::string out;
    size_t i = 0;
    while (i < s.size()) {
      const unsigned char c = s[i];
      const int len = c < 0x80         ? 1
                      : (c >> 5) == 6  ? 2
                      : (c >> 4) == 14 ? 3
                      : (c >> 3) == 30 ? 4
                                       : 0;
      bool ok = len > 0 && i + len <= s.size();
      for (int k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(s[i + k]) >> 6) == 2;
      if (ok) {
        out.append(s, i, len);
        i += len;
      } else {
        out += "\xEF\xBF\xBD";
        ++i;
        while (i < s.size() && (static_cast<unsigned char>(s[i]) >> 6) == 2) ++i;
      }
    }
    return out;
  }
};

}  // namespace tandem::testing
