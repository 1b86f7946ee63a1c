// A compiled PCRE2 pattern in UTF + UCP mode (so \p{L}, \s, \w and case folding follow
// Unicode, as the Oniguruma regexes of `tokenizers` do), JIT-compiled when available.
// Immutable after Compile; FindAll is thread-safe (match data is per call).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

class Regex {
 public:
  // InvalidArgument with PCRE2's message and offset for a bad pattern.
  static absl::StatusOr<Regex> Compile(std::string_view pattern);
  // A pattern that matches `literal` exactly.
  static std::string Escape(std::string_view literal);

  // All non-overlapping matches, left to right, as [begin, end) byte ranges. An empty match
  // advances by one code point. `text` must be valid UTF-8 (PCRE2 does not check it again).
  std::vector<std::pair<size_t, size_t>> FindAll(std::string_view text) const;

 private:
  struct Code;
  explicit Regex(std::shared_ptr<const Code> code) : code_(std::move(code)) {}
  std::shared_ptr<const Code> code_;
};

}  // namespace tandem
