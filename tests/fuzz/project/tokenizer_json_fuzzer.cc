// Fuzzes tokenizer.json loading (tokenizer/tokenizer.h, Tokenizer::FromJson): any input is a
// tokenizer or an error Status, never a crash; a tokenizer that loads must encode and decode
// (text with special tokens, multi-byte UTF-8 and invalid bytes) with ids inside its vocabulary.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "base/check.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (64 << 10)) return 0;  // a big vocabulary only makes runs slow
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::unique_ptr<tandem::Tokenizer>> tokenizer =
      tandem::Tokenizer::FromJson(json, "");
  if (!tokenizer.ok()) return 0;
  const tandem::Tokenizer& t = **tokenizer;
  for (std::string_view text : {std::string_view("Hello, world! 123  x"),
                                std::string_view("h\xc3\xa9llo \xf0\x9f\x98\x80 <s></s>"),
                                std::string_view("\xff\xfe bad \xc3")}) {
    for (bool special : {false, true}) {
      std::vector<int32_t> ids = t.Encode(text, special);
      for (int32_t id : ids) CHECK(id >= 0 && id < t.vocab_size()) << id;
      (void)t.Decode(ids, /*skip_special_tokens=*/true);
      (void)t.Decode(ids, /*skip_special_tokens=*/false);
    }
  }
  std::vector<int32_t> all;
  for (int32_t id = 0; id < std::min(t.vocab_size(), 512); ++id) all.push_back(id);
  (void)t.Decode(all, false);
  return 0;
}
