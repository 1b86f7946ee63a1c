// Chat formatting for the supported families. Each template exists twice: as Jinja (written into
// generated checkpoints' tokenizer_config.json and run by transformers) and as the C++ below,
// which must produce the same text; tests compare both against transformers' output.
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace tandem {
namespace {

void Append(std::string* out, std::initializer_list<std::string_view> parts) {
  for (std::string_view p : parts) out->append(p);
}

bool Contains(std::string_view text, std::string_view needle) {
  return text.find(needle) != std::string_view::npos;
}

constexpr std::string_view kChatMLJinja =
    R"({%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %})";

constexpr std::string_view kLlama3Jinja =
    R"({{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %})";

// Llama 2 chat and Mistral Instruct (v0.1/v0.2) semantics: a leading system message (Llama 2
// only, even if empty) is folded into the first turn; user/assistant must alternate; Llama 2
// strips each turn and skips other roles, Mistral rejects them.
constexpr std::string_view kLlama2Jinja =
    R"({%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}{%- set loop_messages = messages[1:] %}{%- else %}{%- set system_message = none %}{%- set loop_messages = messages %}{%- endif %}{%- for message in loop_messages %}{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif %}{%- if loop.first and system_message is not none %}{%- set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{%- else %}{%- set content = message['content'] %}{%- endif %}{%- if message['role'] == 'user' %}{{- bos_token + '[INST] ' + content | trim + ' [/INST]' }}{%- elif message['role'] == 'assistant' %}{{- ' ' + content | trim + ' ' + eos_token }}{%- endif %}{%- endfor %})";

constexpr std::string_view kMistralJinja =
    R"({{- bos_token }}{%- for message in messages %}{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif %}{%- if message['role'] == 'user' %}{{- '[INST] ' + message['content'] + ' [/INST]' }}{%- elif message['role'] == 'assistant' %}{{- message['content'] + eos_token }}{%- else %}{{- raise_exception('Only user and assistant roles are supported!') }}{%- endif %}{%- endfor %})";

std::string ChatML(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                   std::string_view default_system_prompt) {
  std::string out;
  if (!default_system_prompt.empty() && messages[0].role != "system") {
    Append(&out, {"<|im_start|>system\n", default_system_prompt, "<|im_end|>\n"});
  }
  for (const ChatMessage& m : messages) {
    Append(&out, {"<|im_start|>", m.role, "\n", m.content, "<|im_end|>\n"});
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

std::string Llama3(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string out = "<|begin_of_text|>";
  for (const ChatMessage& m : messages) {
    Append(&out, {"<|start_header_id|>", m.role, "<|end_header_id|>\n\n",
                  utf8::PythonStrip(m.content), "<|eot_id|>"});
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

absl::Status AlternationError() {
  return absl::InvalidArgumentError(
      "Conversation roles must alternate user/assistant/user/assistant/...");
}

absl::StatusOr<std::string> Llama2(const std::vector<ChatMessage>& messages) {
  const bool has_system = messages[0].role == "system";
  const size_t first = has_system ? 1 : 0;
  std::string out;
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if ((m.role == "user") != ((i - first) % 2 == 0)) return AlternationError();
    std::string content = m.content;
    if (i == first && has_system) {
      content = "<<SYS>>\n" + messages[0].content + "\n<</SYS>>\n\n" + m.content;
    }
    if (m.role == "user") {
      Append(&out, {"<s>[INST] ", utf8::PythonStrip(content), " [/INST]"});
    } else if (m.role == "assistant") {
      Append(&out, {" ", utf8::PythonStrip(content), " </s>"});
    }  // the template renders nothing for other roles
  }
  return out;
}

absl::StatusOr<std::string> Mistral(const std::vector<ChatMessage>& messages) {
  std::string out = "<s>";
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if ((m.role == "user") != (i % 2 == 0)) return AlternationError();
    if (m.role == "user") {
      Append(&out, {"[INST] ", m.content, " [/INST]"});
    } else if (m.role == "assistant") {
      Append(&out, {m.content, "</s>"});
    } else {
      return absl::InvalidArgumentError("Only user and assistant roles are supported!");
    }
  }
  return out;
}

// The system prompt a ChatML template inserts when the conversation has none: the literal in
// '<|im_start|>system\n...<|im_end|>' (Qwen2 and Qwen2.5 carry one; Qwen3 does not).
std::string DefaultSystemPrompt(std::string_view text) {
  static constexpr std::string_view kOpen = "'<|im_start|>system\\n";
  for (size_t pos = text.find(kOpen); pos != std::string_view::npos;
       pos = text.find(kOpen, pos + 1)) {
    const size_t begin = pos + kOpen.size();
    const size_t end = text.find("<|im_end|>", begin);
    if (end == std::string_view::npos) break;
    const std::string_view literal = text.substr(begin, end - begin);
    if (literal.empty() || literal.find_first_of("'\"{}<") != std::string_view::npos) continue;
    std::string prompt;  // undo the Jinja string escapes a prompt may contain
    for (size_t i = 0; i < literal.size(); ++i) {
      if (literal[i] == '\\' && i + 1 < literal.size()) {
        ++i;
        prompt.push_back(literal[i] == 'n' ? '\n' : literal[i]);
      } else {
        prompt.push_back(literal[i]);
      }
    }
    return prompt;
  }
  return "";
}

// The template text of a checkpoint: chat_template.jinja (newer files) or tokenizer_config.json's
// "chat_template" (a string, or a list of named templates of which "default" is used).
absl::StatusOr<std::string> ReadTemplateText(const std::string& dir) {
  std::ifstream jinja(dir + "/chat_template.jinja", std::ios::binary);
  if (jinja) {
    std::stringstream text;
    text << jinja.rdbuf();
    return text.str();
  }
  std::ifstream file(dir + "/tokenizer_config.json", std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat("no tokenizer_config.json in ", dir));
  std::stringstream text;
  text << file.rdbuf();
  const nlohmann::json config = nlohmann::json::parse(text.str(), nullptr, false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, "/tokenizer_config.json is not JSON"));
  }
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) {
    return absl::NotFoundError(absl::StrCat(dir, "/tokenizer_config.json has no chat_template"));
  }
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (const auto& entry : *it) {
      const auto name = entry.is_object() ? entry.find("name") : entry.end();
      if (name != entry.end() && *name == "default" && entry.contains("template") &&
          entry["template"].is_string()) {
        return entry["template"].get<std::string>();
      }
    }
  }
  return absl::InvalidArgumentError("chat_template is neither a string nor a named list");
}

}  // namespace

std::string_view ChatTemplateJinja(ChatTemplate tmpl) {
  switch (tmpl) {
    case ChatTemplate::kChatML:
      return kChatMLJinja;
    case ChatTemplate::kLlama3:
      return kLlama3Jinja;
    case ChatTemplate::kLlama2:
      return kLlama2Jinja;
    case ChatTemplate::kMistral:
      return kMistralJinja;
  }
  return kChatMLJinja;
}

absl::StatusOr<ChatTemplate> DetectChatTemplate(std::string_view text) {
  if (Contains(text, "<|im_start|>")) return ChatTemplate::kChatML;
  if (Contains(text, "<|start_header_id|>")) return ChatTemplate::kLlama3;
  if (Contains(text, "[INST]")) {
    return Contains(text, "<<SYS>>") ? ChatTemplate::kLlama2 : ChatTemplate::kMistral;
  }
  return absl::NotFoundError(
      "chat_template has none of the markers of a supported family (<|im_start|>, "
      "<|start_header_id|>, [INST])");
}

absl::StatusOr<ChatFormat> DetectChatFormat(std::string_view text) {
  ChatFormat format;
  ASSIGN_OR_RETURN(format.tmpl, DetectChatTemplate(text));
  if (format.tmpl == ChatTemplate::kChatML)
    format.default_system_prompt = DefaultSystemPrompt(text);
  return format;
}

absl::StatusOr<std::string> ApplyChatTemplate(const ChatFormat& format,
                                              const std::vector<ChatMessage>& messages,
                                              bool add_generation_prompt) {
  if (messages.empty()) {  // transformers refuses these before rendering
    return absl::InvalidArgumentError("cannot apply a chat template to an empty conversation");
  }
  switch (format.tmpl) {
    case ChatTemplate::kChatML:
      return ChatML(messages, add_generation_prompt, format.default_system_prompt);
    case ChatTemplate::kLlama3:
      return Llama3(messages, add_generation_prompt);
    case ChatTemplate::kLlama2:
      return Llama2(messages);
    case ChatTemplate::kMistral:
      return Mistral(messages);
  }
  return absl::InvalidArgumentError("unknown chat template");
}

absl::StatusOr<std::string> ApplyChatTemplate(ChatTemplate tmpl,
                                              const std::vector<ChatMessage>& messages,
                                              bool add_generation_prompt) {
  return ApplyChatTemplate(ChatFormat{tmpl, ""}, messages, add_generation_prompt);
}

absl::StatusOr<ChatFormat> LoadChatFormat(const std::string& dir) {
  ASSIGN_OR_RETURN(const std::string text, ReadTemplateText(dir));
  return DetectChatFormat(text);
}

absl::StatusOr<ChatTemplate> LoadChatTemplate(const std::string& dir) {
  ASSIGN_OR_RETURN(const ChatFormat format, LoadChatFormat(dir));
  return format.tmpl;
}

}  // namespace tandem
