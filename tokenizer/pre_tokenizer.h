// Pre-tokenizers of tokenizer.json ("pre_tokenizer"): split normalized text into the words the
// model encodes one by one. Supported: Sequence, Split (String or Regex pattern, every
// behavior, invert), ByteLevel (add_prefix_space, use_regex), Metaspace (prepend_scheme
// always/first/never, split), Digits. Others load as Unimplemented.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem {

struct PreToken {
  std::string text;
  // True when the piece begins at offset 0 of the original input (Metaspace's "first" scheme
  // prepends "▁" only there; text after an added token does not qualify).
  bool at_origin = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces *pieces by its refinement; empty pieces are dropped.
  virtual void PreTokenize(std::vector<PreToken>* pieces) const = 0;
};

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizerFromJson(const nlohmann::json& j,
                                                                   std::string_view where);

}  // namespace tandem
