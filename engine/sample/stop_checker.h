// StopChecker: per-request stop logic and text streaming, applied to each sampled token in
// this order:
//   1. a token in stop_token_ids, or an EOS id (unless ignore_eos): finish kStop; the token is
//      returned to the caller but its text is not emitted;
//   2. a stop string completed in the text: finish kStop; the stop string and anything after
//      it are not emitted;
//   3. max_tokens reached, or the sequence reached max_model_len: finish kLength.
// Text is produced by an IncrementalDetokenizer (whole UTF-8 code points only). While the end
// of the text could still be the start of a stop string it is held back; it is released once
// it cannot be, or when the request finishes for another reason.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/tokenizer/tokenizer.h"

namespace tandem {

class StopChecker {
 public:
  // `tokenizer` may be null (no text, no stop strings); it must outlive the checker.
  StopChecker(const SamplingParams& params, std::vector<int> eos_token_ids,
              const Tokenizer* tokenizer);

  struct Result {
    std::string text;  // text to emit for this token (possibly empty)
    FinishReason finish_reason = FinishReason::kNone;
  };

  // Processes one sampled token. `num_output_tokens` counts it; `num_tokens` is the sequence
  // length (prompt + output) including it.
  Result Add(int32_t token, int num_output_tokens, int num_tokens, int max_model_len);

  // Feeds a token whose text was already emitted elsewhere (the first token of a request that
  // was prefilled by another worker): it only becomes detokenization context.
  void Prime(int32_t token);

  // Returns and forgets the text held back for stop strings (a prefill worker hands the request
  // over after its first token: what it held would otherwise be lost).
  std::string ReleaseHeldText();

 private:
  bool IsStopToken(int32_t token) const;
  // Appends `delta` to the held text; returns what can be emitted now and sets *matched if a
  // stop string completed.
  std::string Scan(const std::string& delta, bool* matched);
  std::string FlushAll();

  SamplingParams params_;
  std::vector<int> eos_token_ids_;
  std::optional<IncrementalDetokenizer> detokenizer_;
  std::string held_;  // text not emitted yet: the longest tail that may start a stop string
};

}  // namespace tandem
