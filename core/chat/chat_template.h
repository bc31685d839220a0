// ChatTemplate: a model's chat template (tokenizer_config.json's
// "chat_template") turned into the prompt text for a conversation, the way
// transformers' apply_chat_template(tokenize=False) does it, with the Jinja
// subset of jinja.h (checked byte for byte against @huggingface/jinja on the
// Qwen3, Qwen2.5 and Llama-3.2 templates: tests/chat/).
//
// Variables a template sees: messages, tools (none when absent),
// add_generation_prompt, bos_token / eos_token (only when the model has
// them, as transformers passes only the special tokens that are set), and
// every member of Inputs::extra (e.g. enable_thinking).
//
// Thread-safety: immutable after Parse; Render is const and thread-safe.
// Copies share the parsed template.
//
// Example:
//   auto t = ChatTemplate::FromTokenizerConfig(model_dir / "tokenizer_config.json");
//   if (absl::IsNotFound(t.status())) t = ChatTemplate::Parse(ChatMlTemplate(), "", "<|im_end|>");
//   ChatTemplate::Inputs in;
//   in.messages = nlohmann::ordered_json::parse(R"([{"role":"user","content":"Hi"}])");
//   CORTIQ_ASSIGN_OR_RETURN(std::string prompt, t->Render(in));
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/chat/jinja.h"
#include "nlohmann/json.hpp"

namespace cortiq::chat {

class ChatTemplate {
 public:
  // bos / eos: the model's special tokens; "" when the model has none (the
  // variable is then undefined). Errors: INVALID_ARGUMENT
  // "chat_template:LINE:COL: ..." for a template the subset cannot render.
  static absl::StatusOr<ChatTemplate> Parse(std::string_view source, std::string bos, std::string eos);

  // Reads a tokenizer_config.json: "chat_template" as a string or as the list
  // of {"name", "template"} (the one named "default"); bos_token / eos_token
  // as a string, null or {"content": ...}. Errors: NOT_FOUND when the file
  // does not exist or has no chat template (the caller falls back to
  // ChatMlTemplate()); INVALID_ARGUMENT naming the file for malformed JSON,
  // fields of the wrong type, or a template Parse refuses. Reads the file
  // (at most 64 MiB).
  static absl::StatusOr<ChatTemplate> FromTokenizerConfig(const std::filesystem::path& file);

  // ordered_json, not json: member order is part of the prompt (tool
  // schemas are printed with tojson in the order the client sent them).
  struct Inputs {
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // array of message objects
    nlohmann::ordered_json tools;                                      // null or an array
    bool add_generation_prompt = true;
    nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // more variables, e.g. {"enable_thinking": false}
    std::optional<absl::Time> now;  // strftime_now's clock (tests); unset: the wall clock
    jinja::RenderLimits limits;
  };

  // Errors, all INVALID_ARGUMENT: messages not an array, tools neither null
  // nor an array, extra not an object or naming a reserved variable;
  // raise_exception(msg) in the template -> "chat template: msg"; any other
  // template failure or limit -> "chat_template:LINE:COL: ...".
  absl::StatusOr<std::string> Render(const Inputs& inputs) const;

  const std::string& bos_token() const { return bos_; }
  const std::string& eos_token() const { return eos_; }

 private:
  ChatTemplate(JinjaTemplate t, std::string bos, std::string eos)
      : template_(std::move(t)), bos_(std::move(bos)), eos_(std::move(eos)) {}

  JinjaTemplate template_;
  std::string bos_;
  std::string eos_;
};

// A plain ChatML template (<|im_start|>role\ncontent<|im_end|>\n per message;
// system, user, assistant and tool roles; text content or a list of
// {"type": "text", "text": ...} parts; add_generation_prompt) for models
// without one. models/cortiq-byte-4m/tokenizer_config.json and
// tools/train/train.py carry the same text (tests/chat/chat_template_test.cc
// checks).
std::string_view ChatMlTemplate();

}  // namespace cortiq::chat
