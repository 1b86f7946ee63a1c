#include "tokenizer/pre_tokenizer.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/regex.h"

namespace tandem {
namespace {

using json_fields::Json;

// GPT-2's pattern, used by ByteLevel when use_regex is set.
constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct Span {
  size_t begin, end;
  bool is_match;
};

// The pieces of `text` that `behavior` keeps, given spans covering it (tokenizers'
// NormalizedString::split).
std::vector<std::pair<size_t, size_t>> ApplyBehavior(const std::vector<Span>& spans,
                                                     Behavior behavior) {
  std::vector<std::pair<size_t, size_t>> out;
  bool previous_match = false;
  switch (behavior) {
    case Behavior::kRemoved:
      for (const Span& s : spans) {
        if (!s.is_match) out.emplace_back(s.begin, s.end);
      }
      return out;
    case Behavior::kIsolated:
      for (const Span& s : spans) out.emplace_back(s.begin, s.end);
      return out;
    case Behavior::kContiguous:
    case Behavior::kMergedWithPrevious:
      for (const Span& s : spans) {
        const bool merge = behavior == Behavior::kContiguous ? s.is_match == previous_match
                                                             : s.is_match && !previous_match;
        if (merge && !out.empty()) {
          out.back().second = s.end;
        } else {
          out.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      return out;
    case Behavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !out.empty()) {
          out.back().first = it->begin;
        } else {
          out.emplace_back(it->begin, it->end);
        }
        previous_match = it->is_match;
      }
      return {out.rbegin(), out.rend()};
  }
  return out;
}

std::vector<Span> MatchSpans(const Regex& regex, std::string_view text, bool invert) {
  std::vector<Span> spans;
  size_t prev = 0;
  for (const auto& [begin, end] : regex.FindAll(text)) {
    if (begin > prev) spans.push_back({prev, begin, invert});
    spans.push_back({begin, end, !invert});
    prev = end;
  }
  if (prev < text.size()) spans.push_back({prev, text.size(), invert});
  return spans;
}

void SplitPieces(const Regex& regex, Behavior behavior, bool invert,
                 std::vector<PreToken>* pieces) {
  std::vector<PreToken> out;
  for (PreToken& piece : *pieces) {
    const auto spans = MatchSpans(regex, piece.text, invert);
    for (const auto& [begin, end] : ApplyBehavior(spans, behavior)) {
      if (end > begin)
        out.push_back({piece.text.substr(begin, end - begin), piece.at_origin && begin == 0});
    }
  }
  *pieces = std::move(out);
}

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  void PreTokenize(std::vector<PreToken>* pieces) const override {
    for (const auto& p : parts_) p->PreTokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(Regex regex, Behavior behavior, bool invert)
      : regex_(std::move(regex)), behavior_(behavior), invert_(invert) {}
  void PreTokenize(std::vector<PreToken>* pieces) const override {
    SplitPieces(regex_, behavior_, invert_, pieces);
  }

 private:
  Regex regex_;
  Behavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::optional<Regex> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}
  void PreTokenize(std::vector<PreToken>* pieces) const override {
    if (add_prefix_space_) {
      for (PreToken& p : *pieces) {
        if (p.text.empty() || p.text[0] != ' ') p.text.insert(0, " ");
      }
    }
    if (regex_) SplitPieces(*regex_, Behavior::kIsolated, false, pieces);
    for (PreToken& p : *pieces) p.text = byte_level::Encode(p.text);
  }

 private:
  bool add_prefix_space_;
  std::optional<Regex> regex_;
};

enum class PrependScheme { kAlways, kFirst, kNever };

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, std::optional<Regex> split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(std::move(split)) {}
  void PreTokenize(std::vector<PreToken>* pieces) const override {
    for (PreToken& p : *pieces) {
      std::string text;
      for (char c : p.text) {
        if (c == ' ') {
          text += replacement_;
        } else {
          text.push_back(c);
        }
      }
      const bool starts = text.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (scheme_ == PrependScheme::kAlways ||
                      (scheme_ == PrependScheme::kFirst && p.at_origin))) {
        text.insert(0, replacement_);
      }
      p.text = std::move(text);
    }
    if (split_) SplitPieces(*split_, Behavior::kMergedWithNext, false, pieces);
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  std::optional<Regex> split_;
};

absl::StatusOr<Behavior> ParseBehavior(const Json& j, std::string_view where) {
  ASSIGN_OR_RETURN(const std::string name, json_fields::String(j, "behavior", where));
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  return json_fields::Error(where, absl::StrCat("unknown split behavior \"", name, "\""));
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> SplitFromJson(const Json& j, std::string_view where) {
  const Json* pattern = json_fields::Find(j, "pattern");
  if (pattern == nullptr) return json_fields::Error(where, "Split needs a \"pattern\"");
  ASSIGN_OR_RETURN(const std::string regex_text, PatternFromJson(*pattern, where));
  ASSIGN_OR_RETURN(Regex regex, Regex::Compile(regex_text));
  ASSIGN_OR_RETURN(const Behavior behavior, ParseBehavior(j, where));
  ASSIGN_OR_RETURN(const bool invert, json_fields::Bool(j, "invert", where, false));
  return std::make_unique<SplitPreTokenizer>(std::move(regex), behavior, invert);
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> ByteLevelFromJson(const Json& j,
                                                                std::string_view where) {
  ASSIGN_OR_RETURN(const bool prefix, json_fields::Bool(j, "add_prefix_space", where, true));
  ASSIGN_OR_RETURN(const bool use_regex, json_fields::Bool(j, "use_regex", where, true));
  std::optional<Regex> regex;
  if (use_regex) {
    ASSIGN_OR_RETURN(regex, Regex::Compile(kGpt2Regex));
  }
  return std::make_unique<ByteLevelPreTokenizer>(prefix, std::move(regex));
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> MetaspaceFromJson(const Json& j,
                                                                std::string_view where) {
  ASSIGN_OR_RETURN(std::string replacement, json_fields::String(j, "replacement", where));
  ASSIGN_OR_RETURN(auto scheme_name, json_fields::OptionalString(j, "prepend_scheme", where));
  PrependScheme scheme;
  if (!scheme_name) {  // older files: add_prefix_space
    ASSIGN_OR_RETURN(const bool prefix, json_fields::Bool(j, "add_prefix_space", where, true));
    scheme = prefix ? PrependScheme::kAlways : PrependScheme::kNever;
  } else if (*scheme_name == "always") {
    scheme = PrependScheme::kAlways;
  } else if (*scheme_name == "first") {
    scheme = PrependScheme::kFirst;
  } else if (*scheme_name == "never") {
    scheme = PrependScheme::kNever;
  } else {
    return json_fields::Error(where, absl::StrCat("unknown prepend_scheme \"", *scheme_name, "\""));
  }
  ASSIGN_OR_RETURN(const bool split, json_fields::Bool(j, "split", where, true));
  std::optional<Regex> split_regex;
  if (split) {
    ASSIGN_OR_RETURN(split_regex, Regex::Compile(Regex::Escape(replacement)));
  }
  return std::make_unique<MetaspacePreTokenizer>(std::move(replacement), scheme,
                                                 std::move(split_regex));
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> SequenceFromJson(const Json& j,
                                                               std::string_view where) {
  const Json* list = json_fields::Find(j, "pretokenizers");
  if (list == nullptr || !list->is_array()) {
    return json_fields::Error(where, "Sequence needs a \"pretokenizers\" array");
  }
  std::vector<std::unique_ptr<PreTokenizer>> parts;
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string item_where = absl::StrCat(std::string(where), ".pretokenizers[", i, "]");
    ASSIGN_OR_RETURN(auto part, PreTokenizerFromJson((*list)[i], item_where));
    if (part != nullptr) parts.push_back(std::move(part));
  }
  return std::make_unique<SequencePreTokenizer>(std::move(parts));
}

}  // namespace

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizerFromJson(const Json& j,
                                                                   std::string_view where) {
  if (j.is_null()) return std::unique_ptr<PreTokenizer>();
  ASSIGN_OR_RETURN(const std::string type, json_fields::Type(j, where));
  if (type == "Sequence") return SequenceFromJson(j, where);
  if (type == "Split") return SplitFromJson(j, where);
  if (type == "ByteLevel") return ByteLevelFromJson(j, where);
  if (type == "Metaspace") return MetaspaceFromJson(j, where);
  if (type == "Digits") {
    ASSIGN_OR_RETURN(const bool single, json_fields::Bool(j, "individual_digits", where, false));
    ASSIGN_OR_RETURN(Regex regex, Regex::Compile(single ? "\\p{N}" : "\\p{N}+"));
    return std::make_unique<SplitPreTokenizer>(std::move(regex), Behavior::kIsolated, false);
  }
  return absl::UnimplementedError(absl::StrCat("tokenizer.json: ", std::string(where),
                                               ": pre-tokenizer type \"", type,
                                               "\" is not supported"));
}

}  // namespace tandem
