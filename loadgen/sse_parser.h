// Incremental parser for Server-Sent Events (text/event-stream), fed with whatever bytes one
// socket read delivered. Follows the WHATWG framing: lines end in LF, CRLF or CR; `data:` lines
// accumulate (joined by "\n") until a blank line dispatches the event; lines starting with ':'
// are comments (keep-alives) and are skipped; other fields (event, id, retry) are ignored.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::loadgen {

class SseParser {
 public:
  // Appends bytes and returns the data payloads of every event completed by them, in order.
  // The views stay valid until the next call.
  const std::vector<std::string_view>& Feed(std::string_view bytes);
  // End of stream: an unterminated final `data:` line still counts as an event (servers that
  // omit the last blank line exist; `vllm bench serve` accepts them too). Returns "" if none.
  std::string Finish();

 private:
  // `stable`: the line lies in the caller's bytes (valid until the next Feed).
  void HandleLine(std::string_view line, bool stable);

  std::string partial_line_;  // bytes after the last line terminator
  bool last_was_cr_ = false;  // a CR ended the previous feed; skip a leading LF
  std::string data_;          // data of the event being assembled
  bool has_data_ = false;
  // An event's only data line, as a view into the current feed's bytes (no copy).
  std::string_view single_view_;
  std::vector<std::string> done_storage_;       // copied events of this feed
  std::vector<std::string_view> view_indices_;  // per event: its view, or empty = copied
  std::vector<std::string_view> done_;
};

}  // namespace tandem::loadgen
