#include "tokenizer/added_vocabulary.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/utf8.h"

namespace tandem {
namespace {

using json_fields::Json;

// Rust's char::is_whitespace (Unicode White_Space).
bool IsWhitespace(char32_t cp) {
  return cp != 0x1C && cp != 0x1D && cp != 0x1E && cp != 0x1F && utf8::IsPythonSpace(cp);
}

bool IsWordChar(char32_t cp) {
  if (cp < 0x80) return std::isalnum(static_cast<int>(cp)) || cp == '_';
  return !IsWhitespace(cp);
}

// Start of the whitespace run that ends at `end`.
size_t SkipSpaceBackward(std::string_view text, size_t end) {
  size_t pos = end;
  while (pos > 0) {
    size_t start = pos - 1;
    while (start > 0 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
    size_t p = start;
    if (!IsWhitespace(utf8::Next(text, &p))) break;
    pos = start;
  }
  return pos;
}

size_t SkipSpaceForward(std::string_view text, size_t pos) {
  while (pos < text.size()) {
    size_t p = pos;
    if (!IsWhitespace(utf8::Next(text, &p))) break;
    pos = p;
  }
  return pos;
}

bool WordCharBefore(std::string_view text, size_t pos) {
  if (pos == 0) return false;
  size_t start = pos - 1;
  while (start > 0 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
  return IsWordChar(utf8::Next(text, &start));
}

bool WordCharAt(std::string_view text, size_t pos) {
  return pos < text.size() && IsWordChar(utf8::Next(text, &pos));
}

}  // namespace

absl::StatusOr<AddedVocabulary> AddedVocabulary::FromJson(
    const Json& added_tokens, const std::function<void(std::string*)>& normalize) {
  AddedVocabulary vocab;
  if (added_tokens.is_null()) return vocab;
  if (!added_tokens.is_array()) return json_fields::Error("added_tokens", "not an array");
  for (size_t i = 0; i < added_tokens.size(); ++i) {
    const Json& t = added_tokens[i];
    const std::string where = absl::StrCat("added_tokens[", i, "]");
    AddedToken token;
    ASSIGN_OR_RETURN(const int64_t id, json_fields::Int(t, "id", where, -1));
    if (id < 0 || id >= (1 << 30)) return json_fields::Error(where, "missing or bad \"id\"");
    token.id = static_cast<int32_t>(id);
    ASSIGN_OR_RETURN(token.content, json_fields::String(t, "content", where));
    ASSIGN_OR_RETURN(token.special, json_fields::Bool(t, "special", where, false));
    ASSIGN_OR_RETURN(token.lstrip, json_fields::Bool(t, "lstrip", where, false));
    ASSIGN_OR_RETURN(token.rstrip, json_fields::Bool(t, "rstrip", where, false));
    ASSIGN_OR_RETURN(token.single_word, json_fields::Bool(t, "single_word", where, false));
    ASSIGN_OR_RETURN(token.normalized, json_fields::Bool(t, "normalized", where, false));
    vocab.by_id_[token.id] = vocab.tokens_.size();
    vocab.by_content_[token.content] = vocab.tokens_.size();
    vocab.tokens_.push_back(std::move(token));
  }
  for (size_t i = 0; i < vocab.tokens_.size(); ++i) {
    AddedToken& t = vocab.tokens_[i];
    t.pattern = t.content;
    if (t.normalized && normalize) normalize(&t.pattern);
    t.skipped_when_decoding = t.special && t.pattern == t.content;
    vocab.has_normalized_ |= t.normalized;
    if (!t.pattern.empty()) {
      vocab.by_first_byte_[t.normalized ? kNormalized : kRaw][static_cast<uint8_t>(t.pattern[0])]
          .push_back(i);
    }
  }
  for (auto& pass : vocab.by_first_byte_) {
    for (auto& list : pass) {
      std::stable_sort(list.begin(), list.end(), [&](size_t a, size_t b) {
        return vocab.tokens_[a].pattern.size() > vocab.tokens_[b].pattern.size();
      });
    }
  }
  return vocab;
}

const AddedToken* AddedVocabulary::FindById(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

const AddedToken* AddedVocabulary::FindByContent(std::string_view content) const {
  auto it = by_content_.find(content);
  return it == by_content_.end() ? nullptr : &tokens_[it->second];
}

const AddedToken* AddedVocabulary::LongestAt(std::string_view text, size_t pos, Pass pass) const {
  for (size_t i : by_first_byte_[pass][static_cast<uint8_t>(text[pos])]) {
    const std::string& p = tokens_[i].pattern;
    if (text.compare(pos, p.size(), p) == 0) return &tokens_[i];
  }
  return nullptr;
}

std::vector<AddedVocabulary::Segment> AddedVocabulary::Split(std::string_view text,
                                                             Pass pass) const {
  std::vector<Segment> segments;
  size_t start_offset = 0;  // end of the last emitted segment
  size_t pos = 0;
  while (pos < text.size()) {
    const AddedToken* token = LongestAt(text, pos, pass);
    if (token == nullptr) {
      ++pos;
      continue;
    }
    size_t begin = pos, end = pos + token->pattern.size();
    pos = end;  // a rejected match is still consumed, as in a non-overlapping match iterator
    if (token->single_word && (WordCharBefore(text, begin) || WordCharAt(text, end))) continue;
    if (token->lstrip) begin = std::max(SkipSpaceBackward(text, begin), start_offset);
    if (token->rstrip) end = SkipSpaceForward(text, end);
    if (begin > start_offset) segments.push_back({start_offset, begin, -1});
    segments.push_back({begin, end, token->id});
    start_offset = end;
    pos = end;
  }
  if (start_offset < text.size()) segments.push_back({start_offset, text.size(), -1});
  return segments;
}

}  // namespace tandem
