#include "loadgen/sse_parser.h"

namespace tandem::loadgen {
namespace {

// Index of the first CR or LF at or after `pos`, or npos. (A hand loop: find_first_of with a
// two-character set costs a memchr per byte.)
size_t FindLineEnd(std::string_view bytes, size_t pos) {
  for (size_t i = pos; i < bytes.size(); ++i) {
    if (bytes[i] == '\n' || bytes[i] == '\r') return i;
  }
  return std::string_view::npos;
}

}  // namespace

const std::vector<std::string_view>& SseParser::Feed(std::string_view bytes) {
  done_storage_.clear();
  done_.clear();
  view_indices_.clear();
  if (bytes.empty()) return done_;  // nothing read: a pending CR still waits for its LF
  size_t pos = 0;
  if (last_was_cr_ && bytes[0] == '\n') pos = 1;
  last_was_cr_ = false;
  while (pos < bytes.size()) {
    size_t end = FindLineEnd(bytes, pos);
    if (end == std::string_view::npos) {
      partial_line_.append(bytes.substr(pos));
      break;
    }
    std::string_view line = bytes.substr(pos, end - pos);
    if (!partial_line_.empty()) {
      partial_line_.append(line);
      HandleLine(partial_line_, /*stable=*/false);
      partial_line_.clear();
    } else {
      HandleLine(line, /*stable=*/true);
    }
    pos = end + 1;
    if (bytes[end] == '\r') {
      if (pos < bytes.size()) {
        if (bytes[pos] == '\n') ++pos;
      } else {
        last_was_cr_ = true;
      }
    }
  }
  if (single_view_.data() != nullptr) {  // the event continues in the next feed: copy it now
    data_.assign(single_view_);
    single_view_ = std::string_view();
  }
  // Events whose data is a single line of this feed are views into `bytes`; others are copies.
  size_t stored = 0;
  for (size_t i = 0; i < view_indices_.size(); ++i) {
    done_.push_back(view_indices_[i].empty() ? std::string_view(done_storage_[stored++])
                                             : view_indices_[i]);
  }
  return done_;
}

void SseParser::HandleLine(std::string_view line, bool stable) {
  if (line.empty()) {  // blank line: dispatch
    if (has_data_) {
      if (single_view_.data() != nullptr) {
        view_indices_.push_back(single_view_);
      } else {
        done_storage_.push_back(std::move(data_));
        view_indices_.push_back(std::string_view());
      }
    }
    data_.clear();
    has_data_ = false;
    single_view_ = std::string_view();
    return;
  }
  if (line[0] == ':') return;  // comment / keep-alive
  size_t colon = line.find(':');
  std::string_view field = line.substr(0, colon);
  if (field != "data") return;
  std::string_view value =
      colon == std::string_view::npos ? std::string_view() : line.substr(colon + 1);
  if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
  if (!has_data_ && stable && !value.empty()) {
    single_view_ = value;  // may stay a view if no other data line follows
  } else {
    if (single_view_.data() != nullptr) data_.assign(single_view_);
    single_view_ = std::string_view();
    if (has_data_) data_.push_back('\n');
    data_.append(value);
  }
  has_data_ = true;
}

std::string SseParser::Finish() {
  std::string_view line = partial_line_;
  if (line.substr(0, 5) == "data:") {
    std::string_view value = line.substr(5);
    if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
    if (has_data_) data_.push_back('\n');
    data_.append(value);
    has_data_ = true;
  }
  partial_line_.clear();
  std::string out = has_data_ ? std::move(data_) : std::string();
  data_.clear();
  has_data_ = false;
  return out;
}

}  // namespace tandem::loadgen
