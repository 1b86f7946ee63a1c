// The router tests' model over a ByteTokenizer (tests/tokenizer/byte_tokenizer.h).
#pragma once

#include <string>
#include <vector>

#include "router/openai_request.h"
#include "tests/tokenizer/byte_tokenizer.h"

namespace tandem::router::testing {

using ::tandem::testing::ByteTokenizer;

// A ModelContext over a ByteTokenizer: served name "tiny", context 256, ChatML-like formatting.
inline ModelContext ByteModelContext(const Tokenizer* tokenizer, int max_model_len = 256) {
  ModelContext ctx;
  ctx.served_name = "tiny";
  ctx.max_model_len = max_model_len;
  ctx.vocab_size = 258;
  ctx.tokenizer = tokenizer;
  ctx.chat_formatter = [](const std::vector<ChatMessage>& messages) {
    std::string text;
    for (const ChatMessage& m : messages) text += "<" + m.role + ">" + m.content + "\n";
    return absl::StatusOr<std::string>(text + "<assistant>");
  };
  return ctx;
}

}  // namespace tandem::router::testing
