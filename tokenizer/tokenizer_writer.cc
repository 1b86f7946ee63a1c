// WriteTokenizerFiles: tokenizer.json, tokenizer_config.json and special_tokens_map.json for
// generated checkpoints, shaped like the files real Llama 3, Qwen2/3, Llama 2 and Mistral
// checkpoints ship, so the loader is exercised on the same structure it meets in the wild.
#include <algorithm>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"
#include "tokenizer/generated_vocab.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;

struct AddedToken {
  int32_t id;
  std::string content;
  bool special;
};

struct Layout {
  GeneratedVocab vocab;
  std::vector<AddedToken> added;       // in id order
  std::string bos, eos, pad, unk;      // empty: none
  std::vector<std::string> extra_eos;  // generation_config's other EOS tokens
};

bool IsSentencePiece(TokenizerFamily f) {
  return f == TokenizerFamily::kLlama2 || f == TokenizerFamily::kMistral;
}

Layout MakeLayout(TokenizerFamily family, const TokenizerSpec& spec) {
  Layout layout;
  layout.vocab = TrainGeneratedVocab(family, spec.vocab_size);
  auto next_id = static_cast<int32_t>(layout.vocab.tokens.size());
  auto add = [&](std::string content, bool special) {
    layout.added.push_back({next_id++, std::move(content), special});
  };
  switch (family) {
    case TokenizerFamily::kLlama3:
      for (const char* t : {"<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                            "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>",
                            "<|reserved_special_token_2|>", "<|start_header_id|>",
                            "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"}) {
        add(t, true);
      }
      for (int i = 0; i < spec.llama3_reserved_special_tokens; ++i) {
        add(absl::StrCat("<|reserved_special_token_", 3 + i, "|>"), true);
      }
      layout.bos = "<|begin_of_text|>";
      layout.eos = "<|eot_id|>";
      layout.extra_eos = {"<|end_of_text|>", "<|eom_id|>"};
      break;
    case TokenizerFamily::kQwen2:
      add("<|endoftext|>", true);
      add("<|im_start|>", true);
      add("<|im_end|>", true);
      for (const char* t : {"<tool_call>", "</tool_call>", "<think>", "</think>"}) add(t, false);
      layout.eos = "<|im_end|>";
      layout.pad = "<|endoftext|>";
      layout.extra_eos = {"<|endoftext|>"};
      break;
    case TokenizerFamily::kLlama2:
    case TokenizerFamily::kMistral:
      // <unk> <s> </s> are ids 0..2 of the model vocabulary and also added tokens.
      layout.added = {{0, "<unk>", true}, {1, "<s>", true}, {2, "</s>", true}};
      layout.bos = "<s>";
      layout.eos = "</s>";
      layout.unk = "<unk>";
      break;
  }
  return layout;
}

Json AddedTokenJson(const AddedToken& t, bool with_id) {
  Json j;
  if (with_id) j["id"] = t.id;
  j["content"] = t.content;
  j["single_word"] = false;
  j["lstrip"] = false;
  j["rstrip"] = false;
  j["normalized"] = false;
  j["special"] = t.special;
  return j;
}

Json ByteLevelJson(bool add_prefix_space, bool trim_offsets, bool use_regex) {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", add_prefix_space},
          {"trim_offsets", trim_offsets},
          {"use_regex", use_regex}};
}

Json SplitJson(std::string_view regex) {
  return {{"type", "Split"},
          {"pattern", {{"Regex", regex}}},
          {"behavior", "Isolated"},
          {"invert", false}};
}

Json BosTemplateJson(const std::string& bos, int32_t bos_id) {
  auto special = [&](int type_id) {
    return Json{{"SpecialToken", {{"id", bos}, {"type_id", type_id}}}};
  };
  auto seq = [](const char* id, int type_id) {
    return Json{{"Sequence", {{"id", id}, {"type_id", type_id}}}};
  };
  return {{"type", "TemplateProcessing"},
          {"single", Json::array({special(0), seq("A", 0)})},
          {"pair", Json::array({special(0), seq("A", 0), special(1), seq("B", 1)})},
          {"special_tokens", {{bos, {{"id", bos}, {"ids", {bos_id}}, {"tokens", {bos}}}}}}};
}

Json SentencePieceDecoderJson() {
  return {
      {"type", "Sequence"},
      {"decoders",
       Json::array({{{"type", "Replace"}, {"pattern", {{"String", kMetaspace}}}, {"content", " "}},
                    {{"type", "ByteFallback"}},
                    {{"type", "Fuse"}},
                    {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
}

constexpr const char* kVocabPlaceholder = "@@vocab@@";
constexpr const char* kMergesPlaceholder = "@@merges@@";

Json ModelJson(TokenizerFamily family, const GeneratedVocab& vocab) {
  const bool sp = IsSentencePiece(family);
  const bool qwen = family == TokenizerFamily::kQwen2;
  Json model = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", sp ? Json("<unk>") : Json(nullptr)},
                // Qwen's files write "" where others write null.
                {"continuing_subword_prefix", qwen ? Json("") : Json(nullptr)},
                {"end_of_word_suffix", qwen ? Json("") : Json(nullptr)},
                {"fuse_unk", sp},
                {"byte_fallback", sp}};
  if (family == TokenizerFamily::kLlama3) model["ignore_merges"] = true;
  // vocab and merges are spliced in as text by TokenizerJsonText: ordered_json inserts in
  // linear time, far too slow for 150k-token vocabularies.
  model["vocab"] = kVocabPlaceholder;
  model["merges"] = kMergesPlaceholder;
  return model;
}

void SetPipeline(TokenizerFamily family, const Layout& layout, Json* j) {
  switch (family) {
    case TokenizerFamily::kLlama3:
      (*j)["normalizer"] = nullptr;
      (*j)["pre_tokenizer"] = {{"type", "Sequence"},
                               {"pretokenizers", Json::array({SplitJson(kLlama3SplitRegex),
                                                              ByteLevelJson(false, true, false)})}};
      (*j)["post_processor"] = {
          {"type", "Sequence"},
          {"processors", Json::array({ByteLevelJson(true, false, true),
                                      BosTemplateJson(layout.bos, layout.added[0].id)})}};
      (*j)["decoder"] = ByteLevelJson(true, true, true);
      break;
    case TokenizerFamily::kQwen2:
      (*j)["normalizer"] = {{"type", "NFC"}};
      (*j)["pre_tokenizer"] = {
          {"type", "Sequence"},
          {"pretokenizers",
           Json::array({SplitJson(kQwen2SplitRegex), ByteLevelJson(false, false, false)})}};
      (*j)["post_processor"] = ByteLevelJson(false, false, false);
      (*j)["decoder"] = ByteLevelJson(false, false, false);
      break;
    case TokenizerFamily::kLlama2:
      (*j)["normalizer"] = {
          {"type", "Sequence"},
          {"normalizers",
           Json::array(
               {{{"type", "Prepend"}, {"prepend", kMetaspace}},
                {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kMetaspace}}})}};
      (*j)["pre_tokenizer"] = nullptr;
      (*j)["post_processor"] = BosTemplateJson(layout.bos, 1);
      (*j)["decoder"] = SentencePieceDecoderJson();
      break;
    case TokenizerFamily::kMistral:
      (*j)["normalizer"] = nullptr;
      (*j)["pre_tokenizer"] = {{"type", "Metaspace"},
                               {"replacement", kMetaspace},
                               {"prepend_scheme", "first"},
                               {"split", false}};
      (*j)["post_processor"] = BosTemplateJson(layout.bos, 1);
      (*j)["decoder"] = SentencePieceDecoderJson();
      break;
  }
}

Json TokenizerJson(TokenizerFamily family, const Layout& layout) {
  Json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  Json added = Json::array();
  for (const AddedToken& t : layout.added) added.push_back(AddedTokenJson(t, true));
  j["added_tokens"] = std::move(added);
  SetPipeline(family, layout, &j);
  j["model"] = ModelJson(family, layout.vocab);
  return j;
}

// tokenizer.json text: the pipeline as formatted JSON, vocab and merges one entry per line (old
// files write merges as "a b" strings, newer ones as [a, b] pairs: we write both kinds).
std::string TokenizerJsonText(TokenizerFamily family, const Layout& layout) {
  const GeneratedVocab& vocab = layout.vocab;
  std::string vocab_text = "{";
  for (size_t i = 0; i < vocab.tokens.size(); ++i) {
    absl::StrAppend(&vocab_text, i ? "," : "", "\n      ", Json(vocab.tokens[i]).dump(), ": ", i);
  }
  vocab_text += "\n    }";
  std::string merges_text = "[";
  for (size_t i = 0; i < vocab.merges.size(); ++i) {
    const auto& [a, b] = vocab.merges[i];
    const Json merge =
        IsSentencePiece(family) ? Json(absl::StrCat(a, " ", b)) : Json::array({a, b});
    absl::StrAppend(&merges_text, i ? "," : "", "\n      ", merge.dump());
  }
  merges_text += "\n    ]";
  std::string text = TokenizerJson(family, layout).dump(2);
  for (const auto& [placeholder, value] : {std::make_pair(kVocabPlaceholder, &vocab_text),
                                           std::make_pair(kMergesPlaceholder, &merges_text)}) {
    const std::string quoted = absl::StrCat("\"", placeholder, "\"");
    const size_t pos = text.find(quoted);
    CHECK(pos != std::string::npos) << placeholder;
    text.replace(pos, quoted.size(), *value);
  }
  return text;
}

Json OrNull(const std::string& s) { return s.empty() ? Json(nullptr) : Json(s); }

Json TokenizerConfigJson(TokenizerFamily family, const Layout& layout) {
  Json j;
  const bool sp = IsSentencePiece(family);
  if (sp) {
    j["add_bos_token"] = true;
    j["add_eos_token"] = false;
  }
  Json decoder = Json::object();
  for (const AddedToken& t : layout.added) decoder[std::to_string(t.id)] = AddedTokenJson(t, false);
  j["added_tokens_decoder"] = std::move(decoder);
  j["bos_token"] = OrNull(layout.bos);
  j["chat_template"] =
      ChatTemplateJinja(family == TokenizerFamily::kLlama3   ? ChatTemplate::kLlama3
                        : family == TokenizerFamily::kQwen2  ? ChatTemplate::kChatML
                        : family == TokenizerFamily::kLlama2 ? ChatTemplate::kLlama2
                                                             : ChatTemplate::kMistral);
  j["clean_up_tokenization_spaces"] = false;
  j["eos_token"] = OrNull(layout.eos);
  if (sp) j["legacy"] = false;
  j["model_max_length"] = family == TokenizerFamily::kLlama3 ? 131072 : 32768;
  j["pad_token"] = OrNull(layout.pad);
  if (family == TokenizerFamily::kQwen2) j["split_special_tokens"] = false;
  // transformers 5 rebuilds a LlamaTokenizer's pipeline as Metaspace(prepend_scheme=first),
  // which differs from the Llama 2 normalizer form: name the generic class for that family so
  // transformers and `tokenizers` agree on the ids.
  j["tokenizer_class"] = family == TokenizerFamily::kQwen2     ? "Qwen2Tokenizer"
                         : family == TokenizerFamily::kMistral ? "LlamaTokenizer"
                                                               : "PreTrainedTokenizerFast";
  if (!layout.unk.empty()) j["unk_token"] = layout.unk;
  return j;
}

Json SpecialTokensMapJson(const Layout& layout) {
  Json j = Json::object();
  auto entry = [](const std::string& content) {
    return Json{{"content", content},
                {"lstrip", false},
                {"normalized", false},
                {"rstrip", false},
                {"single_word", false}};
  };
  if (!layout.bos.empty()) j["bos_token"] = entry(layout.bos);
  if (!layout.eos.empty()) j["eos_token"] = entry(layout.eos);
  if (!layout.pad.empty()) j["pad_token"] = entry(layout.pad);
  if (!layout.unk.empty()) j["unk_token"] = entry(layout.unk);
  return j;
}

absl::Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

int32_t IdOf(const Layout& layout, const std::string& content) {
  for (const AddedToken& t : layout.added) {
    if (t.content == content) return t.id;
  }
  return -1;
}

}  // namespace

absl::Status WriteTokenizerFiles(const std::string& dir, TokenizerFamily family,
                                 const TokenizerSpec& spec, GeneratedTokenizerInfo* info) {
  const int min_size = IsSentencePiece(family) ? 300 : 257;
  if (spec.vocab_size < min_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer vocab_size ", spec.vocab_size, " is below the minimum ", min_size));
  }
  const Layout layout = MakeLayout(family, spec);
  RETURN_IF_ERROR(WriteText(dir + "/tokenizer.json", TokenizerJsonText(family, layout)));
  RETURN_IF_ERROR(
      WriteText(dir + "/tokenizer_config.json", TokenizerConfigJson(family, layout).dump(2)));
  RETURN_IF_ERROR(
      WriteText(dir + "/special_tokens_map.json", SpecialTokensMapJson(layout).dump(2)));
  if (info != nullptr) {
    const int32_t last_added = layout.added.back().id;
    info->vocab_size = std::max<int>(layout.vocab.tokens.size(), last_added + 1);
    info->bos_id =
        layout.bos.empty() ? std::nullopt : std::optional<int32_t>(IdOf(layout, layout.bos));
    info->eos_ids = {IdOf(layout, layout.eos)};
    for (const std::string& e : layout.extra_eos) info->eos_ids.push_back(IdOf(layout, e));
    info->pad_id =
        layout.pad.empty() ? std::nullopt : std::optional<int32_t>(IdOf(layout, layout.pad));
  }
  return absl::OkStatus();
}

}  // namespace tandem
