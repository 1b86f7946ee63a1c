// Normalizers of tokenizer.json ("normalizer"): applied to each piece of text between added
// tokens before pre-tokenization. Supported: Sequence, Prepend, Replace (String or Regex),
// NFC/NFD/NFKC/NFKD (ICU), Strip. Others load as Unimplemented.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void Normalize(std::string* text) const = 0;
};

// `where` names the JSON path for error messages ("normalizer", "normalizer.normalizers[1]").
absl::StatusOr<std::unique_ptr<Normalizer>> NormalizerFromJson(const nlohmann::json& j,
                                                               std::string_view where);

// A "pattern" object ({"String": s} or {"Regex": r}) as a PCRE2 pattern string.
absl::StatusOr<std::string> PatternFromJson(const nlohmann::json& j, std::string_view where);

}  // namespace tandem
