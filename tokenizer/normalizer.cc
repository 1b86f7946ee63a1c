#include "tokenizer/normalizer.h"

#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace tandem {
namespace {

using json_fields::Json;

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  void Normalize(std::string* text) const override {
    for (const auto& p : parts_) p->Normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void Normalize(std::string* text) const override {
    if (!text->empty()) text->insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(Regex regex, std::string content)
      : regex_(std::move(regex)), content_(std::move(content)) {}
  void Normalize(std::string* text) const override {
    std::string out;
    size_t prev = 0;
    for (const auto& [begin, end] : regex_.FindAll(*text)) {
      out.append(*text, prev, begin - prev);
      out += content_;
      prev = end;
    }
    out.append(*text, prev, std::string::npos);
    *text = std::move(out);
  }

 private:
  Regex regex_;
  std::string content_;
};

// Unicode normalization forms through ICU.
class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(const icu::Normalizer2* impl) : impl_(impl) {}
  void Normalize(std::string* text) const override {
    bool ascii = true;
    for (char c : *text) ascii &= static_cast<unsigned char>(c) < 0x80;
    if (ascii) return;  // ASCII is invariant under every form
    UErrorCode status = U_ZERO_ERROR;
    const icu::UnicodeString in = icu::UnicodeString::fromUTF8(*text);
    const icu::UnicodeString out = impl_->normalize(in, status);
    if (U_FAILURE(status)) return;  // leave the text as it is rather than lose it
    text->clear();
    out.toUTF8String(*text);
  }

 private:
  const icu::Normalizer2* impl_;  // owned by ICU
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void Normalize(std::string* text) const override {
    const std::string_view stripped = utf8::PythonStrip(*text);
    const size_t begin = left_ ? stripped.data() - text->data() : 0;
    const size_t end = right_ ? begin + stripped.size() : text->size();
    *text = text->substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

absl::StatusOr<std::unique_ptr<Normalizer>> UnicodeForm(const std::string& type,
                                                        std::string_view where) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* impl = type == "NFC"    ? icu::Normalizer2::getNFCInstance(status)
                                 : type == "NFD"  ? icu::Normalizer2::getNFDInstance(status)
                                 : type == "NFKC" ? icu::Normalizer2::getNFKCInstance(status)
                                                  : icu::Normalizer2::getNFKDInstance(status);
  if (U_FAILURE(status) || impl == nullptr) {
    return absl::InternalError(absl::StrCat("ICU has no ", type, " normalizer"));
  }
  return std::make_unique<UnicodeNormalizer>(impl);
}

absl::StatusOr<std::unique_ptr<Normalizer>> SequenceFromJson(const Json& j,
                                                             std::string_view where) {
  const Json* list = json_fields::Find(j, "normalizers");
  if (list == nullptr || !list->is_array()) {
    return json_fields::Error(where, "Sequence needs a \"normalizers\" array");
  }
  std::vector<std::unique_ptr<Normalizer>> parts;
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string item_where = absl::StrCat(std::string(where), ".normalizers[", i, "]");
    ASSIGN_OR_RETURN(auto part, NormalizerFromJson((*list)[i], item_where));
    if (part != nullptr) parts.push_back(std::move(part));
  }
  return std::make_unique<SequenceNormalizer>(std::move(parts));
}

}  // namespace

absl::StatusOr<std::string> PatternFromJson(const Json& j, std::string_view where) {
  if (const Json* s = json_fields::Find(j, "String"); s != nullptr && s->is_string()) {
    return Regex::Escape(s->get<std::string>());
  }
  if (const Json* r = json_fields::Find(j, "Regex"); r != nullptr && r->is_string()) {
    return r->get<std::string>();
  }
  return json_fields::Error(where, "pattern must be {\"String\": ...} or {\"Regex\": ...}");
}

absl::StatusOr<std::unique_ptr<Normalizer>> NormalizerFromJson(const Json& j,
                                                               std::string_view where) {
  if (j.is_null()) return std::unique_ptr<Normalizer>();
  ASSIGN_OR_RETURN(const std::string type, json_fields::Type(j, where));
  if (type == "Sequence") return SequenceFromJson(j, where);
  if (type == "Prepend") {
    ASSIGN_OR_RETURN(std::string prefix, json_fields::String(j, "prepend", where));
    return std::make_unique<PrependNormalizer>(std::move(prefix));
  }
  if (type == "Replace") {
    const Json* pattern = json_fields::Find(j, "pattern");
    if (pattern == nullptr) return json_fields::Error(where, "Replace needs a \"pattern\"");
    ASSIGN_OR_RETURN(const std::string regex_text, PatternFromJson(*pattern, where));
    ASSIGN_OR_RETURN(Regex regex, Regex::Compile(regex_text));
    ASSIGN_OR_RETURN(std::string content, json_fields::String(j, "content", where));
    return std::make_unique<ReplaceNormalizer>(std::move(regex), std::move(content));
  }
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    return UnicodeForm(type, where);
  }
  if (type == "Strip") {
    ASSIGN_OR_RETURN(const bool left, json_fields::Bool(j, "strip_left", where, true));
    ASSIGN_OR_RETURN(const bool right, json_fields::Bool(j, "strip_right", where, true));
    return std::make_unique<StripNormalizer>(left, right);
  }
  return absl::UnimplementedError(absl::StrCat(
      "tokenizer.json: ", std::string(where), ": normalizer type \"", type, "\" is not supported"));
}

}  // namespace tandem
