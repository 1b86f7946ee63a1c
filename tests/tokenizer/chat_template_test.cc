// Chat formatting equals transformers' apply_chat_template(tokenize=False) on the generated
// checkpoints (golden_chat.json, made by make_golden.py with the reference env), including the
// conversations the Llama 2 / Mistral templates reject.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/tokenizer/tokenizer_test_util.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

using nlohmann::json;

std::vector<ChatMessage> Messages(const json& list) {
  std::vector<ChatMessage> messages;
  for (const json& m : list) {
    messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return messages;
}

// Renders every golden case with `format` and compares; returns how many were errors.
int ExpectCasesMatch(const ChatFormat& format, const json& cases) {
  int errors = 0;
  for (const json& c : cases) {
    SCOPED_TRACE(c.dump());
    auto text =
        ApplyChatTemplate(format, Messages(c["messages"]), c["add_generation_prompt"].get<bool>());
    if (c.contains("error")) {
      ++errors;
      EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
    } else {
      EXPECT_TRUE(text.ok()) << text.status();
      if (text.ok()) {
        EXPECT_EQ(*text, c["text"].get<std::string>());
      }
    }
  }
  return errors;
}

TEST(ChatTemplateTest, MatchesTransformersOnGeneratedTemplates) {
  const json golden = json::parse(testing::ReadFileOrDie(testing::TestDataPath("golden_chat.json")),
                                  nullptr, false);
  ASSERT_FALSE(golden.is_discarded());
  const ChatTemplate expected[] = {ChatTemplate::kLlama3, ChatTemplate::kChatML,
                                   ChatTemplate::kLlama2, ChatTemplate::kMistral};
  for (size_t i = 0; i < testing::AllFamilies().size(); ++i) {
    const auto& f = testing::AllFamilies()[i];
    SCOPED_TRACE(f.name);
    auto format = LoadChatFormat(testing::WriteFamily(f));
    ASSERT_TRUE(format.ok()) << format.status();
    EXPECT_EQ(format->tmpl, expected[i]);
    EXPECT_EQ(format->default_system_prompt, "");
    const int errors = ExpectCasesMatch(*format, golden[f.name]["cases"]);
    // transformers rejects the empty conversation; Llama 2 / Mistral also break alternation.
    EXPECT_GE(errors, f.family == TokenizerFamily::kLlama2 || f.family == TokenizerFamily::kMistral
                          ? 6
                          : 2);
  }
}

// The real checkpoints' templates (Meta-Llama-3-Instruct, Llama-2-chat, Mistral-Instruct-v0.2,
// Qwen2-Instruct, Qwen2.5-Instruct) are detected and rendered like transformers does.
TEST(ChatTemplateTest, MatchesTransformersOnRealTemplates) {
  const json golden = json::parse(testing::ReadFileOrDie(testing::TestDataPath("golden_chat.json")),
                                  nullptr, false);
  ASSERT_FALSE(golden.is_discarded());
  int templates = 0;
  for (const auto& f : testing::AllFamilies()) {
    for (const json& real : golden[f.name]["real"]) {
      SCOPED_TRACE(real["name"].get<std::string>());
      auto format = DetectChatFormat(real["template"].get<std::string>());
      ASSERT_TRUE(format.ok()) << format.status();
      ExpectCasesMatch(*format, real["cases"]);
      ++templates;
    }
  }
  EXPECT_EQ(templates, 5);
}

TEST(ChatTemplateTest, FindsQwenDefaultSystemPrompts) {
  const json golden = json::parse(testing::ReadFileOrDie(testing::TestDataPath("golden_chat.json")),
                                  nullptr, false);
  const json& real = golden["qwen2"]["real"];
  ASSERT_EQ(real.size(), 2u);
  EXPECT_EQ(DetectChatFormat(real[0]["template"].get<std::string>())->default_system_prompt,
            "You are a helpful assistant.");
  EXPECT_EQ(DetectChatFormat(real[1]["template"].get<std::string>())->default_system_prompt,
            "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
}

TEST(ChatTemplateTest, DetectsFamiliesFromTemplateMarkers) {
  EXPECT_EQ(*DetectChatTemplate("{{ '<|im_start|>' + message['role'] }}"), ChatTemplate::kChatML);
  EXPECT_EQ(*DetectChatTemplate("{{ '<|start_header_id|>' }}"), ChatTemplate::kLlama3);
  EXPECT_EQ(*DetectChatTemplate("[INST] <<SYS>>\\n"), ChatTemplate::kLlama2);
  EXPECT_EQ(*DetectChatTemplate("{{ '[INST] ' + content + ' [/INST]' }}"), ChatTemplate::kMistral);
  EXPECT_EQ(DetectChatTemplate("{{ messages }}").status().code(), absl::StatusCode::kNotFound);
}

TEST(ChatTemplateTest, ReadsChatTemplateJinjaFile) {
  const std::string dir = testing::MakeTempDir("jinja");
  testing::WriteFileOrDie(dir + "/chat_template.jinja", "{{ '<|im_start|>' }}");
  auto detected = LoadChatTemplate(dir);
  ASSERT_TRUE(detected.ok()) << detected.status();
  EXPECT_EQ(*detected, ChatTemplate::kChatML);
  EXPECT_EQ(LoadChatTemplate(testing::MakeTempDir("none")).status().code(),
            absl::StatusCode::kNotFound);
}

// The formatted prompt tokenizes to the family's special tokens (encode without adding BOS:
// the template already wrote it).
TEST(ChatTemplateTest, FormattedPromptEncodesSpecialTokens) {
  const auto& llama3 = testing::AllFamilies()[0];
  auto tok = Tokenizer::Load(testing::WriteFamily(llama3));
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto text = ApplyChatTemplate(ChatTemplate::kLlama3, {{"user", "Hi"}}, true);
  ASSERT_TRUE(text.ok());
  const std::vector<int32_t> ids = (*tok)->Encode(*text, false);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), (*tok)->bos_id());
  EXPECT_EQ(ids.front(), *(*tok)->TokenToId("<|begin_of_text|>"));
  EXPECT_EQ((*tok)->eos_id(), (*tok)->TokenToId("<|eot_id|>"));
  EXPECT_EQ((*tok)->Decode(ids, false), *text);
}

}  // namespace
}  // namespace tandem
