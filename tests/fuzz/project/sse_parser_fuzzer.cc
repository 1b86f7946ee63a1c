// Fuzzes the load generator's SSE parser (loadgen/sse_parser.h) and chunk interpreter
// (loadgen/stream_chunk.h). Oracle: the events do not depend on how the bytes are split across
// reads — the input fed whole and fed in pieces (cut where its first bytes say) must give the
// same payloads.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/check.h"
#include "loadgen/sse_parser.h"
#include "loadgen/stream_chunk.h"

namespace {

std::vector<std::string> Events(std::string_view stream, const std::vector<size_t>& cuts) {
  tandem::loadgen::SseParser parser;
  std::vector<std::string> events;
  size_t pos = 0;
  for (size_t i = 0; i <= cuts.size(); ++i) {
    const size_t end =
        i < cuts.size() ? std::max(pos, std::min(cuts[i], stream.size())) : stream.size();
    for (std::string_view e : parser.Feed(stream.substr(pos, end - pos))) {
      events.emplace_back(e);
    }
    pos = end;
  }
  std::string last = parser.Finish();
  if (!last.empty()) events.push_back(std::move(last));
  return events;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  // First byte: how many cut points follow (each one byte, scaled); the rest is the stream.
  const size_t num_cuts = std::min<size_t>(data[0] % 8, size - 1);
  std::vector<size_t> cuts;
  size_t at = 0;
  for (size_t i = 0; i < num_cuts; ++i) {
    at += data[1 + i];
    cuts.push_back(at);
  }
  const std::string_view stream(reinterpret_cast<const char*>(data) + 1 + num_cuts,
                                size - 1 - num_cuts);
  const std::vector<std::string> whole = Events(stream, {});
  const std::vector<std::string> pieces = Events(stream, cuts);
  CHECK(whole == pieces) << "events depend on how the stream was split";
  for (const std::string& payload : whole) {
    (void)tandem::loadgen::ParseChunk(payload, /*want_text=*/true);
  }
  return 0;
}
