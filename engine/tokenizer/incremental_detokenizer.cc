// IncrementalDetokenizer: decodes a sliding window [prefix_offset_, end) and emits what it adds
// to the text of [prefix_offset_, read_offset_). Decoding a window rather than single tokens
// keeps decoder rules that look at neighbours right (SentencePiece's "▁" → " " with the
// leading space of the sequence stripped, byte-fallback and byte-level runs that complete a
// character). Text ending in U+FFFD is an incomplete character: it is held back until a later
// token completes it (or Flush gives up on it).
#include <vector>

#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/utf8.h"

namespace tandem {
namespace {

bool EndsWithReplacement(const std::string& text) {
  const std::string_view r = utf8::kReplacementChar;
  return text.size() >= r.size() && text.compare(text.size() - r.size(), r.size(), r) == 0;
}

}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer* tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string IncrementalDetokenizer::Add(int32_t token) {
  // Tokens Decode drops before the decoder chain (skipped special tokens, ids outside the
  // vocabulary) change nothing, so they never enter the window: a long run of them must not
  // make every later Add decode an ever-growing window.
  if (token < 0 || token >= tokenizer_->vocab_size() ||
      (skip_special_tokens_ && tokenizer_->IsSpecial(token))) {
    return "";
  }
  tokens_.push_back(token);
  const std::vector<int32_t> before(tokens_.begin() + prefix_offset_,
                                    tokens_.begin() + read_offset_);
  const std::vector<int32_t> window(tokens_.begin() + prefix_offset_, tokens_.end());
  const std::string prefix_text = tokenizer_->Decode(before, skip_special_tokens_);
  const std::string text = tokenizer_->Decode(window, skip_special_tokens_);
  if (text.size() <= prefix_text.size() || EndsWithReplacement(text)) return "";
  prefix_offset_ = read_offset_;
  read_offset_ = tokens_.size();
  return text.substr(prefix_text.size());
}

std::string IncrementalDetokenizer::Flush() {
  const std::vector<int32_t> before(tokens_.begin() + prefix_offset_,
                                    tokens_.begin() + read_offset_);
  const std::vector<int32_t> window(tokens_.begin() + prefix_offset_, tokens_.end());
  const std::string prefix_text = tokenizer_->Decode(before, skip_special_tokens_);
  const std::string text = tokenizer_->Decode(window, skip_special_tokens_);
  prefix_offset_ = read_offset_ = tokens_.size();
  if (text.size() <= prefix_text.size()) return "";
  return text.substr(prefix_text.size());
}

}  // namespace tandem
