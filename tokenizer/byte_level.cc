#include "tokenizer/byte_level.h"

#include "tokenizer/utf8.h"

namespace tandem::byte_level {
namespace {

bool PrintsAsItself(int b) {
  return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct Tables {
  std::array<std::string, 256> byte_to_chars;
  std::array<int16_t, 512> cp_to_byte;  // all alphabet code points are < U+0144
  Tables() {
    cp_to_byte.fill(-1);
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      const char32_t cp = PrintsAsItself(b) ? static_cast<char32_t>(b) : 256 + next++;
      byte_to_chars[b] = utf8::Encode(cp);
      cp_to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};

const Tables& GetTables() {
  static const Tables* tables = new Tables();
  return *tables;
}

}  // namespace

const std::string& ByteToChars(uint8_t b) { return GetTables().byte_to_chars[b]; }

std::string Encode(std::string_view bytes) {
  const Tables& t = GetTables();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += t.byte_to_chars[static_cast<uint8_t>(c)];
  return out;
}

std::optional<uint8_t> CharToByte(char32_t cp) {
  if (cp >= 512) return std::nullopt;
  const int16_t b = GetTables().cp_to_byte[cp];
  if (b < 0) return std::nullopt;
  return static_cast<uint8_t>(b);
}

}  // namespace tandem::byte_level
