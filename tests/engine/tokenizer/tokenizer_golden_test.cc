// Token ids and decodes equal the `tokenizers` package's for every generated family: against
// the committed goldens always, and live when python3 can import tokenizers.
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engine/tokenizer/tokenizer_test_util.h"

namespace tandem {
namespace {

using nlohmann::json;
using testing::AllFamilies;

// Compares our tokenizer in `dir` with one family's entry of a golden file.
void ExpectMatchesGolden(const std::string& dir, const json& golden, const std::string& family) {
  SCOPED_TRACE(family);
  ASSERT_EQ(testing::Fnv1a64(testing::ReadFileOrDie(dir + "/tokenizer.json")),
            golden["tokenizer_fnv1a64"].get<std::string>())
      << "the generated tokenizer.json changed: regenerate the goldens with "
         "tests/engine/tokenizer/make_golden.py all <build>/tests/write_tokenizer";
  auto tokenizer = Tokenizer::Load(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const Tokenizer& tok = **tokenizer;
  EXPECT_EQ(tok.vocab_size(), golden["vocab_size"].get<int>());
  int checked = 0;
  for (const json& c : golden["cases"]) {
    const std::string text = c["text"].get<std::string>();
    SCOPED_TRACE(::testing::Message() << "text: \"" << text << "\"");
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    const auto plain = c["ids_no_special"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.Encode(text, /*add_special_tokens=*/true), ids);
    EXPECT_EQ(tok.Encode(text, /*add_special_tokens=*/false), plain);
    EXPECT_EQ(tok.Decode(ids, /*skip_special_tokens=*/false), c["decode"].get<std::string>());
    EXPECT_EQ(tok.Decode(ids, /*skip_special_tokens=*/true),
              c["decode_skip_special"].get<std::string>());
    std::vector<int32_t> truncated(plain.begin(), plain.end() - (plain.empty() ? 0 : 1));
    EXPECT_EQ(tok.Decode(truncated, false), c["decode_truncated"].get<std::string>());
    ++checked;
  }
  EXPECT_GE(checked, 35);
}

TEST(TokenizerGoldenTest, MatchesCommittedGoldens) {
  const json golden = json::parse(
      testing::ReadFileOrDie(testing::TestDataPath("golden_encode.json")), nullptr, false);
  ASSERT_FALSE(golden.is_discarded());
  for (const auto& c : testing::GoldenConfigs()) {
    ExpectMatchesGolden(testing::WriteFamily(c.family, c.vocab_size), golden[c.name], c.name);
  }
}

TEST(TokenizerGoldenTest, MatchesTokenizersPackageLive) {
  if (std::system("python3 -c 'import tokenizers' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 cannot import tokenizers; the committed goldens still ran";
  }
  const std::string root = testing::MakeTempDir("live");
  for (const auto& c : testing::GoldenConfigs()) {
    const std::string dir = root + "/" + c.name;
    ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
    TokenizerSpec spec;
    spec.vocab_size = c.vocab_size;
    ASSERT_TRUE(WriteTokenizerFiles(dir, c.family.family, spec).ok());
  }
  const std::string out = root + "/live.json";
  const std::string cmd =
      "python3 " + testing::TestDataPath("make_golden.py") + " encode " + root + " " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const json live = json::parse(testing::ReadFileOrDie(out), nullptr, false);
  ASSERT_FALSE(live.is_discarded());
  for (const auto& c : testing::GoldenConfigs()) {
    ExpectMatchesGolden(root + "/" + c.name, live[c.name], c.name);
  }
}

// Encoding is a hash-map merge loop: 100 KB of mixed text takes milliseconds.
TEST(TokenizerGoldenTest, EncodesLargeTextFast) {
  std::string text;
  while (text.size() < 100 * 1024) {
    text += "The server streams tokens 12345 back; naïve café 你好世界 🎉 <|eot_id|>\n\t  ";
  }
  text += std::string(20000, 'a') + std::string(5000, ' ');  // one very long word, long run
  for (const auto& f : AllFamilies()) {
    auto tok = Tokenizer::Load(testing::WriteFamily(f));
    ASSERT_TRUE(tok.ok()) << tok.status();
    const auto start = std::chrono::steady_clock::now();
    const std::vector<int32_t> ids = (*tok)->Encode(text, false);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::printf("%s: %zu bytes -> %zu tokens in %.1f ms\n", f.name, text.size(), ids.size(), ms);
    EXPECT_LT(ms, 1000.0) << f.name;
    EXPECT_EQ((*tok)->Decode(ids, false), text) << f.name;
  }
}

// Full-size vocabularies (as the 8B presets use) load fast and every id decodes to text.
TEST(TokenizerGoldenTest, FullSizeVocabularyLoadsAndDecodesEveryId) {
  TokenizerSpec spec;
  spec.vocab_size = 128000;
  spec.llama3_reserved_special_tokens = 245;
  const std::string dir = testing::MakeTempDir("full");
  GeneratedTokenizerInfo info;
  ASSERT_TRUE(WriteTokenizerFiles(dir, TokenizerFamily::kLlama3, spec, &info).ok());
  EXPECT_EQ(info.vocab_size, 128256);  // the real Llama 3 layout
  EXPECT_EQ(info.bos_id, 128000);
  EXPECT_EQ(info.eos_ids, (std::vector<int32_t>{128009, 128001, 128008}));
  const auto start = std::chrono::steady_clock::now();
  auto tok = Tokenizer::Load(dir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::printf("loaded a %d-token tokenizer in %.0f ms\n", (*tok)->vocab_size(), ms);
  EXPECT_EQ((*tok)->vocab_size(), 128256);
  EXPECT_EQ((*tok)->TokenToId("<|reserved_special_token_247|>"), 128255);
  for (int32_t id = 0; id < 128000; id += 997) {
    EXPECT_FALSE((*tok)->Decode({id}, true).empty()) << id;
  }
}

}  // namespace
}  // namespace tandem
