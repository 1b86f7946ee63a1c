#include "router/served_model.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace tandem::router {
namespace {

absl::StatusOr<nlohmann::json> ReadJson(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json parsed = nlohmann::json::parse(text.str(), nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a JSON object"));
  }
  return parsed;
}

int IntField(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<int>() : 0;
}

}  // namespace

std::string DefaultServedName(const std::string& dir) {
  std::string_view d = dir;
  while (d.size() > 1 && d.back() == '/') d.remove_suffix(1);
  const size_t slash = d.rfind('/');
  return std::string(slash == std::string_view::npos ? d : d.substr(slash + 1));
}

absl::StatusOr<ServedModel> LoadServedModel(const std::string& dir, std::string served_name,
                                            int max_model_len) {
  ServedModel model;
  model.dir = dir;
  ASSIGN_OR_RETURN(nlohmann::json config, ReadJson(dir + "/config.json"));
  ASSIGN_OR_RETURN(model.tokenizer, Tokenizer::Load(dir));
  const int max_positions = IntField(config, "max_position_embeddings");
  const int vocab = std::max(IntField(config, "vocab_size"), model.tokenizer->vocab_size());
  ModelContext& ctx = model.context;
  ctx.served_name = served_name.empty() ? DefaultServedName(dir) : std::move(served_name);
  ctx.max_model_len = max_model_len > 0 ? max_model_len : max_positions;
  if (ctx.max_model_len <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, "/config.json has no max_position_embeddings; pass --max-model-len"));
  }
  ctx.vocab_size = vocab;
  ctx.tokenizer = model.tokenizer.get();
  absl::StatusOr<ChatTemplate> tmpl = LoadChatTemplate(dir);
  if (!tmpl.ok()) {
    LOG(WARNING) << "no usable chat template in " << dir << " (" << tmpl.status().message()
                 << "); formatting chats as ChatML";
  }
  const ChatTemplate chat = tmpl.value_or(ChatTemplate::kChatML);
  ctx.chat_formatter = [chat](const std::vector<ChatMessage>& messages) {
    return ApplyChatTemplate(chat, messages, /*add_generation_prompt=*/true);
  };
  tandem::v1::ModelIdentity& id = model.identity;
  id.set_name(ctx.served_name);
  id.set_vocab_size(IntField(config, "vocab_size"));
  id.set_num_layers(IntField(config, "num_hidden_layers"));
  id.set_num_kv_heads(IntField(config, "num_key_value_heads"));
  id.set_max_model_len(ctx.max_model_len);
  return model;
}

}  // namespace tandem::router
