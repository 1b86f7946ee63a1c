// The byte-level alphabet of GPT-2-style BPE (Llama 3, Qwen): every byte maps to one printable
// code point (printable Latin-1 bytes map to themselves, the rest to U+0100 + n in byte order),
// so vocabulary entries are valid strings. "Ġ" (U+0120) is the space byte.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tandem::byte_level {

// The UTF-8 string of the code point that byte `b` maps to.
const std::string& ByteToChars(uint8_t b);
// Maps every byte of `bytes` to its alphabet code point.
std::string Encode(std::string_view bytes);
// The byte a code point stands for, if it is in the alphabet.
std::optional<uint8_t> CharToByte(char32_t cp);

}  // namespace tandem::byte_level
