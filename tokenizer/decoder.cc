#include "tokenizer/decoder.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace tandem {
namespace {

using json_fields::Json;

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts)
      : parts_(std::move(parts)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (const auto& p : parts_) p->DecodeChain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

// Maps alphabet characters back to bytes over the whole sequence, then converts lossily (a
// token with a character outside the alphabet, e.g. an added token, contributes its bytes).
class ByteLevelDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string bytes;
    for (const std::string& token : *tokens) {
      std::string mapped;
      bool all = true;
      for (size_t pos = 0; pos < token.size() && all;) {
        const auto b = byte_level::CharToByte(utf8::Next(token, &pos));
        if (b) {
          mapped.push_back(static_cast<char>(*b));
        } else {
          all = false;
        }
      }
      bytes += all ? mapped : token;
    }
    *tokens = {utf8::Lossy(bytes)};
  }
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(char32_t replacement, bool strip_first)
      : replacement_(replacement), strip_first_(strip_first) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      const std::string& token = (*tokens)[i];
      std::string out;
      for (size_t pos = 0; pos < token.size();) {
        const char32_t c = utf8::Next(token, &pos);
        if (c != replacement_) {
          utf8::Append(c, &out);
        } else if (!(i == 0 && strip_first_)) {
          out.push_back(' ');
        }
      }
      (*tokens)[i] = std::move(out);
    }
  }

 private:
  char32_t replacement_;
  bool strip_first_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(Regex regex, std::string content)
      : regex_(std::move(regex)), content_(std::move(content)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& token : *tokens) {
      std::string out;
      size_t prev = 0;
      for (const auto& [begin, end] : regex_.FindAll(token)) {
        out.append(token, prev, begin - prev);
        out += content_;
        prev = end;
      }
      out.append(token, prev, std::string::npos);
      token = std::move(out);
    }
  }

 private:
  Regex regex_;
  std::string content_;
};

std::optional<uint8_t> ByteToken(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return {};
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int hi = hex(token[3]), lo = hex(token[4]);
  if (hi < 0 || lo < 0) return {};
  return static_cast<uint8_t>(hi * 16 + lo);
}

// Runs of <0xXX> tokens become their UTF-8 text, or one U+FFFD per byte if invalid.
class ByteFallbackDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    std::string bytes;
    auto flush = [&] {
      if (bytes.empty()) return;
      if (utf8::IsValid(bytes)) {
        out.push_back(bytes);
      } else {
        for (size_t i = 0; i < bytes.size(); ++i) out.emplace_back(utf8::kReplacementChar);
      }
      bytes.clear();
    };
    for (std::string& token : *tokens) {
      if (auto b = ByteToken(token)) {
        bytes.push_back(static_cast<char>(*b));
      } else {
        flush();
        out.push_back(std::move(token));
      }
    }
    flush();
    *tokens = std::move(out);
  }
};

class FuseDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string all;
    for (const std::string& t : *tokens) all += t;
    *tokens = {std::move(all)};
  }
};

// Removes up to `start` leading and `stop` trailing `content` characters from each token.
class StripDecoder : public Decoder {
 public:
  StripDecoder(char32_t content, int start, int stop)
      : content_(content), start_(start), stop_(stop) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& token : *tokens) {
      std::vector<char32_t> chars;
      for (size_t pos = 0; pos < token.size();) chars.push_back(utf8::Next(token, &pos));
      size_t begin = 0, end = chars.size();
      while (begin < static_cast<size_t>(start_) && begin < end && chars[begin] == content_) {
        ++begin;
      }
      for (int i = 0; i < stop_ && end > begin && chars[end - 1] == content_; ++i) --end;
      std::string out;
      for (size_t i = begin; i < end; ++i) utf8::Append(chars[i], &out);
      token = std::move(out);
    }
  }

 private:
  char32_t content_;
  int start_, stop_;
};

absl::StatusOr<char32_t> SingleChar(const Json& j, const char* key, std::string_view where) {
  ASSIGN_OR_RETURN(const std::string text, json_fields::String(j, key, where));
  size_t pos = 0;
  const char32_t c = text.empty() ? 0 : utf8::Next(text, &pos);
  if (text.empty() || pos != text.size()) {
    return json_fields::Error(where, absl::StrCat("\"", key, "\" must be one character"));
  }
  return c;
}

absl::StatusOr<std::unique_ptr<Decoder>> SequenceFromJson(const Json& j, std::string_view where) {
  const Json* list = json_fields::Find(j, "decoders");
  if (list == nullptr || !list->is_array()) {
    return json_fields::Error(where, "Sequence needs a \"decoders\" array");
  }
  std::vector<std::unique_ptr<Decoder>> parts;
  for (size_t i = 0; i < list->size(); ++i) {
    ASSIGN_OR_RETURN(auto part, DecoderFromJson((*list)[i], absl::StrCat(std::string(where),
                                                                         ".decoders[", i, "]")));
    if (part != nullptr) parts.push_back(std::move(part));
  }
  return std::make_unique<SequenceDecoder>(std::move(parts));
}

absl::StatusOr<std::unique_ptr<Decoder>> MetaspaceFromJson(const Json& j, std::string_view where) {
  ASSIGN_OR_RETURN(const char32_t replacement, SingleChar(j, "replacement", where));
  ASSIGN_OR_RETURN(auto scheme, json_fields::OptionalString(j, "prepend_scheme", where));
  bool strip_first;
  if (scheme) {
    strip_first = *scheme != "never";
  } else {
    ASSIGN_OR_RETURN(strip_first, json_fields::Bool(j, "add_prefix_space", where, true));
  }
  return std::make_unique<MetaspaceDecoder>(replacement, strip_first);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Decoder>> DecoderFromJson(const Json& j, std::string_view where) {
  if (j.is_null()) return std::unique_ptr<Decoder>();
  ASSIGN_OR_RETURN(const std::string type, json_fields::Type(j, where));
  if (type == "Sequence") return SequenceFromJson(j, where);
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") return MetaspaceFromJson(j, where);
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Replace") {
    const Json* pattern = json_fields::Find(j, "pattern");
    if (pattern == nullptr) return json_fields::Error(where, "Replace needs a \"pattern\"");
    ASSIGN_OR_RETURN(const std::string regex_text, PatternFromJson(*pattern, where));
    ASSIGN_OR_RETURN(Regex regex, Regex::Compile(regex_text));
    ASSIGN_OR_RETURN(std::string content, json_fields::String(j, "content", where));
    return std::make_unique<ReplaceDecoder>(std::move(regex), std::move(content));
  }
  if (type == "Strip") {
    ASSIGN_OR_RETURN(const char32_t content, SingleChar(j, "content", where));
    ASSIGN_OR_RETURN(const int64_t start, json_fields::Int(j, "start", where, 0));
    ASSIGN_OR_RETURN(const int64_t stop, json_fields::Int(j, "stop", where, 0));
    return std::make_unique<StripDecoder>(content, static_cast<int>(start), static_cast<int>(stop));
  }
  return absl::UnimplementedError(absl::StrCat("tokenizer.json: ", std::string(where),
                                               ": decoder type \"", type, "\" is not supported"));
}

}  // namespace tandem
