// StopMatcher: applies stop strings to a stream of text deltas. Text that could still be the
// start of a stop string is held back (at most the longest stop string minus one byte, rounded
// back to a code point boundary), so a client never sees part of a stop string; the stop string
// itself is not emitted (OpenAI semantics). Not thread-safe (one per request).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tandem::router {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  // Appends a text delta (whole code points). Returns the text that is safe to emit now; sets
  // *stopped when a stop string completed (the returned text then ends right before it, and
  // further calls must not be made).
  std::string Add(std::string_view text, bool* stopped);
  // End of the stream: whatever was held back.
  std::string Flush();

 private:
  std::vector<std::string> stops_;
  size_t hold_bytes_ = 0;  // longest stop string - 1
  std::string pending_;    // held-back text, never containing a whole stop string
};

}  // namespace tandem::router
