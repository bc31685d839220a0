#include "server/http/openai_request.h"

#include <openssl/sha.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/session/session_store.h"
#include "core/util/status_macros.h"
#include "core/util/strings.h"

namespace cortiq::server::http {

namespace {

absl::Status FieldError(std::string_view field, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(util::Sv(field), ": ", util::Sv(what)));
}

absl::Status NotSupported(std::string_view field, std::string_view what) {
  return FieldError(field, absl::StrCat(util::Sv(what), " is not supported yet"));
}

// The member `key` of `body`, or nullptr when absent or null (the API's
// "not given").
const Json* Member(const Json& body, std::string_view key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<bool> Bool(const Json& v, std::string_view field) {
  if (!v.is_boolean()) return FieldError(field, "must be a boolean");
  return v.get<bool>();
}

absl::StatusOr<double> Number(const Json& v, std::string_view field) {
  if (!v.is_number()) return FieldError(field, "must be a number");
  return v.get<double>();
}

// A float field: a number that a float holds (finite and within range).
absl::StatusOr<float> Float(const Json& v, std::string_view field) {
  CORTIQ_ASSIGN_OR_RETURN(double d, Number(v, field));
  if (!std::isfinite(d) || std::abs(d) > std::numeric_limits<float>::max()) {
    return FieldError(field, "must be a finite number");
  }
  return static_cast<float>(d);
}

absl::StatusOr<int64_t> Integer(const Json& v, std::string_view field) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::abs(d) < 9.0e15) {
      return static_cast<int64_t>(d);
    }
  }
  return FieldError(field, "must be an integer");
}

// A count: an integer >= 0 that size_t holds.
absl::StatusOr<size_t> Count(const Json& v, std::string_view field) {
  if (v.is_number_unsigned()) return static_cast<size_t>(v.get<uint64_t>());
  CORTIQ_ASSIGN_OR_RETURN(int64_t i, Integer(v, field));
  if (i < 0) return FieldError(field, absl::StrCat("must be >= 0, got ", i));
  return static_cast<size_t>(i);
}

absl::StatusOr<int32_t> TokenId(const Json& v, std::string_view field) {
  CORTIQ_ASSIGN_OR_RETURN(int64_t i, Integer(v, field));
  if (i < std::numeric_limits<int32_t>::min() || i > std::numeric_limits<int32_t>::max()) {
    return FieldError(field, absl::StrCat("id ", i, " is outside the vocabulary"));
  }
  return static_cast<int32_t>(i);
}

absl::StatusOr<std::string> String(const Json& v, std::string_view field) {
  if (!v.is_string()) return FieldError(field, "must be a string");
  return v.get<std::string>();
}

absl::Status ReadStop(const Json& v, std::vector<std::string>* stop) {
  if (v.is_string()) {
    stop->push_back(v.get<std::string>());
    return absl::OkStatus();
  }
  if (!v.is_array()) return FieldError("stop", "must be a string or a list of strings");
  for (size_t i = 0; i < v.size(); ++i) {
    CORTIQ_ASSIGN_OR_RETURN(std::string s, String(v[i], absl::StrCat("stop[", i, "]")));
    stop->push_back(std::move(s));
  }
  return absl::OkStatus();
}

absl::Status ReadLogitBias(const Json& v, std::vector<std::pair<int32_t, float>>* out) {
  if (!v.is_object()) return FieldError("logit_bias", "must be an object {\"token id\": bias}");
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string& key = it.key();
    int64_t id = 0;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || id < 0 ||
        id > std::numeric_limits<int32_t>::max()) {
      return FieldError("logit_bias", absl::StrCat("key '", key, "' is not a token id"));
    }
    CORTIQ_ASSIGN_OR_RETURN(float bias, Float(it.value(), absl::StrCat("logit_bias.", key)));
    out->emplace_back(static_cast<int32_t>(id), bias);
  }
  std::sort(out->begin(), out->end());  // SamplingParams keeps it sorted
  return absl::OkStatus();
}

// Builds a body's Json in one SAX pass: the events go to the DOM builder
// Json::parse itself runs (nlohmann's json_sax_dom_parser), after each is
// checked against the limits: the depth, and per object the key comparisons
// its ordered_map will make (each new key against every member before it:
// one comparison each, plus at most the earlier keys' bytes where the
// lengths match). A key over the limits stops the pass before the
// ordered_map scans for it.
class BodyReader final : public nlohmann::json_sax<Json> {
 public:
  explicit BodyReader(Json& root) : dom_(root, /*allow_exceptions=*/false) {}
  bool null() override { return dom_.null(); }
  bool boolean(bool v) override { return dom_.boolean(v); }
  bool number_integer(number_integer_t v) override { return dom_.number_integer(v); }
  bool number_unsigned(number_unsigned_t v) override { return dom_.number_unsigned(v); }
  bool number_float(number_float_t v, const string_t& s) override {
    return dom_.number_float(v, s);
  }
  bool string(string_t& v) override { return dom_.string(v); }
  bool binary(binary_t& v) override { return dom_.binary(v); }
  bool start_object(size_t n) override { return Open() && dom_.start_object(n); }
  bool start_array(size_t n) override { return Open() && dom_.start_array(n); }
  bool end_object() override { return Close() && dom_.end_object(); }
  bool end_array() override { return Close() && dom_.end_array(); }
  bool key(string_t& k) override {
    Level& o = open_.back();
    scan_ += o.members + o.key_bytes;
    if (++o.members > kMaxObjectMembers) {
      return Fail(absl::StrCat("an object with more than ", kMaxObjectMembers, " members"));
    }
    if (scan_ > kMaxMemberScan) {
      return Fail(absl::StrCat("its objects' members would take more than ", kMaxMemberScan,
                               " key comparisons to read (at most ", kMaxObjectMembers,
                               " members in one object, fewer across many)"));
    }
    o.key_bytes += k.size();
    return dom_.key(k);
  }
  bool parse_error(size_t at, const std::string& token,
                   const nlohmann::detail::exception& e) override {
    dom_.parse_error(at, token, e);
    return Fail("not valid JSON");
  }
  const std::string& error() const { return error_; }

 private:
  struct Level {
    uint64_t members = 0;
    uint64_t key_bytes = 0;
  };
  bool Open() {
    if (open_.size() == kMaxBodyDepth) {
      return Fail(absl::StrCat("nested deeper than ", kMaxBodyDepth, " levels"));
    }
    open_.emplace_back();
    return true;
  }
  bool Close() {
    open_.pop_back();
    return true;
  }
  bool Fail(std::string why) {
    if (error_.empty()) error_ = std::move(why);
    return false;
  }
  nlohmann::detail::json_sax_dom_parser<Json> dom_;
  std::vector<Level> open_;
  uint64_t scan_ = 0;
  std::string error_;
};

}  // namespace

absl::StatusOr<Json> ParseBody(std::string_view body) {
  Json j;
  BodyReader reader(j);
  if (!Json::sax_parse(body, &reader) || !reader.error().empty()) {
    return FieldError("body", reader.error().empty() ? "not valid JSON" : reader.error());
  }
  return j;
}

absl::StatusOr<CommonRequest> ParseCommon(const Json& body, bool chat) {
  if (!body.is_object()) return FieldError("body", "must be a JSON object");
  CommonRequest r;
  session::GenerationRequest& g = r.g;
  model::SamplingParams& s = g.sampling;
  if (const Json* v = Member(body, "model")) {
    CORTIQ_ASSIGN_OR_RETURN(r.model, String(*v, "model"));
  }
  if (const Json* v = Member(body, "stream")) {
    CORTIQ_ASSIGN_OR_RETURN(r.out.stream, Bool(*v, "stream"));
  }
  if (const Json* v = Member(body, "stream_options")) {
    if (!v->is_object()) return FieldError("stream_options", "must be an object");
    if (const Json* u = Member(*v, "include_usage")) {
      CORTIQ_ASSIGN_OR_RETURN(r.out.include_usage, Bool(*u, "stream_options.include_usage"));
    }
  }
  if (const Json* v = Member(body, "max_tokens")) {
    CORTIQ_ASSIGN_OR_RETURN(r.max_tokens, Count(*v, "max_tokens"));
  }
  if (chat) {
    if (const Json* v = Member(body, "max_completion_tokens")) {
      CORTIQ_ASSIGN_OR_RETURN(r.max_tokens, Count(*v, "max_completion_tokens"));
    }
  }
  if (const Json* v = Member(body, "temperature")) {
    CORTIQ_ASSIGN_OR_RETURN(s.temperature, Float(*v, "temperature"));
  }
  if (const Json* v = Member(body, "top_p")) {
    CORTIQ_ASSIGN_OR_RETURN(s.top_p, Float(*v, "top_p"));
  }
  if (const Json* v = Member(body, "seed")) {
    CORTIQ_ASSIGN_OR_RETURN(int64_t seed, Integer(*v, "seed"));
    s.seed = static_cast<uint64_t>(seed);
    r.seed_given = true;
  }
  if (const Json* v = Member(body, "stop")) CORTIQ_RETURN_IF_ERROR(ReadStop(*v, &g.stop));
  if (const Json* v = Member(body, "n")) {
    CORTIQ_ASSIGN_OR_RETURN(int64_t n, Integer(*v, "n"));
    if (n < 1) return FieldError("n", absl::StrCat("must be >= 1, got ", n));
    g.n = static_cast<size_t>(n);
  }
  r.out.n = g.n;
  if (const Json* v = Member(body, "presence_penalty")) {
    CORTIQ_ASSIGN_OR_RETURN(s.presence_penalty, Float(*v, "presence_penalty"));
  }
  if (const Json* v = Member(body, "frequency_penalty")) {
    CORTIQ_ASSIGN_OR_RETURN(s.frequency_penalty, Float(*v, "frequency_penalty"));
  }
  if (const Json* v = Member(body, "logit_bias")) {
    CORTIQ_RETURN_IF_ERROR(ReadLogitBias(*v, &s.logit_bias));
  }
  if (const Json* v = Member(body, "user")) {
    CORTIQ_ASSIGN_OR_RETURN(r.user, String(*v, "user"));
  }
  if (chat) {
    if (const Json* v = Member(body, "logprobs")) {
      CORTIQ_ASSIGN_OR_RETURN(r.out.logprobs, Bool(*v, "logprobs"));
    }
    if (const Json* v = Member(body, "top_logprobs")) {
      CORTIQ_ASSIGN_OR_RETURN(size_t top, Count(*v, "top_logprobs"));
      if (!r.out.logprobs && top > 0) {
        return FieldError("top_logprobs", "needs \"logprobs\": true");
      }
      r.out.top_logprobs = static_cast<uint32_t>(std::min<size_t>(top, UINT32_MAX));
    }
  } else if (const Json* v = Member(body, "logprobs")) {
    // The legacy completions field: how many top entries per position.
    CORTIQ_ASSIGN_OR_RETURN(size_t top, Count(*v, "logprobs"));
    r.out.logprobs = true;
    r.out.top_logprobs = static_cast<uint32_t>(std::min<size_t>(top, UINT32_MAX));
  }
  g.logprobs = r.out.logprobs;
  g.top_logprobs = r.out.top_logprobs;
  // vLLM's extensions.
  if (const Json* v = Member(body, "top_k")) {
    CORTIQ_ASSIGN_OR_RETURN(int64_t k, Integer(*v, "top_k"));
    if (k < -1 || k > std::numeric_limits<int32_t>::max()) {
      return FieldError("top_k", absl::StrCat("must be -1 (off), 0 (off) or a count, got ", k));
    }
    s.top_k = k < 0 ? 0 : static_cast<int>(k);  // vLLM's -1 is our 0: off
  }
  if (const Json* v = Member(body, "min_p")) {
    CORTIQ_ASSIGN_OR_RETURN(s.min_p, Float(*v, "min_p"));
  }
  if (const Json* v = Member(body, "repetition_penalty")) {
    CORTIQ_ASSIGN_OR_RETURN(s.repetition_penalty, Float(*v, "repetition_penalty"));
  }
  if (const Json* v = Member(body, "ignore_eos")) {
    CORTIQ_ASSIGN_OR_RETURN(g.ignore_eos, Bool(*v, "ignore_eos"));
  }
  if (const Json* v = Member(body, "min_tokens")) {
    CORTIQ_ASSIGN_OR_RETURN(g.min_tokens, Count(*v, "min_tokens"));
  }
  // Ours: the scheduling level (GenerateRequest.priority). Names only: vLLM
  // takes an integer `priority` where LOWER is served first (default 0), so
  // an integer here would mean the opposite to a client written for vLLM —
  // refused with a message rather than guessed.
  if (const Json* v = Member(body, "priority")) {
    const std::optional<session::Priority> p =
        v->is_string() ? session::ParsePriority(v->get<std::string>()) : std::nullopt;
    if (!p) return FieldError("priority", "must be \"low\", \"normal\" or \"high\"");
    g.priority = *p;
  }
  if (const Json* v = Member(body, "stop_token_ids")) {
    if (!v->is_array()) return FieldError("stop_token_ids", "must be a list of token ids");
    for (size_t i = 0; i < v->size(); ++i) {
      CORTIQ_ASSIGN_OR_RETURN(int32_t id,
                              TokenId((*v)[i], absl::StrCat("stop_token_ids[", i, "]")));
      g.stop_token_ids.push_back(id);
    }
  }
  return r;
}

absl::StatusOr<CompletionPrompt> ParseCompletionPrompt(const Json& body) {
  if (const Json* v = Member(body, "echo")) {
    CORTIQ_ASSIGN_OR_RETURN(bool echo, Bool(*v, "echo"));
    if (echo) return NotSupported("echo", "true");
  }
  if (const Json* v = Member(body, "suffix")) {
    CORTIQ_ASSIGN_OR_RETURN(std::string suffix, String(*v, "suffix"));
    if (!suffix.empty()) return NotSupported("suffix", "a suffix");
  }
  if (const Json* v = Member(body, "best_of")) {
    CORTIQ_ASSIGN_OR_RETURN(int64_t best_of, Integer(*v, "best_of"));
    if (best_of != 1) return NotSupported("best_of", absl::StrCat(best_of));
  }
  const Json* p = Member(body, "prompt");
  if (p == nullptr) return FieldError("prompt", "required");
  CompletionPrompt out;
  if (p->is_string()) {
    out.text = p->get<std::string>();
    return out;
  }
  if (!p->is_array()) {
    return FieldError("prompt", "must be a string, a list of token ids, or a list of one of them");
  }
  const Json* ids = p;
  if (!p->empty() && ((*p)[0].is_string() || (*p)[0].is_array())) {
    if (p->size() != 1) return NotSupported("prompt", "a list of several prompts");
    if ((*p)[0].is_string()) {
      out.text = (*p)[0].get<std::string>();
      return out;
    }
    ids = &(*p)[0];
  }
  out.ids.reserve(ids->size());
  for (size_t i = 0; i < ids->size(); ++i) {
    CORTIQ_ASSIGN_OR_RETURN(int32_t id, TokenId((*ids)[i], absl::StrCat("prompt[", i, "]")));
    out.ids.push_back(id);
  }
  return out;
}

namespace {

// A message's content as the template sees it: a string (text parts
// joined).
absl::StatusOr<Json> Content(const Json& content, std::string_view field) {
  if (content.is_string()) return content;
  if (!content.is_array()) return FieldError(field, "must be a string or a list of parts");
  std::string text;
  for (size_t j = 0; j < content.size(); ++j) {
    const Json& part = content[j];
    const std::string pf = absl::StrCat(util::Sv(field), "[", j, "]");
    if (!part.is_object()) return FieldError(pf, "must be an object");
    const Json* type = Member(part, "type");
    if (type == nullptr || !type->is_string() || type->get<std::string>() != "text") {
      return NotSupported(absl::StrCat(pf, ".type"), "a part that is not {\"type\": \"text\"}");
    }
    const Json* t = Member(part, "text");
    if (t == nullptr) return FieldError(absl::StrCat(pf, ".text"), "required");
    CORTIQ_ASSIGN_OR_RETURN(std::string s, String(*t, absl::StrCat(pf, ".text")));
    if (j > 0) text += '\n';  // parts are paragraphs, as vLLM joins them
    text += s;
  }
  return Json(std::move(text));
}

absl::StatusOr<Json> Message(const Json& m, size_t i) {
  const std::string field = absl::StrCat("messages[", i, "]");
  if (!m.is_object()) return FieldError(field, "must be an object");
  const Json* role = Member(m, "role");
  if (role == nullptr) return FieldError(field + ".role", "required");
  CORTIQ_ASSIGN_OR_RETURN(std::string r, String(*role, field + ".role"));
  if (r == "developer") r = "system";  // OpenAI's newer name for it
  if (r != "system" && r != "user" && r != "assistant" && r != "tool") {
    return FieldError(
        field + ".role",
        absl::StrCat("'", r, "' is not system | developer | user | assistant | tool"));
  }
  Json out = m;  // unknown members pass to the template as they came
  out["role"] = r;
  // A null (or absent) content — an assistant's pure tool call — is the
  // empty string, as vLLM renders it: templates test it with `in` and
  // string filters, which fail on none.
  auto content = m.find("content");
  if (content == m.end() || content->is_null()) {
    if (r != "assistant") return FieldError(field + ".content", "required");
    out["content"] = "";
  } else {
    CORTIQ_ASSIGN_OR_RETURN(out["content"], Content(*content, field + ".content"));
  }
  if (const Json* calls = Member(m, "tool_calls")) {
    if (r != "assistant")
      return FieldError(field + ".tool_calls", "only an assistant message has them");
    if (!calls->is_array()) return FieldError(field + ".tool_calls", "must be a list");
    for (size_t k = 0; k < calls->size(); ++k) {
      const Json& c = (*calls)[k];
      const std::string cf = absl::StrCat(field, ".tool_calls[", k, "]");
      const Json* fn = c.is_object() ? Member(c, "function") : nullptr;
      if (fn == nullptr || !fn->is_object()) return FieldError(cf + ".function", "required");
      const Json* name = Member(*fn, "name");
      if (name == nullptr || !name->is_string()) {
        return FieldError(cf + ".function.name", "must be a string");
      }
      // OpenAI clients send the arguments as a JSON string; the templates
      // render an object (`| tojson`, which on a string prints it quoted and
      // escaped), as the model wrote it: parsed here, as vLLM does (under
      // the body's limits). Absent or empty: {}. A string that is not a JSON
      // object stays as it came.
      Json& args = out["tool_calls"][k]["function"]["arguments"];
      if (args.is_null() || (args.is_string() && args.get_ref<const std::string&>().empty())) {
        args = Json::object();
      } else if (args.is_string()) {
        absl::StatusOr<Json> parsed = ParseBody(args.get_ref<const std::string&>());
        if (parsed.ok() && parsed->is_object()) args = *std::move(parsed);
      }
    }
  }
  if (r == "tool") {
    const Json* id = Member(m, "tool_call_id");
    if (id != nullptr && !id->is_string())
      return FieldError(field + ".tool_call_id", "must be a string");
  }
  return out;
}

}  // namespace

absl::StatusOr<ChatRequest> ParseChat(const Json& body) {
  ChatRequest c;
  const Json* messages = Member(body, "messages");
  if (messages == nullptr) return FieldError("messages", "required");
  if (!messages->is_array() || messages->empty()) {
    return FieldError("messages", "must be a non-empty list of messages");
  }
  for (size_t i = 0; i < messages->size(); ++i) {
    CORTIQ_ASSIGN_OR_RETURN(Json m, Message((*messages)[i], i));
    c.messages.push_back(std::move(m));
  }
  // The deprecated function-calling fields: ignored, the model would never
  // see the functions and the client would wait for a call.
  for (const char* legacy : {"functions", "function_call"}) {
    if (Member(body, legacy) != nullptr) {
      return NotSupported(legacy, absl::StrCat("'", legacy, "' (use tools and tool_choice)"));
    }
  }
  std::string tool_choice = "auto";
  if (const Json* v = Member(body, "tool_choice")) {
    if (v->is_object()) return NotSupported("tool_choice", "a named function");
    CORTIQ_ASSIGN_OR_RETURN(tool_choice, String(*v, "tool_choice"));
    if (tool_choice == "required") return NotSupported("tool_choice", "\"required\"");
    if (tool_choice != "auto" && tool_choice != "none") {
      return FieldError("tool_choice", absl::StrCat("'", tool_choice, "' is not none | auto"));
    }
  }
  if (const Json* v = Member(body, "tools")) {
    if (!v->is_array()) return FieldError("tools", "must be a list");
    for (size_t i = 0; i < v->size(); ++i) {
      const Json& t = (*v)[i];
      const std::string tf = absl::StrCat("tools[", i, "]");
      if (!t.is_object()) return FieldError(tf, "must be an object");
      const Json* type = Member(t, "type");
      if (type == nullptr || !type->is_string() || type->get<std::string>() != "function") {
        return FieldError(tf + ".type", "must be \"function\"");
      }
      const Json* fn = Member(t, "function");
      const Json* name = fn != nullptr && fn->is_object() ? Member(*fn, "name") : nullptr;
      if (name == nullptr || !name->is_string()) {
        return FieldError(tf + ".function.name", "must be a string");
      }
    }
    if (tool_choice != "none" && !v->empty()) {
      c.tools = *v;
      c.parse_tools = true;
    }
  }
  if (const Json* v = Member(body, "response_format")) {
    const Json* type = v->is_object() ? Member(*v, "type") : nullptr;
    if (type == nullptr || !type->is_string()) {
      return FieldError("response_format.type", "must be \"text\"");
    }
    const std::string t = type->get<std::string>();
    if (t == "json_object" || t == "json_schema") {
      return NotSupported("response_format", absl::StrCat("\"", t, "\""));
    }
    if (t != "text")
      return FieldError("response_format.type", absl::StrCat("'", t, "' is not text"));
  }
  if (const Json* v = Member(body, "chat_template_kwargs")) {
    if (!v->is_object()) return FieldError("chat_template_kwargs", "must be an object");
    c.template_kwargs = *v;
    if (const Json* t = Member(*v, "enable_thinking")) {
      CORTIQ_ASSIGN_OR_RETURN(c.thinking, Bool(*t, "chat_template_kwargs.enable_thinking"));
    }
  }
  if (const Json* v = Member(body, "add_generation_prompt")) {
    CORTIQ_ASSIGN_OR_RETURN(c.add_generation_prompt, Bool(*v, "add_generation_prompt"));
  }
  return c;
}

std::string ConversationSessionId(std::string_view tenant, std::string_view name) {
  if (session::SessionStore::IsIdForm(name)) return std::string(name);
  std::string input(tenant);
  input.push_back('\0');
  input.append(name);
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(input.data()), input.size(), digest);
  std::string hex;
  for (size_t i = 0; i < 16; ++i) absl::StrAppendFormat(&hex, "%02x", digest[i]);
  return hex;
}

}  // namespace cortiq::server::http
