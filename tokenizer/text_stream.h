// TextStream: turns one request's stream of generated token ids into the text deltas a client
// sees, with stop strings applied. The one place tandem detokenizes output and matches stop
// strings.
//
// Why here and not in the engine: the engine knows tokens only. Token-level stops (stop token
// ids, EOS unless ignore_eos, max_tokens, max_model_len) end a request in the engine
// (engine/sample/stop_checker.h); text exists only where it is streamed: the router
// (router/request_flow*), which sees the whole stream of a request — the first token from the
// prefill worker and the rest from the decode worker — so a stop string straddling that boundary
// is found like any other, and `tandem generate` (deploy/cli/generate_command.cc). When a stop
// string matches, the caller ends the request in the engine (the router aborts it on the
// workers, which frees its pages) and reports finish_reason "stop".
//
// Rules:
//   - text comes from an IncrementalDetokenizer: deltas hold whole UTF-8 code points only;
//   - a completed stop string ends the stream: neither it nor anything after it is emitted
//     (OpenAI semantics; with `include_stop` the stop string itself is, vLLM's
//     include_stop_str_in_output); of several, the one found first (after the fewest tokens)
//     wins, and the text is cut where it starts (ends, with include_stop); matched_stop() names
//     it;
//   - text whose tail could still be the start of a stop string is held back, and released as
//     soon as it cannot be (or at Finish): a client never sees part of a stop string, and
//     never waits for text that cannot be one;
//   - every token passed in contributes its text, including one that ended the request in the
//     engine (a stop token id); skipped special tokens (EOS, usually) have none.
// Empty stop strings are ignored. Not thread-safe: one per request.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "tokenizer/tokenizer.h"

namespace tandem {

class TextStream {
 public:
  // `tokenizer` must outlive the stream.
  TextStream(const Tokenizer* tokenizer, bool skip_special_tokens, std::vector<std::string> stop,
             bool include_stop = false);

  struct Delta {
    std::string text;      // to emit now (possibly empty)
    int num_tokens = 0;    // how many of the tokens passed in the stream took (see Add)
    bool stopped = false;  // a stop string completed: the stream is over
  };

  // Appends generated tokens in order. num_tokens is tokens.size(), or, when a stop string
  // completes, the count up to and including the token that completed it (the rest are past
  // the end of the output). Once stopped, a call takes no token and returns no text.
  Delta Add(absl::Span<const int32_t> tokens);
  // The request ended for another reason (length, a stop token, ...): the held-back text and
  // the detokenizer's tail (an incomplete character becomes U+FFFD). That tail may still
  // complete a stop string (stopped is then set). Call it once, last; after a stop it returns
  // an empty Delta.
  Delta Finish();

  bool stopped() const { return stopped_; }
  // The stop string that ended the stream (empty until one did).
  const std::string& matched_stop() const { return matched_stop_; }

 private:
  // Appends `text` to the held text; returns what can be emitted now and sets stopped_ when a
  // stop string completed.
  std::string Scan(const std::string& text);

  IncrementalDetokenizer detokenizer_;
  std::vector<std::string> stop_;
  const bool include_stop_;
  std::string matched_stop_;
  std::string held_;  // not emitted yet: the longest tail that may start a stop string
  bool stopped_ = false;
};

}  // namespace tandem
