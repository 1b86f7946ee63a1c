#include "tokenizer/utf8.h"

namespace tandem::utf8 {
namespace {

// Length of the maximal invalid subpart at text[pos] (Unicode "substitution of maximal
// subparts"): the longest prefix of a well-formed sequence that is present, at least 1 byte.
size_t InvalidSubpartLength(std::string_view text, size_t pos) {
  const auto b0 = static_cast<uint8_t>(text[pos]);
  size_t need = 0;
  uint8_t lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 1;
  }
  size_t len = 1;
  for (size_t i = 0; i < need && pos + len < text.size(); ++i) {
    const auto b = static_cast<uint8_t>(text[pos + len]);
    if (b < lo || b > hi) break;
    lo = 0x80;
    hi = 0xBF;
    ++len;
  }
  return len;
}

}  // namespace

void Append(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string Encode(char32_t cp) {
  std::string s;
  Append(cp, &s);
  return s;
}

size_t ValidSequenceLength(std::string_view text, size_t pos) {
  const auto b0 = static_cast<uint8_t>(text[pos]);
  if (b0 < 0x80) return 1;
  const size_t len = InvalidSubpartLength(text, pos);
  const size_t want = b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : 2;
  return (b0 >= 0xC2 && b0 <= 0xF4 && len == want) ? len : 0;
}

char32_t Next(std::string_view text, size_t* pos) {
  const size_t len = ValidSequenceLength(text, *pos);
  if (len == 0) {
    *pos += InvalidSubpartLength(text, *pos);
    return 0xFFFD;
  }
  const auto* p = reinterpret_cast<const uint8_t*>(text.data() + *pos);
  *pos += len;
  switch (len) {
    case 1:
      return p[0];
    case 2:
      return ((p[0] & 0x1F) << 6) | (p[1] & 0x3F);
    case 3:
      return ((p[0] & 0x0F) << 12) | ((p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    default:
      return ((p[0] & 0x07) << 18) | ((p[1] & 0x3F) << 12) | ((p[2] & 0x3F) << 6) | (p[3] & 0x3F);
  }
}

std::vector<std::string_view> SplitChars(std::string_view text) {
  std::vector<std::string_view> chars;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t len = ValidSequenceLength(text, pos);
    if (len == 0) len = 1;
    chars.push_back(text.substr(pos, len));
    pos += len;
  }
  return chars;
}

std::string Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    const size_t len = ValidSequenceLength(bytes, pos);
    if (len > 0) {
      out.append(bytes.substr(pos, len));
      pos += len;
    } else {
      out.append(kReplacementChar);
      pos += InvalidSubpartLength(bytes, pos);
    }
  }
  return out;
}

bool IsValid(std::string_view bytes) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    const size_t len = ValidSequenceLength(bytes, pos);
    if (len == 0) return false;
    pos += len;
  }
  return true;
}

bool IsPythonSpace(char32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F);
  switch (cp) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

std::string_view PythonStrip(std::string_view text) {
  size_t begin = 0;
  while (begin < text.size()) {
    size_t next = begin;
    if (!IsPythonSpace(Next(text, &next))) break;
    begin = next;
  }
  size_t end = begin;  // end of the last non-space code point
  for (size_t pos = begin; pos < text.size();) {
    const bool space = IsPythonSpace(Next(text, &pos));
    if (!space) end = pos;
  }
  return text.substr(begin, end - begin);
}

}  // namespace tandem::utf8
