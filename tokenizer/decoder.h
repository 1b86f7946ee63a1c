// Decoders of tokenizer.json ("decoder"): turn token strings back into text. Each step maps a
// list of token strings to another (tokenizers' decode_chain); the result is their
// concatenation. Supported: ByteLevel, Metaspace, Sequence, Replace, ByteFallback, Fuse, Strip.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void DecodeChain(std::vector<std::string>* tokens) const = 0;
};

absl::StatusOr<std::unique_ptr<Decoder>> DecoderFromJson(const nlohmann::json& j,
                                                         std::string_view where);

}  // namespace tandem
