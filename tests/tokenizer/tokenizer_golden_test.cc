// Token ids and decodes equal the `tokenizers` package's for every generated family: against
// the committed goldens always, and live when python3 can import tokenizers.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/tokenizer/tokenizer_test_util.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

using nlohmann::json;
using testing::AllFamilies;

// Compares `tok` with one entry of a golden file.
void ExpectCasesMatch(const Tokenizer& tok, const json& golden) {
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

void ExpectSameFile(const std::string& dir, const json& golden) {
  ASSERT_EQ(testing::Fnv1a64(testing::ReadFileOrDie(dir + "/tokenizer.json")),
            golden["tokenizer_fnv1a64"].get<std::string>())
      << "the generated tokenizer.json changed: regenerate the goldens with "
         "tests/tokenizer/make_golden.py all <build>/tests/write_tokenizer";
}

// Every entry of a golden file: the generated configurations from the files in ROOT/<name>,
// and the "variant_*" entries (a JSON merge patch over a generated file, exercising pipelines
// our families do not use: GPT-2 ByteLevel regex, Split behaviors, Metaspace always/split,
// normalizers, lstrip/rstrip/single_word added tokens).
void ExpectMatchesGoldens(const std::string& root, const json& golden) {
  for (const auto& c : testing::GoldenConfigs()) {
    SCOPED_TRACE(c.name);
    ExpectSameFile(root + "/" + c.name, golden[c.name]);
    auto tok = Tokenizer::Load(root + "/" + c.name);
    ASSERT_TRUE(tok.ok()) << tok.status();
    ExpectCasesMatch(**tok, golden[c.name]);
  }
  int variants = 0;
  for (const auto& [name, entry] : golden.items()) {
    if (name.rfind("variant_", 0) != 0) continue;
    SCOPED_TRACE(name);
    const std::string base_dir = root + "/" + entry["base"].get<std::string>();
    ExpectSameFile(base_dir, entry);
    json file = json::parse(testing::ReadFileOrDie(base_dir + "/tokenizer.json"));
    file.merge_patch(entry["patch"]);
    auto tok = Tokenizer::FromJson(file.dump(), "");
    ASSERT_TRUE(tok.ok()) << tok.status();
    ExpectCasesMatch(**tok, entry);
    ++variants;
  }
  EXPECT_EQ(variants, 7);
}

// Writes every generated configuration into ROOT/<name>, as make_golden.py does.
std::string WriteConfigs(const std::string& tag) {
  const std::string root = testing::MakeTempDir(tag);
  for (const auto& c : testing::GoldenConfigs()) {
    const std::string dir = root + "/" + c.name;
    EXPECT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
    TokenizerSpec spec;
    spec.vocab_size = c.vocab_size;
    EXPECT_TRUE(WriteTokenizerFiles(dir, c.family.family, spec).ok());
  }
  return root;
}

TEST(TokenizerGoldenTest, MatchesCommittedGoldens) {
  const json golden = json::parse(
      testing::ReadFileOrDie(testing::TestDataPath("golden_encode.json")), nullptr, false);
  ASSERT_FALSE(golden.is_discarded());
  ExpectMatchesGoldens(WriteConfigs("golden"), golden);
}

TEST(TokenizerGoldenTest, MatchesTokenizersPackageLive) {
  if (std::system("python3 -c 'import tokenizers' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 cannot import tokenizers; the committed goldens still ran";
  }
  const std::string root = WriteConfigs("live");
  const std::string out = root + "/live.json";
  const std::string cmd =
      "python3 " + testing::TestDataPath("make_golden.py") + " encode " + root + " " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const json live = json::parse(testing::ReadFileOrDie(out), nullptr, false);
  ASSERT_FALSE(live.is_discarded());
  ExpectMatchesGoldens(root, live);
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

// The tokenizer is immutable: concurrent encodes and decodes agree with a serial run.
TEST(TokenizerGoldenTest, ThreadSafe) {
  auto tok = Tokenizer::Load(testing::WriteFamily(AllFamilies()[1]));
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::string text = "naïve café 你好 🎉 <|im_start|>user\n 12345  tokens\t";
  const std::vector<int32_t> expected = (*tok)->Encode(text, true);
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        if ((*tok)->Encode(text, true) != expected) ++mismatches;
        if ((*tok)->Decode(expected, false) != text) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
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
