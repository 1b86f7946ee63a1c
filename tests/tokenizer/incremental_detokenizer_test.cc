// IncrementalDetokenizer: deltas hold only whole UTF-8 code points, and concatenate to
// Decode() of the whole stream, for emoji and CJK split across byte tokens and for
// SentencePiece's leading-space rule.
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/tokenizer/tokenizer_test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace tandem {
namespace {

constexpr const char* kTexts[] = {
    "Hello world, this is a stream.",
    "🎉🎉 party 🚀 time 👨‍👩‍👧‍👦",
    "你好，世界！今天天气很好。𝕳𝖊𝖑𝖑𝖔",
    "  leading spaces and naïve café\n\tend  ",
    "<s>[INST] mixed <|im_end|> specials </s> 🎉",
};

TEST(IncrementalDetokenizerTest, DeltasAreWholeCodePointsAndConcatenateToDecode) {
  for (const auto& f : testing::AllFamilies()) {
    auto tok = Tokenizer::Load(testing::WriteFamily(f));
    ASSERT_TRUE(tok.ok()) << tok.status();
    for (const char* text : kTexts) {
      for (bool skip : {false, true}) {
        SCOPED_TRACE(::testing::Message() << f.name << " skip=" << skip << " \"" << text << "\"");
        const std::vector<int32_t> ids = (*tok)->Encode(text, true);
        IncrementalDetokenizer detok(tok->get(), skip);
        std::string streamed;
        int held_back = 0;
        for (int32_t id : ids) {
          const std::string delta = detok.Add(id);
          EXPECT_TRUE(utf8::IsValid(delta));
          EXPECT_EQ(delta.find(utf8::kReplacementChar), std::string::npos) << delta;
          held_back += delta.empty();
          streamed += delta;
        }
        streamed += detok.Flush();
        EXPECT_EQ(streamed, (*tok)->Decode(ids, skip));
        if (std::string(text).find("🎉") != std::string::npos) {
          EXPECT_GT(held_back, 0) << "an emoji split over byte tokens should be held back";
        }
      }
    }
  }
}

TEST(IncrementalDetokenizerTest, IncompleteCharacterIsFlushedAsReplacement) {
  auto tok = Tokenizer::Load(testing::WriteFamily(testing::AllFamilies()[2]));  // llama2
  ASSERT_TRUE(tok.ok()) << tok.status();
  // "🎉" is F0 9F 8E 89: feed only the first three byte tokens.
  IncrementalDetokenizer detok(tok->get(), false);
  std::string out;
  for (const char* byte : {"<0xF0>", "<0x9F>", "<0x8E>"}) {
    out += detok.Add(*(*tok)->TokenToId(byte));
  }
  EXPECT_EQ(out, "");
  EXPECT_EQ(detok.Flush(), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // one U+FFFD per byte
}

// Skipped special tokens and out-of-vocabulary ids (a model's vocabulary may be larger than
// the tokenizer's) change nothing, wherever they fall in the stream.
TEST(IncrementalDetokenizerTest, IgnoresSkippedAndUnknownIds) {
  for (const auto& f : testing::AllFamilies()) {
    auto tok = Tokenizer::Load(testing::WriteFamily(f));
    ASSERT_TRUE(tok.ok()) << tok.status();
    const std::vector<int32_t> text_ids = (*tok)->Encode("  héllo 🎉 world", false);
    std::vector<int32_t> ids;
    const int32_t special = *(*tok)->eos_id();
    for (int32_t id : text_ids) {
      ids.insert(ids.end(), {special, id, (*tok)->vocab_size() + 5, special});
    }
    IncrementalDetokenizer detok(tok->get(), /*skip_special_tokens=*/true);
    std::string streamed;
    for (int32_t id : ids) streamed += detok.Add(id);
    streamed += detok.Flush();
    EXPECT_EQ(streamed, (*tok)->Decode(ids, true)) << f.name;
    EXPECT_EQ(streamed, (*tok)->Decode(text_ids, true)) << f.name;
  }
}

// Random ids (what a random-weight model emits): byte tokens in invalid runs, where a later
// token can turn an already emitted byte token's character into U+FFFD. Deltas stay valid
// UTF-8 whatever the stream, and equal Decode() whenever the stream never rewrote its text.
TEST(IncrementalDetokenizerTest, RandomStreamsGiveValidUtf8) {
  for (const auto& f : testing::AllFamilies()) {
    auto tok = Tokenizer::Load(testing::WriteFamily(f));
    ASSERT_TRUE(tok.ok()) << tok.status();
    std::mt19937 rng(7);
    int rewritten = 0;
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<int32_t> ids(40);
      for (int32_t& id : ids) id = static_cast<int32_t>(rng() % (*tok)->vocab_size());
      IncrementalDetokenizer detok(tok->get(), true);
      std::string streamed;
      bool prefix_stable = true;
      for (size_t i = 0; i < ids.size(); ++i) {
        const std::string delta = detok.Add(ids[i]);
        EXPECT_TRUE(utf8::IsValid(delta)) << f.name << " trial " << trial << " token " << i;
        streamed += delta;
        const std::string decoded =
            (*tok)->Decode(std::vector<int32_t>(ids.begin(), ids.begin() + i + 1), true);
        prefix_stable = prefix_stable && decoded.compare(0, streamed.size(), streamed) == 0;
      }
      streamed += detok.Flush();
      EXPECT_TRUE(utf8::IsValid(streamed));
      if (prefix_stable) {
        EXPECT_EQ(streamed, (*tok)->Decode(ids, true)) << f.name << " trial " << trial;
      } else {
        ++rewritten;
      }
    }
    // Byte-level BPE never rewrites; the byte-fallback families did here (the case this is for).
    if (f.family == TokenizerFamily::kLlama3 || f.family == TokenizerFamily::kQwen2) {
      EXPECT_EQ(rewritten, 0) << f.name;
    }
  }
}

TEST(IncrementalDetokenizerTest, SentencePieceSpacesBetweenWords) {
  auto tok = Tokenizer::Load(testing::WriteFamily(testing::AllFamilies()[3]));  // mistral
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::vector<int32_t> ids = (*tok)->Encode("one two three", false);
  IncrementalDetokenizer detok(tok->get(), true);
  std::vector<std::string> deltas;
  for (int32_t id : ids) deltas.push_back(detok.Add(id));
  std::string all;
  for (const auto& d : deltas) all += d;
  EXPECT_EQ(all, "one two three");  // the first word loses its "▁", later ones keep a space
  EXPECT_EQ(deltas.front().substr(0, 1), "o");
}

}  // namespace
}  // namespace tandem
