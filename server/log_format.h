// Log output of cortiq-server: text (spdlog's pattern) or JSON (one object
// per line), and the request records CallLog writes.
//
// Every line goes through the default logger's sinks. Request lines go
// through a second logger, "request", that shares those sinks: in JSON mode
// the sinks' formatter (one per sink, as spdlog keeps them) writes a request
// record's fields at the top level of the line's object, and any other
// message as an escaped "msg" string:
//   {"ts":"2026-12-01T15:48:57.123Z","level":"info","msg":"drain: ..."}
//   {"ts":"...","level":"info","request_id":7,"rpc":"GetSession","code":"NOT_FOUND",...}
// ts is UTC with milliseconds. Strings are JSON-escaped (control bytes as
// \u00XX); bytes that are not UTF-8 become U+FFFD, so every line parses.
//
// Threads: ConfigureLogging runs once at start-up, before any request; the
// rest is thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace cortiq::server {

enum class LogFormat { kText, kJson };

// Sets the format of every line (the default logger's sinks get the JSON
// formatter in kJson; kText leaves their pattern), (re)creates the "request"
// logger on the default logger's sinks, at its level, and routes
// libprotobuf's messages to the default logger. Call again after replacing
// the default logger (tests do, to capture lines).
void ConfigureLogging(LogFormat format);
// The format set by the last ConfigureLogging (kText before any).
LogFormat CurrentLogFormat();

// One key of a request line beyond the fixed ones: a string or a count.
struct LogField {
  std::string key;
  std::variant<std::string, int64_t> value;
};
using LogFields = std::vector<LogField>;

// What one call's line says. Strings may hold anything a client sent: they
// are escaped for the format they are written in.
struct RequestRecord {
  uint64_t request_id = 0;
  std::string_view rpc;
  std::string_view code;   // the gRPC code's name, e.g. "INVALID_ARGUMENT"
  std::string_view error;  // empty on OK
  double duration_ms = 0;
  std::string_view peer;         // the caller's address (grpc::ServerContext::peer)
  std::string_view traceparent;  // a valid W3C traceparent, or empty
  LogFields fields;              // session, tokens, bytes, ... in order
};

// Writes `r` at info through the "request" logger (the default logger until
// ConfigureLogging) in the current format.
void LogRequest(const RequestRecord& r);

// The line's text (without time and level) in each format; the JSON one is
// an object without "ts"/"level" (the formatter adds them).
std::string RequestText(const RequestRecord& r);
std::string RequestJson(const RequestRecord& r);

}  // namespace cortiq::server
