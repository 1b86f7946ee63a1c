// Validation of OpenAI request bodies: every bad input is a clear 400 (or 404 for an unknown
// model) naming the field, never a crash; good input resolves defaults as OpenAI / vLLM do.
#include "router/openai_request.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "router/api_error.h"
#include "tests/router/byte_tokenizer.h"

namespace tandem::router {
namespace {

using testing::ByteModelContext;
using testing::ByteTokenizer;
using ::testing::HasSubstr;

class OpenAiRequestTest : public ::testing::Test {
 protected:
  absl::StatusOr<GenerateSpec> Completion(const std::string& body) {
    return ParseCompletionRequest(body, model_);
  }
  absl::StatusOr<GenerateSpec> Chat(const std::string& body) {
    return ParseChatRequest(body, model_);
  }
  // Expects a 400 whose message contains `text` and whose param is `param`.
  void ExpectBad(const absl::StatusOr<GenerateSpec>& result, const std::string& text,
                 const std::string& param = "") {
    ASSERT_FALSE(result.ok()) << "accepted";
    EXPECT_EQ(HttpStatusFor(result.status()), 400) << result.status();
    EXPECT_THAT(std::string(result.status().message()), HasSubstr(text));
    if (!param.empty()) {
      EXPECT_EQ(ParamOf(result.status()), param);
    }
  }

  ByteTokenizer tokenizer_;
  ModelContext model_ = ByteModelContext(&tokenizer_, /*max_model_len=*/64);
};

TEST_F(OpenAiRequestTest, CompletionDefaults) {
  absl::StatusOr<GenerateSpec> spec = Completion(R"({"model": "tiny", "prompt": "hi"})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->prompt_tokens, (std::vector<int32_t>{ByteTokenizer::kBos, 'h', 'i'}));
  EXPECT_EQ(spec->sampling.max_tokens, 16);
  EXPECT_FLOAT_EQ(spec->sampling.temperature, 1.0f);
  EXPECT_FALSE(spec->stream);
  EXPECT_EQ(spec->kind, ApiKind::kCompletion);
}

TEST_F(OpenAiRequestTest, CompletionFieldsAndExtensions) {
  absl::StatusOr<GenerateSpec> spec = Completion(
      R"({"prompt": [1, 2, 3], "max_tokens": 5, "temperature": 0, "top_p": 0.5, "top_k": 4,
          "seed": 7, "stop": "x", "stop_token_ids": [257], "ignore_eos": true, "stream": true,
          "stream_options": {"include_usage": true}, "user": "u", "n": 1,
          "some_unknown_field": {"a": 1}})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->prompt_tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(spec->sampling.max_tokens, 5);
  EXPECT_EQ(spec->sampling.temperature, 0.0f);
  EXPECT_EQ(spec->sampling.top_k, 4);
  EXPECT_EQ(spec->sampling.seed, 7u);
  EXPECT_EQ(spec->sampling.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(spec->sampling.stop_token_ids, std::vector<int32_t>{257});
  EXPECT_TRUE(spec->sampling.ignore_eos);
  EXPECT_TRUE(spec->stream);
  EXPECT_TRUE(spec->include_usage);
}

TEST_F(OpenAiRequestTest, ChatUsesTemplateAndRestOfContextByDefault) {
  absl::StatusOr<GenerateSpec> spec = Chat(
      R"({"model": "tiny", "messages": [{"role": "system", "content": "s"},
          {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
          "max_completion_tokens": 3, "max_tokens": 9})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::string expected = "<system>s\n<user>ab\n<assistant>";
  EXPECT_EQ(spec->prompt_tokens, ByteTokenizer::Ids(expected));  // no BOS: the template has it
  EXPECT_EQ(spec->sampling.max_tokens, 3);                       // max_completion_tokens wins
  spec = Chat(R"({"messages": [{"role": "user", "content": "q"}]})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->sampling.max_tokens, 64 - static_cast<int>(spec->prompt_tokens.size()));
}

TEST_F(OpenAiRequestTest, MalformedBodies) {
  ExpectBad(Completion("{not json"), "not valid JSON");
  ExpectBad(Completion("[1, 2]"), "JSON object");
  ExpectBad(Completion(""), "not valid JSON");
  ExpectBad(Completion("{\"prompt\": \"\xC3\x28\"}"), "UTF-8");
  ExpectBad(Completion("{\"prompt\": \"\xED\xA0\x80\"}"), "UTF-8");  // a surrogate
  ExpectBad(Completion("{\"prompt\": \"\xC0\xAF\"}"), "UTF-8");      // overlong
}

TEST_F(OpenAiRequestTest, MissingFieldsAndWrongTypes) {
  ExpectBad(Completion(R"({"model": "tiny"})"), "'prompt' is a required field", "prompt");
  ExpectBad(Chat(R"({"model": "tiny"})"), "'messages' is a required field", "messages");
  ExpectBad(Chat(R"({"messages": []})"), "non-empty", "messages");
  ExpectBad(Chat(R"({"messages": [{"content": "x"}]})"), "'role'", "messages[0].role");
  ExpectBad(Chat(R"({"messages": [{"role": "tool", "content": "x"}]})"), "unsupported role");
  ExpectBad(Chat(R"({"messages": [{"role": "user", "content": 5}]})"), "content");
  ExpectBad(Chat(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})"),
            "only text");
  ExpectBad(Completion(R"({"prompt": 5})"), "'prompt' must be");
  ExpectBad(Completion(R"({"prompt": "x", "max_tokens": "5"})"), "'max_tokens' must be an integer",
            "max_tokens");
  ExpectBad(Completion(R"({"prompt": "x", "max_tokens": 2.5})"), "integer", "max_tokens");
  ExpectBad(Completion(R"({"prompt": "x", "temperature": "hot"})"),
            "'temperature' must be a number", "temperature");
  ExpectBad(Completion(R"({"prompt": "x", "stream": "yes"})"), "'stream' must be a boolean",
            "stream");
  ExpectBad(Completion(R"({"prompt": "x", "stop": [1]})"), "'stop' must be", "stop");
  ExpectBad(Completion(R"({"prompt": "x", "model": 3})"), "'model' must be a string", "model");
  ExpectBad(Completion(R"({"prompt": "x", "stream_options": 1})"), "stream_options");
}

TEST_F(OpenAiRequestTest, OutOfRangeSampling) {
  ExpectBad(Completion(R"({"prompt": "x", "max_tokens": 0})"), "max_tokens must be at least 1");
  ExpectBad(Completion(R"({"prompt": "x", "max_tokens": -3})"), "at least 1");
  ExpectBad(Completion(R"({"prompt": "x", "temperature": 2.5})"), "temperature must be in [0, 2]");
  ExpectBad(Completion(R"({"prompt": "x", "temperature": -0.1})"), "temperature");
  ExpectBad(Completion(R"({"prompt": "x", "top_p": 0})"), "top_p must be in (0, 1]", "top_p");
  ExpectBad(Completion(R"({"prompt": "x", "top_p": 1.5})"), "top_p");
  ExpectBad(Completion(R"({"prompt": "x", "top_k": -2})"), "top_k");
  ExpectBad(Completion(R"({"prompt": "x", "stop": ""})"), "must not be empty", "stop");
  ExpectBad(Completion(R"({"prompt": "x", "stop_token_ids": [999]})"), "out of range");
  ExpectBad(Completion(R"({"prompt": "x", "presence_penalty": 3})"), "[-2, 2]");
}

TEST_F(OpenAiRequestTest, UnsupportedFeatures) {
  ExpectBad(Completion(R"({"prompt": "x", "n": 2})"), "n > 1 is not supported", "n");
  ExpectBad(Completion(R"({"prompt": "x", "best_of": 3})"), "best_of");
  ExpectBad(Completion(R"({"prompt": "x", "logprobs": 2})"), "logprobs");
  ExpectBad(Completion(R"({"prompt": "x", "echo": true})"), "echo");
  ExpectBad(Chat(R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true})"),
            "logprobs");
  ExpectBad(Completion(R"({"prompt": ["a", "b"]})"), "batched prompts");
  EXPECT_TRUE(Completion(R"({"prompt": ["single"]})").ok());  // a batch of one is fine
}

TEST_F(OpenAiRequestTest, ContextLength) {
  // 64-token context: a 60-token prompt leaves 4.
  const std::string prompt(59, 'a');  // + BOS = 60 tokens
  EXPECT_TRUE(Completion(R"({"prompt": ")" + prompt + R"(", "max_tokens": 4})").ok());
  ExpectBad(Completion(R"({"prompt": ")" + prompt + R"(", "max_tokens": 5})"),
            "This model's maximum context length is 64 tokens. However, you requested 5 output "
            "tokens and your prompt contains at least 60 input tokens",
            "max_tokens");
  ExpectBad(Completion(R"({"prompt": ")" + std::string(80, 'a') + R"("})"),
            "maximum context length is 64 tokens", "prompt");
  ExpectBad(Completion(R"({"prompt": ")" + std::string(64 * 40, 'a') + R"("})"), "characters",
            "prompt");
  ExpectBad(Completion(R"({"prompt": []})"), "empty");
  ExpectBad(Completion(R"({"prompt": [1, 300]})"), "out of range", "prompt");
}

TEST_F(OpenAiRequestTest, UnknownModelIs404) {
  absl::StatusOr<GenerateSpec> spec = Completion(R"({"model": "gpt-9", "prompt": "x"})");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(HttpStatusFor(spec.status()), 404);
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("The model `gpt-9` does not exist"));
}

TEST(Utf8Test, Validity) {
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("caf\xC3\xA9 \xE4\xB8\xAD \xF0\x9F\x98\x80"));
  EXPECT_FALSE(IsValidUtf8("\xF0\x9F\x98"));      // truncated
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xFF"));
}

}  // namespace
}  // namespace tandem::router
