#include "tokenizer/hf_tokenizer.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/utf8.h"

namespace tandem {
namespace {

using json_fields::Json;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

std::optional<int32_t> ConfigTokenId(const Json& config, const char* key,
                                     const HfTokenizer& tokenizer) {
  const auto content = json_fields::TokenContent(config, key);
  if (!content) return std::nullopt;
  return tokenizer.TokenToId(*content);
}

absl::StatusOr<HfTokenizer::Parts> PartsFromJson(const Json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("tokenizer.json: not a JSON object");
  const Json* model = json_fields::Find(j, "model");
  if (model == nullptr || model->is_null()) {
    return absl::InvalidArgumentError("tokenizer.json: missing \"model\"");
  }
  HfTokenizer::Parts parts;
  ASSIGN_OR_RETURN(parts.model, BpeModel::FromJson(*model));
  static const Json kNull;
  auto member = [&](const char* key) -> const Json& {
    const Json* v = json_fields::Find(j, key);
    return v == nullptr ? kNull : *v;
  };
  ASSIGN_OR_RETURN(parts.normalizer, NormalizerFromJson(member("normalizer"), "normalizer"));
  ASSIGN_OR_RETURN(parts.pre_tokenizer,
                   PreTokenizerFromJson(member("pre_tokenizer"), "pre_tokenizer"));
  ASSIGN_OR_RETURN(parts.post_processor,
                   PostProcessorFromJson(member("post_processor"), "post_processor"));
  ASSIGN_OR_RETURN(parts.decoder, DecoderFromJson(member("decoder"), "decoder"));
  const Normalizer* normalizer = parts.normalizer.get();
  auto normalize = [normalizer](std::string* text) {
    if (normalizer != nullptr) normalizer->Normalize(text);
  };
  ASSIGN_OR_RETURN(parts.added, AddedVocabulary::FromJson(member("added_tokens"), normalize));
  return parts;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(
    std::string_view tokenizer_json, std::string_view tokenizer_config_json) {
  const Json j = Json::parse(tokenizer_json, nullptr, false);
  if (j.is_discarded()) return absl::InvalidArgumentError("tokenizer.json is not valid JSON");
  ASSIGN_OR_RETURN(HfTokenizer::Parts parts, PartsFromJson(j));
  auto tokenizer = std::make_unique<HfTokenizer>(std::move(parts));
  // The post-processor's special tokens must be ids of this vocabulary: Encode would otherwise
  // hand the engine ids beyond its embedding table (found by the tokenizer.json fuzzer).
  for (const std::vector<int32_t>* ids :
       {&tokenizer->post_processor().prefix, &tokenizer->post_processor().suffix}) {
    for (int32_t id : *ids) {
      if (id < 0 || id >= tokenizer->vocab_size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer.json: post_processor special token id ", id,
                         " is not in the vocabulary (", tokenizer->vocab_size(), " ids)"));
      }
    }
  }
  if (!tokenizer_config_json.empty()) {
    const Json config = Json::parse(tokenizer_config_json, nullptr, false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError("tokenizer_config.json is not a valid JSON object");
    }
    const auto bos = ConfigTokenId(config, "bos_token", *tokenizer);
    const auto eos = ConfigTokenId(config, "eos_token", *tokenizer);
    tokenizer->SetSpecialIds(bos, eos);
  }
  return tokenizer;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& dir) {
  ASSIGN_OR_RETURN(const std::string json, ReadFile(dir + "/tokenizer.json"));
  auto config = ReadFile(dir + "/tokenizer_config.json");
  return FromJson(json, config.ok() ? *config : std::string());
}

HfTokenizer::HfTokenizer(Parts parts) : p_(std::move(parts)) {
  vocab_size_ = p_.model->size();
  for (const AddedToken& t : p_.added.tokens()) vocab_size_ = std::max(vocab_size_, t.id + 1);
}

std::optional<int32_t> HfTokenizer::TokenToId(std::string_view token) const {
  if (const AddedToken* t = p_.added.FindByContent(token)) return t->id;
  return p_.model->TokenToId(token);
}

bool HfTokenizer::IsSpecial(int32_t id) const {
  const AddedToken* t = p_.added.FindById(id);
  return t != nullptr && t->skipped_when_decoding;
}

void HfTokenizer::EncodeText(std::string_view text, bool at_origin,
                             std::vector<int32_t>* ids) const {
  std::string normalized(text);
  if (p_.normalizer) p_.normalizer->Normalize(&normalized);
  if (!p_.added.has_normalized_tokens()) {
    EncodeNormalized(std::move(normalized), at_origin, ids);
    return;
  }
  for (const auto& s : p_.added.Split(normalized, AddedVocabulary::kNormalized)) {
    if (s.id >= 0) {
      ids->push_back(s.id);
    } else {
      EncodeNormalized(normalized.substr(s.begin, s.end - s.begin), at_origin && s.begin == 0, ids);
    }
  }
}

void HfTokenizer::EncodeNormalized(std::string normalized, bool at_origin,
                                   std::vector<int32_t>* ids) const {
  std::vector<PreToken> pieces = {{std::move(normalized), at_origin}};
  if (p_.pre_tokenizer) p_.pre_tokenizer->PreTokenize(&pieces);
  for (const PreToken& piece : pieces) p_.model->Tokenize(piece.text, ids);
}

std::vector<int32_t> HfTokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  std::string repaired;
  if (!utf8::IsValid(text)) {
    repaired = utf8::Lossy(text);
    text = repaired;
  }
  std::vector<int32_t> ids;
  for (const AddedVocabulary::Segment& s : p_.added.Split(text, AddedVocabulary::kRaw)) {
    if (s.id >= 0) {
      ids.push_back(s.id);
    } else {
      EncodeText(text.substr(s.begin, s.end - s.begin), s.begin == 0, &ids);
    }
  }
  if (add_special_tokens) p_.post_processor.Apply(&ids);
  return ids;
}

std::string HfTokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (const AddedToken* t = p_.added.FindById(id)) {
      if (!(skip_special_tokens && t->skipped_when_decoding)) tokens.push_back(t->pattern);
      continue;
    }
    const std::string_view token = p_.model->IdToToken(id);
    if (!token.empty()) tokens.emplace_back(token);  // unknown ids are dropped, as tokenizers does
  }
  if (!p_.decoder) {
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) absl::StrAppend(&joined, i ? " " : "", tokens[i]);
    return utf8::Lossy(joined);
  }
  p_.decoder->DecodeChain(&tokens);
  std::string out;
  for (const std::string& t : tokens) out += t;
  return utf8::Lossy(out);
}

}  // namespace tandem
