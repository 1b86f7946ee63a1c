#include "tokenizer/generated_vocab.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_format.h"
#include "base/check.h"
#include "tokenizer/bpe_trainer.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/regex.h"
#include "tokenizer/string_map.h"
#include "tokenizer/training_corpus.h"
#include "tokenizer/utf8.h"

namespace tandem {
namespace {

constexpr int kSentencePieceFixed = 3 + 256;  // <unk> <s> </s> and the 256 byte tokens

GeneratedVocab ToVocab(BpeTrainingResult trained) {
  GeneratedVocab vocab;
  for (const auto& [a, b] : trained.merges) {
    vocab.merges.emplace_back(trained.vocab[a], trained.vocab[b]);
  }
  vocab.tokens = std::move(trained.vocab);
  return vocab;
}

// Byte-level BPE: words are the regex's matches, symbols are their bytes (id = byte value).
GeneratedVocab TrainByteLevel(std::string_view split_regex, int vocab_size) {
  auto regex = Regex::Compile(split_regex);
  CHECK(regex.ok()) << regex.status();
  const std::string_view corpus = TrainingCorpus();
  std::map<std::string_view, int64_t> counts;
  for (const auto& [begin, end] : regex->FindAll(corpus)) {
    ++counts[corpus.substr(begin, end - begin)];
  }
  BpeTrainingInput input;
  for (int b = 0; b < 256; ++b) input.vocab.push_back(byte_level::ByteToChars(b));
  input.mergeable.assign(256, true);
  for (const auto& [word, count] : counts) {
    BpeTrainingWord w;
    for (char c : word) w.symbols.push_back(static_cast<uint8_t>(c));
    w.count = count;
    input.words.push_back(std::move(w));
  }
  input.vocab_size = vocab_size;
  return ToVocab(TrainBpe(std::move(input)));
}

// The corpus as SentencePiece sees it: each line gets a leading "▁" and spaces become "▁".
std::vector<std::string> MetaspaceLines() {
  std::vector<std::string> lines;
  std::string_view corpus = TrainingCorpus();
  size_t start = 0;
  while (start < corpus.size()) {
    size_t end = corpus.find('\n', start);
    if (end == std::string_view::npos) end = corpus.size();
    std::string line(kMetaspace);
    for (char c : corpus.substr(start, end - start)) {
      if (c == ' ') {
        line += kMetaspace;
      } else {
        line.push_back(c);
      }
    }
    lines.push_back(std::move(line));
    start = end + 1;
  }
  return lines;
}

// Characters frequent enough to get their own token; the rest fall back to byte tokens.
std::vector<std::string> ChooseAlphabet(const std::vector<std::string>& lines, int vocab_size) {
  std::map<std::string, int64_t> freq;
  for (const std::string& line : lines) {
    for (std::string_view c : utf8::SplitChars(line)) ++freq[std::string(c)];
  }
  std::vector<std::pair<int64_t, std::string>> ranked;
  for (const auto& [c, n] : freq) {
    if (n >= 2 && c != "\t") ranked.emplace_back(-n, c);
  }
  std::sort(ranked.begin(), ranked.end());
  const size_t cap = std::max(1, (vocab_size - kSentencePieceFixed) / 2);
  std::vector<std::string> alphabet;
  for (size_t i = 0; i < ranked.size() && i < cap; ++i) alphabet.push_back(ranked[i].second);
  return alphabet;
}

GeneratedVocab TrainSentencePiece(int vocab_size) {
  const std::vector<std::string> lines = MetaspaceLines();
  BpeTrainingInput input;
  input.vocab = {"<unk>", "<s>", "</s>"};
  for (int b = 0; b < 256; ++b) input.vocab.push_back(absl::StrFormat("<0x%02X>", b));
  input.mergeable.assign(input.vocab.size(), false);
  StringMap<int> ids;
  for (const std::string& c : ChooseAlphabet(lines, vocab_size)) {
    ids[c] = static_cast<int>(input.vocab.size());
    input.vocab.push_back(c);
    // Like Llama's SentencePiece model (split_digits), digits never merge.
    input.mergeable.push_back(!(c.size() == 1 && c[0] >= '0' && c[0] <= '9'));
  }
  // Words start at each "▁"; characters outside the alphabet cut words (they become bytes).
  std::map<std::vector<int>, int64_t> counts;
  for (const std::string& line : lines) {
    std::vector<int> word;
    for (std::string_view c : utf8::SplitChars(line)) {
      auto it = ids.find(c);
      if (c == kMetaspace || it == ids.end()) {
        if (!word.empty()) ++counts[word];
        word.clear();
      }
      if (it != ids.end()) word.push_back(it->second);
    }
    if (!word.empty()) ++counts[word];
  }
  for (const auto& [symbols, count] : counts) input.words.push_back({symbols, count});
  input.vocab_size = vocab_size;
  return ToVocab(TrainBpe(std::move(input)));
}

bool HasDigit(std::string_view s) {
  for (char c : s) {
    if (c >= '0' && c <= '9') return true;
  }
  return false;
}

// Once the corpus has no pairs left (a few thousand tokens), the vocabulary grows to the
// requested size with merges of learned tokens into longer word-like tokens (a + b where b
// does not start a word), in a fixed diagonal order over the learned tokens. They rank after
// every learned merge, so they rarely fire on real text, but every id decodes to text, which
// matters when random-weight models sample from a full-size vocabulary.
void ExtendVocab(TokenizerFamily family, int vocab_size, GeneratedVocab* vocab) {
  if (static_cast<int>(vocab->tokens.size()) >= vocab_size) return;
  const bool sp = family == TokenizerFamily::kLlama2 || family == TokenizerFamily::kMistral;
  const std::string_view space = sp ? kMetaspace : std::string_view("\xC4\xA0");  // "▁" / "Ġ"
  constexpr size_t kMaxTokenBytes = 32;
  StringMap<int> ids;
  for (size_t i = 0; i < vocab->tokens.size(); ++i) ids[vocab->tokens[i]] = static_cast<int>(i);
  std::vector<std::string> parts;  // learned tokens, in id order
  for (size_t i = sp ? kSentencePieceFixed : 256; i < vocab->tokens.size(); ++i) {
    parts.push_back(vocab->tokens[i]);
  }
  for (size_t k = 0; k < 2 * parts.size(); ++k) {
    for (size_t i = 0; i <= k && i < parts.size(); ++i) {
      const size_t j = k - i;
      if (j >= parts.size()) continue;
      const std::string& a = parts[i];
      const std::string& b = parts[j];
      if (b.compare(0, space.size(), space) == 0 || a.size() + b.size() > kMaxTokenBytes) continue;
      if (sp && (HasDigit(a) || HasDigit(b))) continue;  // SentencePiece digits stay single
      std::string merged = a + b;
      if (ids.contains(merged)) continue;
      ids[merged] = static_cast<int>(vocab->tokens.size());
      vocab->tokens.push_back(std::move(merged));
      vocab->merges.emplace_back(a, b);
      if (static_cast<int>(vocab->tokens.size()) >= vocab_size) return;
    }
  }
}

}  // namespace

GeneratedVocab TrainGeneratedVocab(TokenizerFamily family, int vocab_size) {
  GeneratedVocab vocab;
  switch (family) {
    case TokenizerFamily::kLlama3:
      vocab = TrainByteLevel(kLlama3SplitRegex, vocab_size);
      break;
    case TokenizerFamily::kQwen2:
      vocab = TrainByteLevel(kQwen2SplitRegex, vocab_size);
      break;
    case TokenizerFamily::kLlama2:
    case TokenizerFamily::kMistral:
      vocab = TrainSentencePiece(vocab_size);
      break;
  }
  ExtendVocab(family, vocab_size, &vocab);
  return vocab;
}

}  // namespace tandem
