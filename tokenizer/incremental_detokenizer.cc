// IncrementalDetokenizer: decodes a sliding window [prefix_offset_, end) and emits what it adds
// to the text of [prefix_offset_, read_offset_). Decoding a window rather than single tokens
// keeps decoder rules that look at neighbours right (SentencePiece's "▁" → " " with the
// leading space of the sequence stripped, byte-fallback and byte-level runs that complete a
// character). Text ending in U+FFFD is an incomplete character: it is held back until a later
// token completes it (or Flush gives up on it).
//
// A later token can also change text already emitted: ByteFallback turns every byte token of an
// invalid run into U+FFFD, so "<0x40>" reads "@" alone but "\uFFFD" next to a stray "<0xD0>".
// Emitted text cannot be taken back; the delta is then what follows as many code points as were
// emitted (as vLLM does), never a cut inside a character: deltas are always valid UTF-8.
#include <vector>

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace tandem {
namespace {

bool EndsWithReplacement(const std::string& text) {
  const std::string_view r = utf8::kReplacementChar;
  return text.size() >= r.size() && text.compare(text.size() - r.size(), r.size(), r) == 0;
}

// What `text` adds to `prefix_text`: the bytes after it when it is a prefix of `text` (the
// usual case), else what follows its number of code points.
std::string DeltaAfter(const std::string& text, const std::string& prefix_text) {
  if (text.compare(0, prefix_text.size(), prefix_text) == 0) return text.substr(prefix_text.size());
  size_t emitted = 0;
  for (size_t pos = 0; pos < prefix_text.size(); ++emitted) utf8::Next(prefix_text, &pos);
  size_t cut = 0;
  for (size_t i = 0; i < emitted && cut < text.size(); ++i) utf8::Next(text, &cut);
  return text.substr(cut);
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
  return DeltaAfter(text, prefix_text);
}

std::string IncrementalDetokenizer::Flush() {
  const std::vector<int32_t> before(tokens_.begin() + prefix_offset_,
                                    tokens_.begin() + read_offset_);
  const std::vector<int32_t> window(tokens_.begin() + prefix_offset_, tokens_.end());
  const std::string prefix_text = tokenizer_->Decode(before, skip_special_tokens_);
  const std::string text = tokenizer_->Decode(window, skip_special_tokens_);
  prefix_offset_ = read_offset_ = tokens_.size();
  if (text.size() <= prefix_text.size()) return "";
  return DeltaAfter(text, prefix_text);
}

}  // namespace tandem
