#include "router/stop_matcher.h"

#include <algorithm>

namespace tandem::router {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const std::string& stop : stops_) {
    hold_bytes_ = std::max(hold_bytes_, stop.empty() ? 0 : stop.size() - 1);
  }
}

std::string StopMatcher::Add(std::string_view text, bool* stopped) {
  *stopped = false;
  if (stops_.empty()) return std::string(text);
  pending_.append(text);
  size_t first = std::string::npos;
  for (const std::string& stop : stops_) {
    if (stop.empty()) continue;
    first = std::min(first, pending_.find(stop));
  }
  if (first != std::string::npos) {
    *stopped = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  if (pending_.size() <= hold_bytes_) return std::string();
  size_t cut = pending_.size() - hold_bytes_;
  // Never split a code point: back up over UTF-8 continuation bytes.
  while (cut > 0 && (static_cast<unsigned char>(pending_[cut]) & 0xC0) == 0x80) --cut;
  std::string out = pending_.substr(0, cut);
  pending_.erase(0, cut);
  return out;
}

std::string StopMatcher::Flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace tandem::router
