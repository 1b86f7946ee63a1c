// Chat formatting for the supported families. Each template exists twice: as Jinja (written into
// generated checkpoints' tokenizer_config.json and run by transformers) and as the C++ below,
// which must produce the same text; tests compare both against transformers' output.
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/utf8.h"
#include "nlohmann/json.hpp"

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

constexpr std::string_view kLlama2Jinja =
    R"({%- if messages and messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] | trim %}{%- set loop_messages = messages[1:] %}{%- else %}{%- set system_message = '' %}{%- set loop_messages = messages %}{%- endif %}{%- for message in loop_messages %}{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif %}{%- if message['role'] == 'user' %}{%- if loop.first and system_message %}{%- set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] | trim %}{%- else %}{%- set content = message['content'] | trim %}{%- endif %}{{- bos_token + '[INST] ' + content + ' [/INST]' }}{%- elif message['role'] == 'assistant' %}{{- ' ' + message['content'] | trim + ' ' + eos_token }}{%- else %}{{- raise_exception('Only system, user and assistant roles are supported!') }}{%- endif %}{%- endfor %})";

constexpr std::string_view kMistralJinja =
    R"({%- if messages and messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}{%- set loop_messages = messages[1:] %}{%- else %}{%- set system_message = '' %}{%- set loop_messages = messages %}{%- endif %}{{- bos_token }}{%- for message in loop_messages %}{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif %}{%- if message['role'] == 'user' %}{%- if loop.first and system_message %}{{- '[INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' }}{%- else %}{{- '[INST] ' + message['content'] + ' [/INST]' }}{%- endif %}{%- elif message['role'] == 'assistant' %}{{- message['content'] + eos_token }}{%- else %}{{- raise_exception('Only system, user and assistant roles are supported!') }}{%- endif %}{%- endfor %})";

std::string ChatML(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string out;
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

// Llama 2 and Mistral: an optional leading system message, then user/assistant alternating.
absl::Status CheckAlternation(const std::vector<ChatMessage>& messages, size_t first) {
  for (size_t i = first; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if ((role == "user") != ((i - first) % 2 == 0)) {
      return absl::InvalidArgumentError(
          "Conversation roles must alternate user/assistant/user/assistant/...");
    }
    if (role != "user" && role != "assistant") {
      return absl::InvalidArgumentError("Only system, user and assistant roles are supported!");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Llama2(const std::vector<ChatMessage>& messages) {
  const bool has_system = !messages.empty() && messages[0].role == "system";
  const size_t first = has_system ? 1 : 0;
  if (absl::Status s = CheckAlternation(messages, first); !s.ok()) return s;
  const std::string_view system = has_system ? utf8::PythonStrip(messages[0].content) : "";
  std::string out;
  for (size_t i = first; i < messages.size(); ++i) {
    const std::string_view content = utf8::PythonStrip(messages[i].content);
    if (messages[i].role == "assistant") {
      Append(&out, {" ", content, " </s>"});
    } else if (i == first && !system.empty()) {
      Append(&out, {"<s>[INST] <<SYS>>\n", system, "\n<</SYS>>\n\n", content, " [/INST]"});
    } else {
      Append(&out, {"<s>[INST] ", content, " [/INST]"});
    }
  }
  return out;
}

absl::StatusOr<std::string> Mistral(const std::vector<ChatMessage>& messages) {
  const bool has_system = !messages.empty() && messages[0].role == "system";
  const size_t first = has_system ? 1 : 0;
  if (absl::Status s = CheckAlternation(messages, first); !s.ok()) return s;
  const std::string_view system = has_system ? std::string_view(messages[0].content) : "";
  std::string out = "<s>";
  for (size_t i = first; i < messages.size(); ++i) {
    const std::string& content = messages[i].content;
    if (messages[i].role == "assistant") {
      Append(&out, {content, "</s>"});
    } else if (i == first && !system.empty()) {
      Append(&out, {"[INST] ", system, "\n\n", content, " [/INST]"});
    } else {
      Append(&out, {"[INST] ", content, " [/INST]"});
    }
  }
  return out;
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

absl::StatusOr<std::string> ApplyChatTemplate(ChatTemplate tmpl,
                                              const std::vector<ChatMessage>& messages,
                                              bool add_generation_prompt) {
  if (messages.empty()) {  // transformers refuses these before rendering
    return absl::InvalidArgumentError("cannot apply a chat template to an empty conversation");
  }
  switch (tmpl) {
    case ChatTemplate::kChatML:
      return ChatML(messages, add_generation_prompt);
    case ChatTemplate::kLlama3:
      return Llama3(messages, add_generation_prompt);
    case ChatTemplate::kLlama2:
      return Llama2(messages);
    case ChatTemplate::kMistral:
      return Mistral(messages);
  }
  return absl::InvalidArgumentError("unknown chat template");
}

absl::StatusOr<ChatTemplate> LoadChatTemplate(const std::string& dir) {
  // Newer checkpoints keep the template in chat_template.jinja, older ones in the config.
  std::ifstream jinja(dir + "/chat_template.jinja", std::ios::binary);
  if (jinja) {
    std::stringstream text;
    text << jinja.rdbuf();
    return DetectChatTemplate(text.str());
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
  if (it->is_string()) return DetectChatTemplate(it->get<std::string>());
  if (it->is_array()) {  // [{"name": "default", "template": "..."}, ...]
    for (const auto& entry : *it) {
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string()) {
        return DetectChatTemplate(entry["template"].get<std::string>());
      }
    }
  }
  return absl::InvalidArgumentError("chat_template is neither a string nor a named list");
}

}  // namespace tandem
