#include "loadgen/tokenizer_prompt_source.h"

#include <cctype>

#include "absl/strings/str_cat.h"
#include "tokenizer/tokenizer.h"

namespace tandem::loadgen {
namespace {

constexpr int kMaxPieces = 4096;  // enough variety; bounds the start-up scan

class TokenizerPromptSource : public PromptSource {
 public:
  TokenizerPromptSource(std::unique_ptr<Tokenizer> tokenizer, std::vector<std::string> pieces)
      : tokenizer_(std::move(tokenizer)), pieces_(std::move(pieces)) {}

  std::vector<std::string> Pieces(std::mt19937_64& rng, int n) const override {
    std::uniform_int_distribution<size_t> pick(0, pieces_.size() - 1);
    std::vector<std::string> out;
    out.reserve(n);
    for (int i = 0; i < n; ++i) out.push_back(pieces_[pick(rng)]);
    return out;
  }
  std::string Join(const std::vector<std::string>& pieces) const override {
    std::string text;
    for (const std::string& p : pieces) text += p;
    return text;
  }
  int Count(const std::string& text) const override {
    return static_cast<int>(tokenizer_->Encode(text, /*add_special_tokens=*/false).size());
  }
  bool CountsExactly() const override { return true; }

 private:
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<std::string> pieces_;
};

bool SpaceThenLetters(const std::string& text) {
  if (text.size() < 2 || text[0] != ' ') return false;
  for (size_t i = 1; i < text.size(); ++i) {
    if (!std::isalpha(static_cast<unsigned char>(text[i]))) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PromptSource>> MakeTokenizerPromptSource(const std::string& dir) {
  auto tokenizer = Tokenizer::Load(dir);
  if (!tokenizer.ok()) return tokenizer.status();
  std::vector<std::string> pieces;
  const Tokenizer& t = **tokenizer;
  for (int32_t id = 0; id < t.vocab_size() && pieces.size() < kMaxPieces; ++id) {
    if (t.IsSpecial(id)) continue;
    std::string text = t.Decode({id}, /*skip_special_tokens=*/true);
    if (!SpaceThenLetters(text)) continue;
    if (t.Encode(text, false) != std::vector<int32_t>{id}) continue;
    pieces.push_back(std::move(text));
  }
  if (pieces.size() < 16) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir, ": too few word tokens (\" <letters>\") in the vocabulary to build prompts"));
  }
  return std::unique_ptr<PromptSource>(
      new TokenizerPromptSource(std::move(*tokenizer), std::move(pieces)));
}

}  // namespace tandem::loadgen
