// Tokenizer: loads a Hugging Face tokenizer.json (byte-level BPE — Llama 3, Qwen, GPT-2 — or
// SentencePiece-style BPE with "▁" and byte fallback — Llama 2, Mistral, TinyLlama) and encodes
// and decodes exactly as the `tokenizers` package does. Immutable after load: thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Reads DIR/tokenizer.json (and DIR/tokenizer_config.json for bos/eos/chat template family).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& dir);

  // Encodes text; special tokens written literally in the text are matched as special tokens.
  // add_special_tokens: prepend BOS etc. as the tokenizer's post-processor says.
  virtual std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens) const = 0;
  // Decodes ids to text (invalid UTF-8 byte sequences become U+FFFD, as `tokenizers` does).
  virtual std::string Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const = 0;

  virtual int vocab_size() const = 0;  // including added tokens
  virtual std::optional<int32_t> TokenToId(std::string_view token) const = 0;
  virtual bool IsSpecial(int32_t id) const = 0;
  virtual std::optional<int32_t> bos_id() const = 0;
  virtual std::optional<int32_t> eos_id() const = 0;
};

// Turns a growing token stream into text deltas that only ever contain whole UTF-8 code points
// (a token ending mid-character is held back until the character completes).
class IncrementalDetokenizer {
 public:
  IncrementalDetokenizer(const Tokenizer* tokenizer, bool skip_special_tokens);
  // Appends one token and returns the newly completed text (possibly empty).
  std::string Add(int32_t token);
  // Text still held back at the end of the stream (an incomplete code point becomes U+FFFD).
  std::string Flush();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  std::vector<int32_t> tokens_;
  size_t prefix_offset_ = 0;  // tokens before this index are fully emitted context
  size_t read_offset_ = 0;    // tokens before this index have had their text emitted
};

// Chat formatting for the supported families, chosen from the checkpoint.
struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};
enum class ChatTemplate { kChatML, kLlama3, kLlama2, kMistral };

}  // namespace tandem
