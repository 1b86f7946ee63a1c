#include "tokenizer/bpe_model.h"

#include <queue>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "tokenizer/json_fields.h"
#include "tokenizer/utf8.h"

namespace tandem {
namespace {

using json_fields::Json;
constexpr std::string_view kWhere = "model";

// A merge of a "a b" string or an [a, b] pair, as views into the JSON.
absl::StatusOr<std::pair<std::string_view, std::string_view>> ParseMerge(const Json& m,
                                                                         size_t index) {
  if (m.is_string()) {
    const std::string& s = m.get_ref<const std::string&>();
    const size_t space = s.find(' ');
    if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
      return json_fields::Error(kWhere, absl::StrCat("merge ", index, " \"", s,
                                                     "\" is not two tokens separated by a space"));
    }
    const std::string_view v(s);
    return std::make_pair(v.substr(0, space), v.substr(space + 1));
  }
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
    return std::make_pair(std::string_view(m[0].get_ref<const std::string&>()),
                          std::string_view(m[1].get_ref<const std::string&>()));
  }
  return json_fields::Error(kWhere,
                            absl::StrCat("merge ", index, " is neither \"a b\" nor [a, b]"));
}

absl::Status RejectUnsupported(const Json& model) {
  const Json* dropout = json_fields::Find(model, "dropout");
  if (dropout != nullptr && !dropout->is_null() &&
      !(dropout->is_number() && dropout->get<double>() == 0.0)) {
    return absl::UnimplementedError("tokenizer.json: model: BPE dropout is not supported");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    ASSIGN_OR_RETURN(auto value, json_fields::OptionalString(model, key, kWhere));
    if (value && !value->empty()) {
      return absl::UnimplementedError(
          absl::StrCat("tokenizer.json: model: BPE ", key, " is not supported"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(const Json& model) {
  ASSIGN_OR_RETURN(const std::string type, json_fields::Type(model, kWhere));
  if (type != "BPE") {
    return absl::UnimplementedError(
        absl::StrCat("tokenizer.json: model type \"", type, "\" is not supported (only BPE)"));
  }
  RETURN_IF_ERROR(RejectUnsupported(model));
  auto bpe = std::unique_ptr<BpeModel>(new BpeModel());
  const Json* vocab = json_fields::Find(model, "vocab");
  if (vocab == nullptr || !vocab->is_object()) {
    return json_fields::Error(kWhere, "missing \"vocab\" object");
  }
  bpe->vocab_.reserve(vocab->size());
  for (const auto& [token, id] : vocab->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (1 << 30)) {
      return json_fields::Error(kWhere, absl::StrCat("vocab entry \"", token, "\" has a bad id"));
    }
    const auto i = static_cast<int32_t>(id.get<int64_t>());
    bpe->vocab_[token] = i;
    if (i >= static_cast<int32_t>(bpe->id_to_token_.size())) bpe->id_to_token_.resize(i + 1);
    bpe->id_to_token_[i] = token;
  }
  const Json* merges = json_fields::Find(model, "merges");
  if (merges != nullptr && !merges->is_null()) RETURN_IF_ERROR(bpe->LoadMerges(*merges));
  ASSIGN_OR_RETURN(auto unk, json_fields::OptionalString(model, "unk_token", kWhere));
  if (unk) {
    bpe->unk_id_ = bpe->TokenToId(*unk);
    if (!bpe->unk_id_) {
      return json_fields::Error(kWhere, absl::StrCat("unk_token \"", *unk, "\" is not in vocab"));
    }
  }
  ASSIGN_OR_RETURN(bpe->fuse_unk_, json_fields::Bool(model, "fuse_unk", kWhere, false));
  ASSIGN_OR_RETURN(bpe->byte_fallback_, json_fields::Bool(model, "byte_fallback", kWhere, false));
  ASSIGN_OR_RETURN(bpe->ignore_merges_, json_fields::Bool(model, "ignore_merges", kWhere, false));
  for (int b = 0; b < 256; ++b) {
    bpe->byte_ids_[b] = bpe->TokenToId(absl::StrFormat("<0x%02X>", b)).value_or(-1);
  }
  return bpe;
}

absl::Status BpeModel::LoadMerges(const Json& merges) {
  if (!merges.is_array()) return json_fields::Error(kWhere, "\"merges\" is not an array");
  merges_.reserve(merges.size());
  std::string merged;
  for (size_t i = 0; i < merges.size(); ++i) {
    ASSIGN_OR_RETURN(const auto pair, ParseMerge(merges[i], i));
    const auto [first, second] = pair;
    merged.assign(first).append(second);
    const auto a = TokenToId(first), b = TokenToId(second), c = TokenToId(merged);
    if (!a || !b || !c) {
      const std::string_view missing = !a ? first : !b ? second : std::string_view(merged);
      return json_fields::Error(
          kWhere, absl::StrCat("merge ", i, " (\"", std::string(first), " ", std::string(second),
                               "\") needs token \"", std::string(missing),
                               "\", which is not in the vocab"));
    }
    merges_[PairKey(*a, *b)] = Merge{static_cast<int32_t>(i), *c};  // later entries win
  }
  return absl::OkStatus();
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

std::string_view BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || id >= size()) return {};
  return id_to_token_[id];
}

std::vector<int32_t> BpeModel::InitialSymbols(std::string_view word) const {
  std::vector<int32_t> symbols;
  bool last_was_unk = false;
  for (std::string_view c : utf8::SplitChars(word)) {
    if (auto id = TokenToId(c)) {
      symbols.push_back(*id);
      last_was_unk = false;
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char b : c) all &= byte_ids_[static_cast<uint8_t>(b)] >= 0;
      if (all) {
        for (char b : c) symbols.push_back(byte_ids_[static_cast<uint8_t>(b)]);
        last_was_unk = false;
        continue;
      }
    }
    if (unk_id_) {  // without an unk token the character is dropped, as tokenizers does
      if (!(fuse_unk_ && last_was_unk)) symbols.push_back(*unk_id_);
      last_was_unk = true;
    }
  }
  return symbols;
}

void BpeModel::MergeAll(std::vector<int32_t>* symbols) const {
  const int n = static_cast<int>(symbols->size());
  std::vector<int32_t>& id = *symbols;
  std::vector<int> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Entry {
    int32_t rank;
    int pos;
    int32_t new_id;
    bool operator<(const Entry& o) const {  // min-heap on (rank, pos)
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Entry> queue;
  auto push = [&](int pos) {
    if (pos < 0 || next[pos] < 0) return;
    auto it = merges_.find(PairKey(id[pos], id[next[pos]]));
    if (it != merges_.end()) queue.push({it->second.rank, pos, it->second.new_id});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!queue.empty()) {
    const Entry top = queue.top();
    queue.pop();
    if (!alive[top.pos] || next[top.pos] < 0) continue;
    const int right = next[top.pos];
    auto it = merges_.find(PairKey(id[top.pos], id[right]));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;  // stale entry
    id[top.pos] = top.new_id;
    alive[right] = false;
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = top.pos;
    push(prev[top.pos]);
    push(top.pos);
  }
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    if (alive[i]) out.push_back(id[i]);
  }
  *symbols = std::move(out);
}

void BpeModel::Tokenize(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto id = TokenToId(word)) {
      ids->push_back(*id);
      return;
    }
  }
  std::vector<int32_t> symbols = InitialSymbols(word);
  MergeAll(&symbols);
  ids->insert(ids->end(), symbols.begin(), symbols.end());
}

}  // namespace tandem
