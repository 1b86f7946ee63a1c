// ServedModel: what the router needs of the model directory — the tokenizer, the chat template
// and the context length — without loading weights. Reads DIR/tokenizer.json,
// DIR/tokenizer_config.json and DIR/config.json.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "router/openai_request.h"
#include "tandem/v1/worker.pb.h"
#include "tokenizer/tokenizer.h"

namespace tandem::router {

struct ServedModel {
  std::string dir;
  std::unique_ptr<Tokenizer> tokenizer;
  ModelContext context;                // served name, max_model_len, vocab size, chat formatter
  tandem::v1::ModelIdentity identity;  // what registering workers must match
};

// served_name: empty → the directory's base name. max_model_len: 0 → config.json's
// max_position_embeddings. A model without a chat template formats chats as ChatML.
absl::StatusOr<ServedModel> LoadServedModel(const std::string& dir, std::string served_name,
                                            int max_model_len);

// The served name of a model directory: its base name ("/models/Llama-3-8B/" → "Llama-3-8B").
std::string DefaultServedName(const std::string& dir);

}  // namespace tandem::router
