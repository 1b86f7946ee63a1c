// UTF-8 helpers shared by the tokenizer's pieces: code point iteration, encoding, and lossy
// conversion with the same U+FFFD rules as Rust's String::from_utf8_lossy (which `tokenizers`
// uses): each maximal invalid subpart of a sequence becomes one U+FFFD.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::utf8 {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Appends the UTF-8 encoding of `cp` (must be a valid scalar value) to `out`.
void Append(char32_t cp, std::string* out);
std::string Encode(char32_t cp);

// Length of the valid UTF-8 sequence starting at text[pos], or 0 if it is not a valid
// (complete, shortest-form, non-surrogate) sequence.
size_t ValidSequenceLength(std::string_view text, size_t pos);

// Decodes one code point at text[*pos] and advances *pos. An invalid sequence yields U+FFFD
// and advances by its maximal invalid subpart (at least one byte).
char32_t Next(std::string_view text, size_t* pos);

// Splits text into its code points' byte strings (invalid bytes become single-byte pieces).
std::vector<std::string_view> SplitChars(std::string_view text);

// from_utf8_lossy: valid text is returned unchanged.
std::string Lossy(std::string_view bytes);
bool IsValid(std::string_view bytes);

// Python str.isspace() for a code point (what Jinja's trim and str.strip() remove).
bool IsPythonSpace(char32_t cp);
// str.strip(): removes leading and trailing Python whitespace.
std::string_view PythonStrip(std::string_view text);

}  // namespace tandem::utf8
