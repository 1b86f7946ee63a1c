// Malformed tokenizer.json gets a clear error (never a crash): not JSON, missing model,
// unknown model type, merges naming unknown tokens, wrong field types, bad components.
#include <string>

#include "engine/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engine/tokenizer/tokenizer_test_util.h"

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

TEST(MalformedTokenizerTest, MissingDirectoryIsNotFound) {
  EXPECT_EQ(Tokenizer::Load("/nonexistent/dir").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tandem
