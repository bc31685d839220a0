// ChatTemplate: tokenizer_config.json loading and apply_chat_template-style
// rendering (chat_template.h).
#include "core/chat/chat_template.h"

#include <fstream>
#include <sstream>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/util/strings.h"

namespace cortiq::chat {
namespace {

constexpr uintmax_t kMaxConfigBytes = uintmax_t{64} << 20;

constexpr std::string_view kChatMl =
    "{%- for message in messages %}\n"
    "    {{- '<|im_start|>' + message.role + '\\n' }}\n"
    "    {%- if message.content is string %}\n"
    "        {{- message.content }}\n"
    "    {%- elif message.content is iterable %}\n"
    "        {%- for part in message.content %}\n"
    "            {%- if part.type == 'text' %}\n"
    "                {{- part.text }}\n"
    "            {%- endif %}\n"
    "        {%- endfor %}\n"
    "    {%- endif %}\n"
    "    {{- '<|im_end|>\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n";

// bos_token / eos_token: a string, null / absent, or {"content": "..."}.
absl::StatusOr<std::string> SpecialToken(const nlohmann::json& config, const char* field,
                                         const std::string& file) {
  if (!config.contains(field) || config[field].is_null()) return std::string();
  const nlohmann::json& v = config[field];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return absl::InvalidArgumentError(
      absl::StrCat(file, ": ", field, " must be a string, null or {\"content\": string}"));
}

}  // namespace

std::string_view ChatMlTemplate() { return kChatMl; }

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source, std::string bos, std::string eos) {
  auto t = JinjaTemplate::Parse(source, "chat_template");
  if (!t.ok()) return t.status();
  return ChatTemplate(*std::move(t), std::move(bos), std::move(eos));
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromTokenizerConfig(const std::filesystem::path& file) {
  const std::string name = file.string();
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) return absl::NotFoundError(absl::StrCat(name, ": no such file"));
  const uintmax_t size = std::filesystem::file_size(file, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat(name, ": cannot read: ", util::Sv(ec.message())));
  if (size > kMaxConfigBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": ", size, " bytes exceeds the limit of ", kMaxConfigBytes, " bytes"));
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(name, ": cannot open"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  const nlohmann::json config = nlohmann::json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": not a JSON object"));
  }
  if (!config.contains("chat_template") || config["chat_template"].is_null()) {
    return absl::NotFoundError(absl::StrCat(name, ": no chat_template"));
  }
  const nlohmann::json& ct = config["chat_template"];
  std::string source;
  if (ct.is_string()) {
    source = ct.get<std::string>();
  } else if (ct.is_array()) {
    bool found = false;
    for (const auto& entry : ct) {
      if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
          !entry["name"].is_string() || !entry["template"].is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": chat_template list entries must be {\"name\": string, \"template\": string}"));
      }
      if (entry["name"] == "default") {
        source = entry["template"].get<std::string>();
        found = true;
      }
    }
    if (!found) return absl::NotFoundError(absl::StrCat(name, ": chat_template list has no \"default\" entry"));
  } else {
    return absl::InvalidArgumentError(absl::StrCat(name, ": chat_template must be a string or a list"));
  }
  auto bos = SpecialToken(config, "bos_token", name);
  if (!bos.ok()) return bos.status();
  auto eos = SpecialToken(config, "eos_token", name);
  if (!eos.ok()) return eos.status();
  auto t = JinjaTemplate::Parse(source, "chat_template");
  if (!t.ok()) return absl::InvalidArgumentError(absl::StrCat(name, ": ", t.status().message()));
  return ChatTemplate(*std::move(t), *std::move(bos), *std::move(eos));
}

absl::StatusOr<std::string> ChatTemplate::Render(const Inputs& inputs) const {
  if (!inputs.messages.is_array()) return absl::InvalidArgumentError("messages must be an array");
  if (!inputs.tools.is_null() && !inputs.tools.is_array()) {
    return absl::InvalidArgumentError("tools must be null or an array");
  }
  if (!inputs.extra.is_null() && !inputs.extra.is_object()) {
    return absl::InvalidArgumentError("chat template variables (extra) must be an object");
  }
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  vars["messages"] = inputs.messages;
  vars["tools"] = inputs.tools;
  vars["add_generation_prompt"] = inputs.add_generation_prompt;
  if (!bos_.empty()) vars["bos_token"] = bos_;
  if (!eos_.empty()) vars["eos_token"] = eos_;
  if (inputs.extra.is_object()) {
    for (auto it = inputs.extra.begin(); it != inputs.extra.end(); ++it) {
      if (vars.contains(it.key()) || IsJinjaGlobalName(it.key())) {
        return absl::InvalidArgumentError(
            absl::StrCat("chat template variable '", util::Sv(it.key()), "' is reserved"));
      }
      vars[it.key()] = it.value();
    }
  }
  JinjaRenderOptions options;
  options.limits = inputs.limits;
  options.now = inputs.now;
  auto out = template_.Render(vars, options);
  if (!out.ok() && JinjaTemplate::IsRaisedError(out.status())) {
    return absl::InvalidArgumentError(absl::StrCat("chat template: ", out.status().message()));
  }
  return out;
}

}  // namespace cortiq::chat
