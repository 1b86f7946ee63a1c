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

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Reads DIR/tokenizer.json (and DIR/tokenizer_config.json for bos/eos/chat template family).
  // NotFound if tokenizer.json is missing; InvalidArgument naming the bad part for malformed
  // JSON; Unimplemented for components this implementation does not support.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& dir);
  // The same from the files' text (tokenizer_config_json may be empty: no bos/eos then).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(
      std::string_view tokenizer_json, std::string_view tokenizer_config_json);

  // Encodes text; special tokens written literally in the text are matched as special tokens.
  // Invalid UTF-8 in `text` is replaced by U+FFFD first.
  // add_special_tokens: prepend BOS etc. as the tokenizer's post-processor says.
  virtual std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens) const = 0;
  // Decodes ids to text (invalid UTF-8 byte sequences become U+FFFD, as `tokenizers` does).
  virtual std::string Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const = 0;

  virtual int vocab_size() const = 0;  // including added tokens
  virtual std::optional<int32_t> TokenToId(std::string_view token) const = 0;
  // True for the special tokens Decode(..., skip_special_tokens=true) drops.
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

// Picks the family from tokenizer_config.json's "chat_template" text by its markers:
// "<|im_start|>" → ChatML, "<|start_header_id|>" → Llama 3, "[INST]" with "<<SYS>>" → Llama 2,
// "[INST]" → Mistral. NotFound when the text carries none of them.
absl::StatusOr<ChatTemplate> DetectChatTemplate(std::string_view chat_template_text);
// Reads DIR/chat_template.jinja or DIR/tokenizer_config.json's chat_template and detects its
// family (NotFound if the checkpoint has no template).
absl::StatusOr<ChatTemplate> LoadChatTemplate(const std::string& dir);

// A checkpoint's chat format: the family plus, for ChatML, the system prompt the template
// inserts when the conversation has none (Qwen2: "You are a helpful assistant.", Qwen2.5:
// "You are Qwen, created by Alibaba Cloud. ..."; Qwen3 and our generated files: none).
struct ChatFormat {
  ChatTemplate tmpl = ChatTemplate::kChatML;
  std::string default_system_prompt;
};
absl::StatusOr<ChatFormat> DetectChatFormat(std::string_view chat_template_text);
absl::StatusOr<ChatFormat> LoadChatFormat(const std::string& dir);

// Formats a conversation exactly as transformers' apply_chat_template(tokenize=False) does with
// that family's template (ours as WriteTokenizerFiles writes it, and the real checkpoints' for
// plain-text conversations: Meta-Llama-3-Instruct, Llama-2-chat, Mistral-Instruct v0.1/v0.2,
// Qwen2/2.5 ChatML; tests check both). The BOS text is included where the template emits it,
// so encode the result with add_special_tokens=false. InvalidArgument for an empty
// conversation and for what the template rejects (Llama 2 / Mistral: user and assistant must
// alternate, Llama 2 after an optional system message; Mistral: no other roles).
absl::StatusOr<std::string> ApplyChatTemplate(const ChatFormat& format,
                                              const std::vector<ChatMessage>& messages,
                                              bool add_generation_prompt);
// The same with no default system prompt.
absl::StatusOr<std::string> ApplyChatTemplate(ChatTemplate tmpl,
                                              const std::vector<ChatMessage>& messages,
                                              bool add_generation_prompt);
// The Jinja source of that family's template, as written into tokenizer_config.json.
std::string_view ChatTemplateJinja(ChatTemplate tmpl);

// ---- Tokenizer files for generated checkpoints (`tandem make-model`) ----

// Families mirror what real checkpoints ship:
//   kLlama3  byte-level BPE, Llama 3 split regex, ignore_merges, <|begin_of_text|>, <|eot_id|>...
//   kQwen2   byte-level BPE, Qwen2 split regex, NFC, <|endoftext|>, <|im_start|>, <|im_end|>
//            (Qwen2, Qwen2.5 and Qwen3 share it)
//   kLlama2  SentencePiece-style BPE ("▁", byte fallback <0x00>..<0xFF>, <unk> <s> </s>) with
//            the Prepend/Replace normalizer of Llama 2 / TinyLlama files; Llama 2 chat template
//   kMistral the same model with the Metaspace pre-tokenizer newer files carry; [INST] template
enum class TokenizerFamily { kLlama3, kQwen2, kLlama2, kMistral };

struct TokenizerSpec {
  // Model vocabulary size: base symbols (256 bytes, or <unk> <s> </s> + 256 byte tokens +
  // characters) plus merges, special tokens excluded; special tokens get the ids right after
  // it. Merges are learned on an embedded multilingual corpus (about 2k tokens' worth); past
  // that, synthetic merges of learned tokens fill the vocabulary to exactly this size, so a
  // full-size preset (e.g. 128000 + 256 Llama 3 specials = 128256) decodes every id.
  int vocab_size = 512;
  // kLlama3 only: how many <|reserved_special_token_N|> to add after the 11 named ones
  // (the real checkpoints have 245, making 256 special tokens).
  int llama3_reserved_special_tokens = 0;
};

// What a checkpoint's config.json / generation_config.json need to know about the files.
struct GeneratedTokenizerInfo {
  int vocab_size = 0;  // total, including special tokens; the model's vocab may be larger
  std::optional<int32_t> bos_id;
  std::vector<int32_t> eos_ids;  // first one is tokenizer_config.json's eos_token
  std::optional<int32_t> pad_id;
};

// Writes DIR/tokenizer.json, DIR/tokenizer_config.json and DIR/special_tokens_map.json.
// Deterministic: the same family and spec give byte-identical files. DIR must exist.
absl::Status WriteTokenizerFiles(const std::string& dir, TokenizerFamily family,
                                 const TokenizerSpec& spec, GeneratedTokenizerInfo* info = nullptr);

}  // namespace tandem
