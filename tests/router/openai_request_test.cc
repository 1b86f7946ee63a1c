// Validation of OpenAI request bodies: every bad input is a clear 400 (or 404 for an unknown
// model) naming the field, never a crash; good input resolves defaults as OpenAI / vLLM do.
#include "router/openai_request.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "router/api_error.h"
#include "router/openai_response.h"
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

// vLLM's prompt_logprobs (completions and chat) and echo + logprobs: what the workers are asked
// to compute (SamplingSpec::prompt_logprobs, the larger of the two asks) and what is shown.
TEST_F(OpenAiRequestTest, PromptLogprobsAndEchoWithLogprobs) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
  absl::StatusOr<GenerateSpec> s = Completion(R"({"prompt": "x", "prompt_logprobs": 3})");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->prompt_logprobs, 3);
  EXPECT_EQ(s->sampling.prompt_logprobs, 3);
  EXPECT_EQ(s->sampling.logprobs, -1);
  s = Completion(R"({"prompt": "x", "echo": true, "logprobs": 4})");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->prompt_logprobs, -1);  // not shown as the vLLM field
  EXPECT_EQ(s->sampling.prompt_logprobs, 4);
  s = Completion(R"({"prompt": "x", "echo": true, "logprobs": 2, "prompt_logprobs": 0})");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->prompt_logprobs, 0);
  EXPECT_EQ(s->sampling.prompt_logprobs, 2);
  s = Completion(R"({"prompt": "x", "echo": true})");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->sampling.prompt_logprobs, -1);  // echo alone scores nothing
  s = Completion(R"({"prompt": "x", "echo": true, "logprobs": 1, "stream": true})");
  ASSERT_TRUE(s.ok()) << s.status();  // streamed echo + logprobs: the first chunk carries them
  s = Chat("{" + msgs + R"(, "prompt_logprobs": 20})");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->sampling.prompt_logprobs, 20);
  ExpectBad(Completion(R"({"prompt": "x", "prompt_logprobs": -1})"),
            "prompt_logprobs must be in [0, 20], got -1", "prompt_logprobs");
  ExpectBad(Completion(R"({"prompt": "x", "prompt_logprobs": 21})"),
            "prompt_logprobs must be in [0, 20], got 21", "prompt_logprobs");
  ExpectBad(Completion(R"({"prompt": "x", "prompt_logprobs": "2"})"), "prompt_logprobs",
            "prompt_logprobs");
  ExpectBad(Completion(R"({"prompt": "x", "prompt_logprobs": 1.5})"), "prompt_logprobs",
            "prompt_logprobs");
  ExpectBad(Completion(R"({"prompt": "x", "prompt_logprobs": 1, "stream": true})"),
            "not available when stream is true", "prompt_logprobs");
  ExpectBad(Chat("{" + msgs + R"(, "prompt_logprobs": 0, "stream": true})"),
            "not available when stream is true", "prompt_logprobs");
}

TEST_F(OpenAiRequestTest, UnsupportedFeaturesAre400) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
  ExpectBad(Chat("{" + msgs + R"(, "tools": [{"type": "function"}]})"), "not supported", "tools");
  ExpectBad(Chat("{" + msgs + R"(, "tool_choice": "auto"})"), "tool calling", "tool_choice");
  EXPECT_TRUE(Chat("{" + msgs + R"(, "tool_choice": "none"})").ok());
  ExpectBad(Chat("{" + msgs + R"(, "functions": []})"), "not supported", "functions");
  ExpectBad(Chat("{" + msgs + R"(, "reasoning_effort": "low"})"), "not supported",
            "reasoning_effort");
  ExpectBad(Chat("{" + msgs + R"(, "response_format": {"type": "json_object"}})"),
            "response_format", "response_format");
  ExpectBad(Chat("{" + msgs + R"(, "response_format": {"type": "json_schema"}})"),
            "response_format", "response_format");
  EXPECT_TRUE(Chat("{" + msgs + R"(, "response_format": {"type": "text"}})").ok());
  ExpectBad(Chat("{" + msgs + R"(, "best_of": 2})"), "best_of", "best_of");
  ExpectBad(Completion(R"({"prompt": "x", "suffix": "y"})"), "suffix", "suffix");
  EXPECT_TRUE(Completion(R"({"prompt": "x", "echo": true, "logprobs": null})").ok());
  ExpectBad(Chat("{" + msgs + R"(, "echo": true})"), "not supported on /v1/chat/completions",
            "echo");
  EXPECT_TRUE(Chat("{" + msgs + R"(, "echo": false})").ok());
  ExpectBad(Completion(R"({"prompt": "x", "guided_json": {}})"), "not supported", "guided_json");
  EXPECT_TRUE(Completion(R"({"prompt": "x", "prompt_logprobs": null})").ok());
  ExpectBad(Completion(R"({"prompt": "x", "use_beam_search": true})"), "beam search");
  ExpectBad(Completion(R"({"prompt": "x", "n": 2, "best_of": 3, "stream": true})"),
            "cannot be streamed", "best_of");
  EXPECT_TRUE(Completion(R"({"prompt": "x", "user": "u", "parallel_tool_calls": true})").ok());
}

TEST_F(OpenAiRequestTest, SamplingFieldsAreParsed) {
  absl::StatusOr<GenerateSpec> spec = Completion(
      R"({"prompt": "x", "max_tokens": 8, "presence_penalty": 0.5, "frequency_penalty": -1,
          "repetition_penalty": 1.2, "min_p": 0.1, "min_tokens": 3,
          "logit_bias": {"7": 100, "3": -2.5}, "logprobs": 4, "echo": false,
          "include_stop_str_in_output": true, "n": 2, "best_of": 3,
          "stream_options": {"include_usage": true, "continuous_usage_stats": true}})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const SamplingSpec& s = spec->sampling;
  EXPECT_FLOAT_EQ(s.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(s.frequency_penalty, -1.0f);
  EXPECT_FLOAT_EQ(s.repetition_penalty, 1.2f);
  EXPECT_FLOAT_EQ(s.min_p, 0.1f);
  EXPECT_EQ(s.min_tokens, 3);
  EXPECT_EQ(s.logit_bias, (std::vector<std::pair<int32_t, float>>{{3, -2.5f}, {7, 100.0f}}));
  EXPECT_EQ(s.logprobs, 4);
  EXPECT_TRUE(s.include_stop_str_in_output);
  EXPECT_EQ(spec->n, 2);
  EXPECT_EQ(spec->best_of, 3);
  EXPECT_TRUE(spec->continuous_usage_stats);
  // Chat: logprobs + top_logprobs.
  spec = Chat(R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true,
                  "top_logprobs": 2, "n": 3})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->sampling.logprobs, 2);
  EXPECT_EQ(spec->n, 3);
  EXPECT_EQ(spec->best_of, 3);
  spec = Chat(R"({"messages": [{"role": "user", "content": "x"}], "logprobs": false})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->sampling.logprobs, -1);
}

TEST_F(OpenAiRequestTest, SamplingFieldsOutOfRange) {
  const std::string chat = R"({"messages": [{"role": "user", "content": "x"}], )";
  ExpectBad(Completion(R"({"prompt": "x", "min_p": 1.5})"), "min_p must be in [0, 1]", "min_p");
  ExpectBad(Completion(R"({"prompt": "x", "repetition_penalty": 0})"), "greater than zero",
            "repetition_penalty");
  ExpectBad(Completion(R"({"prompt": "x", "frequency_penalty": -2.5})"), "[-2, 2]",
            "frequency_penalty");
  ExpectBad(Completion(R"({"prompt": "x", "max_tokens": 4, "min_tokens": 5})"),
            "min_tokens must be in [0, max_tokens = 4]", "min_tokens");
  ExpectBad(Completion(R"({"prompt": "x", "min_tokens": -1})"), "min_tokens", "min_tokens");
  ExpectBad(Completion(R"({"prompt": "x", "logit_bias": {"5": 101}})"), "[-100, 100]",
            "logit_bias");
  ExpectBad(Completion(R"({"prompt": "x", "logit_bias": {"abc": 1}})"), "not a token id",
            "logit_bias");
  ExpectBad(Completion(R"({"prompt": "x", "logit_bias": {"100000": 1}})"), "out of range",
            "logit_bias");
  ExpectBad(Completion(R"({"prompt": "x", "logit_bias": {"5": "a"}})"), "must be a number",
            "logit_bias");
  ExpectBad(Completion(R"({"prompt": "x", "logit_bias": [1]})"), "must be an object", "logit_bias");
  ExpectBad(Completion(R"({"prompt": "x", "logprobs": 21})"), "logprobs must be in [0, 20]",
            "logprobs");
  ExpectBad(Chat(chat + R"("logprobs": true, "top_logprobs": 21})"), "top_logprobs",
            "top_logprobs");
  ExpectBad(Chat(chat + R"("top_logprobs": 2})"), "needs logprobs", "top_logprobs");
  ExpectBad(Completion(R"({"prompt": "x", "n": 0})"), "n must be in [1, 64]", "n");
  ExpectBad(Completion(R"({"prompt": "x", "n": 3, "best_of": 2})"), "best_of must be in [n = 3",
            "best_of");
  ExpectBad(Completion(R"({"prompt": ["a", "b", "c"], "best_of": 30})"), "prompts x best_of",
            "best_of");
}

TEST_F(OpenAiRequestTest, BatchedPrompts) {
  absl::StatusOr<GenerateSpec> spec = Completion(R"({"prompt": ["ab", "c"], "max_tokens": 2})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->prompt_tokens, (std::vector<int32_t>{ByteTokenizer::kBos, 'a', 'b'}));
  ASSERT_EQ(spec->more_prompts.size(), 1u);
  EXPECT_EQ(spec->more_prompts[0], (std::vector<int32_t>{ByteTokenizer::kBos, 'c'}));
  spec = Completion(R"({"prompt": [[1, 2], [3]]})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->prompt_tokens, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(spec->more_prompts, (std::vector<std::vector<int32_t>>{{3}}));
  EXPECT_TRUE(Completion(R"({"prompt": ["single"]})").ok());
  ExpectBad(Completion(R"({"prompt": ["a", 3]})"), "each prompt of a batch", "prompt");
  ExpectBad(Completion(R"({"prompt": ["a", [1, 999]]})"), "out of range", "prompt");
  // Every prompt of the batch must fit with max_tokens.
  ExpectBad(Completion(R"({"prompt": ["a", ")" + std::string(62, 'b') + R"("], "max_tokens": 4})"),
            "maximum context length", "max_tokens");
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

// vLLM's prompt_logprobs shape: null first, then {id: {logprob, rank, decoded_token}} with the
// prompt token first; rank null for a prompt token outside the alternatives; at most `top`
// alternatives shown. Echo's legacy part: the first token with nulls, then the others.
TEST(OpenAiResponseTest, PromptLogprobsFormats) {
  std::vector<TokenLogprobInfo> prompt(2);
  prompt[0].sampled = {7, "b", -0.5f};
  prompt[0].top = {{7, "b", -0.5f}, {9, "c", -1.5f}, {3, "d", -2.0f}};
  prompt[1].sampled = {4, "e", -6.0f};
  prompt[1].top = {{8, "f", -0.1f}, {2, "g", -3.0f}, {5, "h", -4.0f}};
  const nlohmann::json j = PromptLogprobsJson(prompt, 2);
  ASSERT_EQ(j.size(), 3u);
  EXPECT_TRUE(j[0].is_null());
  EXPECT_EQ(j[1].size(), 2u);  // the prompt token is also the top one
  EXPECT_EQ(j[1]["7"]["rank"], 1);
  EXPECT_EQ(j[1]["7"]["decoded_token"], "b");
  EXPECT_EQ(j[1]["9"]["rank"], 2);
  EXPECT_FLOAT_EQ(j[1]["9"]["logprob"].get<float>(), -1.5f);
  EXPECT_EQ(j[2].size(), 3u);
  EXPECT_TRUE(j[2]["4"]["rank"].is_null());
  EXPECT_FLOAT_EQ(j[2]["4"]["logprob"].get<float>(), -6.0f);
  EXPECT_EQ(j[2]["8"]["rank"], 1);
  EXPECT_FALSE(j[2].contains("5"));  // the third alternative: beyond top = 2
  int64_t offset = -1;
  const nlohmann::json e = EchoLogprobsJson("a", prompt, 1, &offset);
  EXPECT_EQ(e["tokens"], nlohmann::json({"a", "b", "e"}));
  EXPECT_TRUE(e["token_logprobs"][0].is_null());
  EXPECT_TRUE(e["top_logprobs"][0].is_null());
  EXPECT_FLOAT_EQ(e["token_logprobs"][2].get<float>(), -6.0f);
  EXPECT_EQ(e["top_logprobs"][2].size(), 2u);  // "f" and the prompt token "e"
  EXPECT_EQ(e["text_offset"], nlohmann::json({0, 1, 2}));
  EXPECT_EQ(offset, 3);
}

}  // namespace
}  // namespace tandem::router
