#include "loadgen/sse_parser.h"

namespace tandem::loadgen {

const std::vector<std::string_view>& SseParser::Feed(std::string_view bytes) {
  done_storage_.clear();
  done_.clear();
  size_t pos = 0;
  if (last_was_cr_ && !bytes.empty() && bytes[0] == '\n') pos = 1;
  last_was_cr_ = false;
  while (pos < bytes.size()) {
    size_t end = bytes.find_first_of("\r\n", pos);
    if (end == std::string_view::npos) {
      partial_line_.append(bytes.substr(pos));
      break;
    }
    std::string_view line = bytes.substr(pos, end - pos);
    if (!partial_line_.empty()) {
      partial_line_.append(line);
      HandleLine(partial_line_);
      partial_line_.clear();
    } else {
      HandleLine(line);
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
  done_.reserve(done_storage_.size());
  for (const std::string& s : done_storage_) done_.push_back(s);
  return done_;
}

void SseParser::HandleLine(std::string_view line) {
  if (line.empty()) {  // blank line: dispatch
    if (has_data_) done_storage_.push_back(std::move(data_));
    data_.clear();
    has_data_ = false;
    return;
  }
  if (line[0] == ':') return;  // comment / keep-alive
  size_t colon = line.find(':');
  std::string_view field = line.substr(0, colon);
  if (field != "data") return;
  std::string_view value =
      colon == std::string_view::npos ? std::string_view() : line.substr(colon + 1);
  if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
  if (has_data_) data_.push_back('\n');
  data_.append(value);
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
