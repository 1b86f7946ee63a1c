#include "tokenizer/post_processor.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "tokenizer/json_fields.h"

namespace tandem {
namespace {

using json_fields::Json;

// The ids of a SpecialToken item: special_tokens[name].ids.
absl::StatusOr<std::vector<int32_t>> SpecialIds(const Json& special_tokens, const std::string& name,
                                                std::string_view where) {
  const Json* entry = json_fields::Find(special_tokens, name);
  const Json* ids = entry == nullptr ? nullptr : json_fields::Find(*entry, "ids");
  if (ids == nullptr || !ids->is_array()) {
    return json_fields::Error(where, absl::StrCat("special token \"", name, "\" has no ids"));
  }
  std::vector<int32_t> out;
  for (const Json& id : *ids) {
    if (!id.is_number_integer()) return json_fields::Error(where, "special token id is not int");
    out.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return out;
}

absl::Status TemplateFromJson(const Json& j, std::string_view where, PostProcessor* out) {
  const Json* single = json_fields::Find(j, "single");
  if (single == nullptr || !single->is_array()) {
    return json_fields::Error(where, "TemplateProcessing needs a \"single\" list");
  }
  const Json* special_tokens = json_fields::Find(j, "special_tokens");
  bool seen_sequence = false;
  for (const Json& item : *single) {
    if (json_fields::Find(item, "Sequence") != nullptr) {
      seen_sequence = true;
      continue;
    }
    const Json* special = json_fields::Find(item, "SpecialToken");
    if (special == nullptr || special_tokens == nullptr) {
      return json_fields::Error(where, "template item is neither Sequence nor SpecialToken");
    }
    ASSIGN_OR_RETURN(const std::string name, json_fields::String(*special, "id", where));
    ASSIGN_OR_RETURN(const std::vector<int32_t> ids, SpecialIds(*special_tokens, name, where));
    auto& target = seen_sequence ? out->suffix : out->prefix;
    target.insert(target.end(), ids.begin(), ids.end());
  }
  return absl::OkStatus();
}

// RobertaProcessing / BertProcessing: {"cls": [token, id], "sep": [token, id]}.
absl::Status ClsSepFromJson(const Json& j, std::string_view where, PostProcessor* out) {
  for (const char* key : {"cls", "sep"}) {
    const Json* pair = json_fields::Find(j, key);
    if (pair == nullptr || !pair->is_array() || pair->size() != 2 ||
        !(*pair)[1].is_number_integer()) {
      return json_fields::Error(where, absl::StrCat("\"", key, "\" must be [token, id]"));
    }
    (key[0] == 'c' ? out->prefix : out->suffix)
        .push_back(static_cast<int32_t>((*pair)[1].get<int64_t>()));
  }
  return absl::OkStatus();
}

absl::Status Parse(const Json& j, std::string_view where, PostProcessor* out) {
  if (j.is_null()) return absl::OkStatus();
  ASSIGN_OR_RETURN(const std::string type, json_fields::Type(j, where));
  if (type == "ByteLevel") return absl::OkStatus();
  if (type == "TemplateProcessing") return TemplateFromJson(j, where, out);
  if (type == "RobertaProcessing" || type == "BertProcessing") return ClsSepFromJson(j, where, out);
  if (type == "Sequence") {
    const Json* list = json_fields::Find(j, "processors");
    if (list == nullptr || !list->is_array()) {
      return json_fields::Error(where, "Sequence needs a \"processors\" array");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      RETURN_IF_ERROR(
          Parse((*list)[i], absl::StrCat(std::string(where), ".processors[", i, "]"), out));
    }
    return absl::OkStatus();
  }
  return absl::UnimplementedError(absl::StrCat("tokenizer.json: ", std::string(where),
                                               ": post-processor type \"", type,
                                               "\" is not supported"));
}

}  // namespace

void PostProcessor::Apply(std::vector<int32_t>* ids) const {
  ids->insert(ids->begin(), prefix.begin(), prefix.end());
  ids->insert(ids->end(), suffix.begin(), suffix.end());
}

absl::StatusOr<PostProcessor> PostProcessorFromJson(const Json& j, std::string_view where) {
  PostProcessor out;
  RETURN_IF_ERROR(Parse(j, where, &out));
  return out;
}

}  // namespace tandem
