// Malformed tokenizer.json gets a clear error (never a crash): not JSON, missing model,
// unknown model type, merges naming unknown tokens, wrong field types, bad components.
#include <algorithm>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/tokenizer/tokenizer_test_util.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

json ValidLlama3() {
  const std::string dir = testing::WriteFamily(testing::AllFamilies()[0]);
  return json::parse(testing::ReadFileOrDie(dir + "/tokenizer.json"));
}

absl::Status LoadStatus(const std::string& text) { return Tokenizer::FromJson(text, "").status(); }

TEST(MalformedTokenizerTest, ValidFileLoads) { EXPECT_TRUE(LoadStatus(ValidLlama3().dump()).ok()); }

TEST(MalformedTokenizerTest, NotJson) {
  const absl::Status s = LoadStatus("{\"model\": {\"type\": \"BPE\", ");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("not valid JSON"));
  EXPECT_EQ(LoadStatus("").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadStatus("[1, 2]").code(), absl::StatusCode::kInvalidArgument);
}

TEST(MalformedTokenizerTest, MissingModel) {
  json j = ValidLlama3();
  j.erase("model");
  const absl::Status s = LoadStatus(j.dump());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("missing \"model\""));
}

TEST(MalformedTokenizerTest, UnknownModelType) {
  json j = ValidLlama3();
  j["model"]["type"] = "Unigram";
  const absl::Status s = LoadStatus(j.dump());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("Unigram"));
}

// A post-processor whose special token is no id of the vocabulary (here: its added_tokens entry
// misspelled, so only the template names id 261+) would put ids beyond the embedding table into
// every prompt; found by the tokenizer.json fuzzer (tests/fuzz/corpus/tokenizer_json).
TEST(MalformedTokenizerTest, PostProcessorIdOutsideTheVocabulary) {
  json j = ValidLlama3();
  const int vocab = static_cast<int>(j["model"]["vocab"].size() + j["added_tokens"].size());
  j["added_tokens"] = json::array();
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", json::array({{{"SpecialToken", {{"id", "<|x|>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
      {"pair", json::array({{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
      {"special_tokens",
       {{"<|x|>",
         {{"id", "<|x|>"},
          {"ids", json::array({vocab + 5})},
          {"tokens", json::array({"<|x|>"})}}}}}};
  const absl::Status s = LoadStatus(j.dump());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("post_processor special token id"));
}

TEST(MalformedTokenizerTest, MergeNamingUnknownToken) {
  json j = ValidLlama3();
  j["model"]["merges"].push_back(json::array({"Ġ", "nosuchtoken"}));
  absl::Status s = LoadStatus(j.dump());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("nosuchtoken"));
  EXPECT_THAT(s.message(), HasSubstr("not in the vocab"));

  json k = ValidLlama3();
  k["model"]["merges"][0] = "three part merge";
  s = LoadStatus(k.dump());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("merge 0"));
}

TEST(MalformedTokenizerTest, WrongFieldTypes) {
  json j = ValidLlama3();
  j["model"]["vocab"] = json::array({1, 2});
  EXPECT_THAT(LoadStatus(j.dump()).message(), HasSubstr("vocab"));
  j = ValidLlama3();
  j["model"]["vocab"]["Ġ"] = "not a number";
  EXPECT_EQ(LoadStatus(j.dump()).code(), absl::StatusCode::kInvalidArgument);
  j = ValidLlama3();
  j["model"]["byte_fallback"] = "yes";
  EXPECT_THAT(LoadStatus(j.dump()).message(), HasSubstr("byte_fallback"));
  j = ValidLlama3();
  j["added_tokens"][0].erase("content");
  EXPECT_THAT(LoadStatus(j.dump()).message(), HasSubstr("added_tokens[0]"));
  j = ValidLlama3();
  j["model"]["unk_token"] = "<nope>";
  EXPECT_THAT(LoadStatus(j.dump()).message(), HasSubstr("<nope>"));
}

TEST(MalformedTokenizerTest, BadComponents) {
  json j = ValidLlama3();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  absl::Status s = LoadStatus(j.dump());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("bad regex"));
  j = ValidLlama3();
  j["pre_tokenizer"]["pretokenizers"][1]["type"] = "Punctuation";
  s = LoadStatus(j.dump());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("pre_tokenizer.pretokenizers[1]"));
  j = ValidLlama3();
  j["decoder"] = {{"type", "WordPiece"}};
  EXPECT_EQ(LoadStatus(j.dump()).code(), absl::StatusCode::kUnimplemented);
  j = ValidLlama3();
  j["normalizer"] = {{"noType", 1}};
  EXPECT_EQ(LoadStatus(j.dump()).code(), absl::StatusCode::kInvalidArgument);
  j = ValidLlama3();
  j["post_processor"]["processors"][1]["special_tokens"] = json::object();
  EXPECT_EQ(LoadStatus(j.dump()).code(), absl::StatusCode::kInvalidArgument);
}

// Every JSON node replaced by a value of another type, and truncations: loading returns a
// status (no crash, no exception), and a tokenizer that does load still encodes and decodes.
TEST(MalformedTokenizerTest, MutatedFilesNeverCrash) {
  for (const auto& family : {testing::AllFamilies()[0], testing::AllFamilies()[3]}) {
    const std::string dir = testing::WriteFamily(family);
    const json valid = json::parse(testing::ReadFileOrDie(dir + "/tokenizer.json"));
    std::vector<json::json_pointer> paths;
    const json flat = valid.flatten();  // leaves; their parents are the containers
    for (const auto& [pointer, value] : flat.items()) {
      json::json_pointer p(pointer);
      while (!p.empty() && paths.size() < 100000) {
        paths.push_back(p);
        p = p.parent_pointer();
      }
    }
    std::sort(paths.begin(), paths.end(),
              [](const auto& a, const auto& b) { return a.to_string() < b.to_string(); });
    paths.erase(std::unique(paths.begin(), paths.end()), paths.end());
    const json replacements[] = {nullptr, -1, "x", json::array()};
    int loaded = 0, rejected = 0;
    // Every path outside the long vocab / merges lists, and a stride through those.
    std::vector<json::json_pointer> chosen;
    for (size_t i = 0; i < paths.size(); ++i) {
      const std::string p = paths[i].to_string();
      const bool in_list = p.rfind("/model/vocab/", 0) == 0 || p.rfind("/model/merges/", 0) == 0;
      if (!in_list || i % 101 == 0) chosen.push_back(paths[i]);
    }
    for (const auto& path : chosen) {
      for (const json& r : replacements) {
        json mutated = valid;
        mutated[path] = r;
        auto tok = Tokenizer::FromJson(mutated.dump(), "");
        if (!tok.ok()) {
          ++rejected;
          continue;
        }
        ++loaded;
        const auto ids = (*tok)->Encode("Hello 🎉 <|eot_id|> <s>", true);
        (*tok)->Decode(ids, false);
      }
    }
    std::printf("%s: %d mutations loaded, %d rejected\n", family.name, loaded, rejected);
    EXPECT_GT(rejected, 50) << family.name;
    EXPECT_GT(loaded, 50) << family.name;
  }
  const std::string text =
      testing::ReadFileOrDie(testing::WriteFamily(testing::AllFamilies()[1]) + "/tokenizer.json");
  for (size_t cut = 0; cut < text.size(); cut += 997) {
    EXPECT_FALSE(Tokenizer::FromJson(text.substr(0, cut), "").ok()) << cut;
  }
}

TEST(MalformedTokenizerTest, MissingDirectoryIsNotFound) {
  EXPECT_EQ(Tokenizer::Load("/nonexistent/dir").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tandem
