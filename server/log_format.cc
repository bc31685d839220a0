#include "server/log_format.h"

#include <atomic>
#include <ctime>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/util/log_escape.h"
#include "core/util/strings.h"
#include "google/protobuf/stubs/logging.h"
#include "nlohmann/json.hpp"
#include "spdlog/pattern_formatter.h"
#include "spdlog/spdlog.h"

namespace cortiq::server {

namespace {

constexpr char kRequestLogger[] = "request";

std::atomic<LogFormat> g_format{LogFormat::kText};

// nlohmann's dump, with bytes that are not UTF-8 replaced (U+FFFD) instead
// of throwing: a client's session id may hold any bytes.
std::string Dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// {"ts","level", then the message}: a request record's members (the
// payload is a JSON object written by RequestJson) or {"msg": payload}.
class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const auto t = msg.time.time_since_epoch();
    const auto secs = std::chrono::duration_cast<std::chrono::seconds>(t);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - secs).count();
    const std::time_t tt = secs.count();
    std::tm tm{};
    gmtime_r(&tt, &tm);
    const spdlog::string_view_t level = spdlog::level::to_string_view(msg.level);
    std::string head = absl::StrFormat(
        R"({"ts":"%04d-%02d-%02dT%02d:%02d:%02d.%03dZ","level":"%s",)", tm.tm_year + 1900,
        tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms),
        std::string_view(level.data(), level.size()));
    const std::string_view payload(msg.payload.data(), msg.payload.size());
    const std::string_view logger(msg.logger_name.data(), msg.logger_name.size());
    std::string body;
    if (logger == kRequestLogger && payload.size() >= 2 && payload.front() == '{') {
      body = payload.substr(1);  // the record's members and its closing brace
    } else {
      body = absl::StrCat("\"msg\":", Dump(std::string(payload)), "}");
    }
    dest.append(head.data(), head.data() + head.size());
    dest.append(body.data(), body.data() + body.size());
    dest.push_back('\n');
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>();
  }
};

// libprotobuf's own messages (e.g. that a request's string field is not
// UTF-8: the field's name, never its bytes) through spdlog, so that they
// share the format instead of going raw to stderr.
void ProtobufLog(google::protobuf::LogLevel level, const char* file, int line,
                 const std::string& message) {
  const spdlog::level::level_enum l = level == google::protobuf::LOGLEVEL_INFO ? spdlog::level::info
                                      : level == google::protobuf::LOGLEVEL_WARNING
                                          ? spdlog::level::warn
                                          : spdlog::level::err;
  spdlog::log(l, "protobuf {}:{}: {}", file, line, message);
}

}  // namespace

void ConfigureLogging(LogFormat format) {
  google::protobuf::SetLogHandler(&ProtobufLog);
  std::shared_ptr<spdlog::logger> base = spdlog::default_logger();
  if (format == LogFormat::kJson) base->set_formatter(std::make_unique<JsonFormatter>());
  auto request =
      std::make_shared<spdlog::logger>(kRequestLogger, base->sinks().begin(), base->sinks().end());
  request->set_level(base->level());
  spdlog::drop(kRequestLogger);
  spdlog::register_logger(request);
  g_format.store(format);
}

LogFormat CurrentLogFormat() { return g_format.load(); }

std::string RequestText(const RequestRecord& r) {
  // rpc is escaped too: the HTTP front's is "METHOD /path" with the client's
  // URL-decoded path, which may hold a newline (a forged line) or ESC.
  std::string s = absl::StrCat("req=", r.request_id, " rpc=", util::EscapeForLog(r.rpc),
                               " code=", util::Sv(r.code));
  for (const LogField& f : r.fields) {
    if (const auto* v = std::get_if<std::string>(&f.value)) {
      absl::StrAppend(&s, " ", f.key, "=", v->empty() ? "-" : util::EscapeForLog(*v));
    } else {
      absl::StrAppend(&s, " ", f.key, "=", std::get<int64_t>(f.value));
    }
  }
  absl::StrAppend(&s, absl::StrFormat(" dur_ms=%.1f", r.duration_ms));
  if (!r.peer.empty()) absl::StrAppend(&s, " peer=", util::EscapeForLog(r.peer));
  if (!r.traceparent.empty()) absl::StrAppend(&s, " traceparent=", util::Sv(r.traceparent));
  if (!r.error.empty() || r.code != "OK") {
    absl::StrAppend(&s, " error=\"", util::EscapeForLog(r.error), "\"");
  }
  return s;
}

std::string RequestJson(const RequestRecord& r) {
  // ordered_json keeps the keys in the order written (fixed keys first).
  nlohmann::ordered_json j;
  j["request_id"] = r.request_id;
  j["rpc"] = r.rpc;
  j["code"] = r.code;
  if (r.code != "OK") j["error"] = r.error;
  for (const LogField& f : r.fields) {
    if (const auto* v = std::get_if<std::string>(&f.value)) {
      if (!v->empty()) j[f.key] = *v;
    } else {
      j[f.key] = std::get<int64_t>(f.value);
    }
  }
  // Rounded to 0.001 ms: the line stays short and the value exact in JSON.
  j["duration_ms"] = static_cast<double>(static_cast<int64_t>(r.duration_ms * 1e3 + 0.5)) / 1e3;
  if (!r.peer.empty()) j["peer"] = r.peer;
  if (!r.traceparent.empty()) j["traceparent"] = r.traceparent;
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

void LogRequest(const RequestRecord& r) {
  std::shared_ptr<spdlog::logger> logger = spdlog::get(kRequestLogger);
  if (!logger) logger = spdlog::default_logger();
  if (!logger->should_log(spdlog::level::info)) return;
  if (CurrentLogFormat() == LogFormat::kJson) {
    logger->info(RequestJson(r));
  } else {
    logger->info(RequestText(r));
  }
}

}  // namespace cortiq::server
