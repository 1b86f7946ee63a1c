#include "tokenizer/text_stream.h"

#include <algorithm>
#include <utility>

namespace tandem {
namespace {

// Length of the longest suffix of `text` that is a proper prefix of some stop string.
size_t HoldBackLength(const std::string& text, const std::vector<std::string>& stops) {
  size_t best = 0;
  for (const std::string& stop : stops) {
    const size_t max_len = std::min(text.size(), stop.size() - 1);
    for (size_t len = max_len; len > best; --len) {
      if (text.compare(text.size() - len, len, stop, 0, len) == 0) {
        best = len;
        break;
      }
    }
  }
  return best;
}

bool IsContinuationByte(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

}  // namespace

TextStream::TextStream(const Tokenizer* tokenizer, bool skip_special_tokens,
                       std::vector<std::string> stop, bool include_stop)
    : detokenizer_(tokenizer, skip_special_tokens),
      stop_(std::move(stop)),
      include_stop_(include_stop) {
  std::erase_if(stop_, [](const std::string& s) { return s.empty(); });
}

std::string TextStream::Scan(const std::string& text) {
  if (stop_.empty()) return text;
  held_ += text;
  // Every occurrence of a stop string starts inside held_: the text emitted before it ended
  // with no proper prefix of any stop string.
  size_t first = std::string::npos;
  const std::string* matched = nullptr;
  for (const std::string& stop : stop_) {
    const size_t at = held_.find(stop);
    if (at < first) {
      first = at;
      matched = &stop;
    }
  }
  if (matched != nullptr) {
    stopped_ = true;
    matched_stop_ = *matched;
    std::string out = held_.substr(0, include_stop_ ? first + matched->size() : first);
    held_.clear();
    return out;
  }
  size_t cut = held_.size() - HoldBackLength(held_, stop_);
  // Whole code points only, even for a stop string that starts with a continuation byte.
  while (cut > 0 && cut < held_.size() && IsContinuationByte(held_[cut])) --cut;
  std::string out = held_.substr(0, cut);
  held_.erase(0, cut);
  return out;
}

TextStream::Delta TextStream::Add(absl::Span<const int32_t> tokens) {
  Delta delta;
  for (int32_t token : tokens) {
    if (stopped_) break;
    ++delta.num_tokens;
    delta.text += Scan(detokenizer_.Add(token));
  }
  delta.stopped = stopped_;
  return delta;
}

TextStream::Delta TextStream::Finish() {
  Delta delta;
  if (stopped_) return delta;
  delta.text = Scan(detokenizer_.Flush());
  delta.stopped = stopped_;
  if (!stopped_) {
    delta.text += held_;
    held_.clear();
  }
  return delta;
}

}  // namespace tandem
