// The log lines: --log-format json writes one JSON object per line (a
// request's fields at the top level; any other message as "msg"), every
// client string escaped so that a line parses back whole; text lines stay
// one line. A valid W3C traceparent from the client reaches the request's
// line and is forwarded by ForwardTraceContext; an invalid one is dropped.
// Prompt text never reaches the log. Lines are captured with an in-memory
// spdlog sink, from the functions and from a real server on 127.0.0.1.
#include <httplib.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/call_util.h"
#include "server/log_format.h"
#include "server/server.h"
#include "spdlog/spdlog.h"
#include "tests/common/log_capture.h"
#include "tests/common/model_test_util.h"
#include "tests/common/server_test_util.h"

namespace cortiq::server {
namespace {

namespace v1 = ::cortiq::v1;
using nlohmann::json;

constexpr char kTrace[] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

using testing::CaptureSink;

// Routes spdlog to a CaptureSink in `format` for the test's lifetime.
class LogTest : public ::testing::Test {
 protected:
  void Capture(LogFormat format) {
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("", sink_));
    ConfigureLogging(format);
  }
  void TearDown() override {
    spdlog::set_default_logger(saved_);
    ConfigureLogging(LogFormat::kText);
  }

  // Each captured line: exactly one '\n', at its end, and one JSON object.
  std::vector<json> JsonLines() {
    std::vector<json> out;
    for (const std::string& l : sink_->Lines()) {
      EXPECT_EQ(l.find('\n'), l.size() - 1) << l;
      json j = json::parse(l, nullptr, /*allow_exceptions=*/false);
      EXPECT_TRUE(j.is_object()) << l;
      if (j.is_object()) out.push_back(std::move(j));
    }
    return out;
  }

  std::shared_ptr<CaptureSink> sink_ = std::make_shared<CaptureSink>();
  std::shared_ptr<spdlog::logger> saved_ = spdlog::default_logger();
};

// A session id a client could send: quotes, a newline that would forge a
// line, control bytes, a backslash, DEL and a byte that is not UTF-8.
const std::string kHostileId = std::string("a\"b\nreq=9 rpc=Forged\r\x01\x1b[31m\\\x7f") + '\xff';

RequestRecord Record(const LogFields& fields) {
  return {.request_id = 42,
          .rpc = "Generate",
          .code = "INVALID_ARGUMENT",
          .error = "prompt: \"quoted\"\nsecond line",
          .duration_ms = 12.3456,
          .peer = "ipv4:127.0.0.1:5555",
          .traceparent = kTrace,
          .fields = fields};
}

TEST_F(LogTest, JsonRequestLineParsesBackWithEveryField) {
  Capture(LogFormat::kJson);
  LogRequest(Record({{"session", kHostileId},
                     {"prompt_tokens", int64_t{7}},
                     {"completion_tokens", int64_t{9}},
                     {"finish", std::string("length")}}));
  const std::vector<json> lines = JsonLines();
  ASSERT_EQ(lines.size(), 1u);
  const json& j = lines[0];
  EXPECT_TRUE(std::regex_match(j.at("ts").get<std::string>(),
                               std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)")))
      << j.at("ts");
  EXPECT_EQ(j.at("level"), "info");
  EXPECT_EQ(j.at("request_id"), 42);
  EXPECT_EQ(j.at("rpc"), "Generate");
  EXPECT_EQ(j.at("code"), "INVALID_ARGUMENT");
  EXPECT_EQ(j.at("error"), "prompt: \"quoted\"\nsecond line");
  // Every byte comes back but the one that is not UTF-8 (U+FFFD).
  EXPECT_EQ(j.at("session"), kHostileId.substr(0, kHostileId.size() - 1) + "\xef\xbf\xbd");
  EXPECT_EQ(j.at("prompt_tokens"), 7);
  EXPECT_EQ(j.at("completion_tokens"), 9);
  EXPECT_EQ(j.at("finish"), "length");
  EXPECT_DOUBLE_EQ(j.at("duration_ms").get<double>(), 12.346);
  EXPECT_EQ(j.at("peer"), "ipv4:127.0.0.1:5555");
  EXPECT_EQ(j.at("traceparent"), kTrace);
  EXPECT_EQ(j.size(), 13u) << j.dump();
}

TEST_F(LogTest, JsonOkLineHasNoErrorAndSkipsEmptyStrings) {
  Capture(LogFormat::kJson);
  RequestRecord r = Record({{"session", std::string()}, {"bytes", int64_t{0}}});
  r.code = "OK";
  r.error = "";
  r.traceparent = "";
  LogRequest(r);
  const std::vector<json> lines = JsonLines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_FALSE(lines[0].contains("error"));
  EXPECT_FALSE(lines[0].contains("session"));
  EXPECT_FALSE(lines[0].contains("traceparent"));
  EXPECT_EQ(lines[0].at("bytes"), 0);
}

TEST_F(LogTest, JsonOtherLinesAreObjectsWithTheMessageEscaped) {
  Capture(LogFormat::kJson);
  spdlog::warn("drain: session {} NOT migrated", kHostileId);
  spdlog::error("{}", "{\"forged\":true}");  // looks like an object: stays a string
  const std::vector<json> lines = JsonLines();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].at("level"), "warning");
  EXPECT_EQ(lines[0].at("msg"), "drain: session " + kHostileId.substr(0, kHostileId.size() - 1) +
                                    "\xef\xbf\xbd NOT migrated");
  EXPECT_EQ(lines[0].size(), 3u);
  EXPECT_EQ(lines[1].at("msg"), "{\"forged\":true}");
  EXPECT_FALSE(lines[1].contains("forged"));
}

TEST_F(LogTest, ProtobufMessagesShareTheFormat) {
  Capture(LogFormat::kJson);
  v1::GetSessionRequest r;  // session_id (1): 2 bytes, not UTF-8
  EXPECT_FALSE(r.ParseFromString(std::string("\x0a\x02\xff\xfe", 4)));
  const std::vector<json> lines = JsonLines();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].at("level"), "error");
  const std::string msg = lines[0].at("msg");
  EXPECT_EQ(msg.rfind("protobuf ", 0), 0u) << msg;
  EXPECT_NE(msg.find("cortiq.v1.GetSessionRequest.session_id"), std::string::npos) << msg;
}

TEST_F(LogTest, TextRequestLineIsOneLineWithEveryStringEscaped) {
  Capture(LogFormat::kText);
  LogRequest(Record({{"session", kHostileId}, {"prompt_tokens", int64_t{7}}}));
  const std::vector<std::string> lines = sink_->Lines();
  ASSERT_EQ(lines.size(), 1u);
  const std::string& l = lines[0];
  EXPECT_EQ(l.find('\n'), l.size() - 1) << l;
  EXPECT_EQ(l.find('\r'), std::string::npos) << l;
  EXPECT_NE(l.find(" req=42 rpc=Generate code=INVALID_ARGUMENT session=a\\\"b\\nreq=9 rpc=Forged\\r"
                   "\\x01\\x1b[31m\\\\\\x7f\xff prompt_tokens=7 dur_ms=12.3 "
                   "peer=ipv4:127.0.0.1:5555 traceparent=" +
                   std::string(kTrace) + " error=\"prompt: \\\"quoted\\\"\\nsecond line\""),
            std::string::npos)
      << l;
}

// The HTTP front's rpc is "METHOD /path" with the client's URL-decoded path:
// a newline in it must not start a forged line, nor ESC reach the terminal.
TEST_F(LogTest, TextRequestLineEscapesTheRpc) {
  Capture(LogFormat::kText);
  RequestRecord r = Record({});
  const std::string rpc =
      "GET /x\n[2026-12-07 10:00:00.000] [request] [info] req=1 rpc=Forged\x1b[31m";
  r.rpc = rpc;
  LogRequest(r);
  const std::vector<std::string> lines = sink_->Lines();
  ASSERT_EQ(lines.size(), 1u);
  const std::string& l = lines[0];
  EXPECT_EQ(l.find('\n'), l.size() - 1) << l;
  EXPECT_EQ(l.find('\x1b'), std::string::npos) << l;
  EXPECT_NE(l.find(" rpc=GET /x\\n[2026-12-07 10:00:00.000] [request] [info] req=1 "
                   "rpc=Forged\\x1b[31m code=INVALID_ARGUMENT"),
            std::string::npos)
      << l;
}

TEST(TraceparentTest, OnlyTheW3cVersion00ShapeIsValid) {
  EXPECT_TRUE(IsValidTraceparent(kTrace));
  EXPECT_TRUE(IsValidTraceparent("00-00000000000000000000000000000001-0000000000000001-00"));
  const std::string t = kTrace;
  for (const std::string& bad : {
           std::string(), t.substr(0, t.size() - 1),  // short flags
           t + "0",                                   // long
           "01" + t.substr(2),                        // version 01
           "ff" + t.substr(2),                        // version ff (invalid)
           t.substr(0, 3) + "4BF92F3577B34DA6A3CE929D0E0E4736" + t.substr(35),  // uppercase
           t.substr(0, 3) + std::string(32, '0') + t.substr(35),                // zero trace id
           t.substr(0, 36) + std::string(16, '0') + t.substr(52),               // zero parent id
           t.substr(0, 10) + "g" + t.substr(11),                                // not hex
           t.substr(0, 35) + "_" + t.substr(36),                                // separator
           t.substr(0, 54) + "\n",                                              // a control byte
       }) {
    EXPECT_FALSE(IsValidTraceparent(bad)) << bad;
  }
}

// ---- a real server ----

TEST_F(LogTest, ServerLinesAreJsonWithPeerTraceparentAndNoPromptText) {
  Capture(LogFormat::kJson);
  ServerConfig c;
  c.model_dir = testing::TempModel("tiny");
  c.grace = std::chrono::milliseconds(0);
  testing::TestNode n = testing::StartTestNode(c);
  ASSERT_NE(n.server, nullptr);

  {  // GetSession: an unknown, hostile id, with a valid traceparent
    grpc::ClientContext ctx;
    ctx.AddMetadata("traceparent", kTrace);
    v1::GetSessionRequest req;
    req.set_session_id(std::string("no\"such\nid\x01", 11));
    v1::SessionInfo info;
    EXPECT_EQ(n.stub->GetSession(&ctx, req, &info).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  const std::string bad_trace = "00-" + std::string(32, 'A') + "-00f067aa0ba902b7-01";
  {  // an invalid traceparent is neither logged nor echoed
    grpc::ClientContext ctx;
    ctx.AddMetadata("traceparent", bad_trace);
    v1::TokenizeRequest req;
    req.set_text("hi");
    v1::TokenizeResponse resp;
    EXPECT_TRUE(n.stub->Tokenize(&ctx, req, &resp).ok());
  }
  {  // what ForwardTraceContext adds to a call reaches the callee's line
    grpc::ClientContext ctx;
    ForwardTraceContext(kTrace, ctx);
    v1::ModelInfo info;
    EXPECT_TRUE(n.stub->GetModelInfo(&ctx, {}, &info).ok());
    grpc::ClientContext dropped;
    ForwardTraceContext(bad_trace, dropped);  // adds nothing
    v1::ListSessionsResponse list;
    EXPECT_TRUE(n.stub->ListSessions(&dropped, {}, &list).ok());
  }
  const std::string prompt = "THE-PROMPT-TEXT never leaves the request";
  {
    v1::GenerateRequest req;
    req.set_prompt(prompt);
    req.set_max_tokens(4);
    req.set_ignore_eos(true);
    req.add_stop("THE-STOP-TEXT");
    req.set_priority(v1::PRIORITY_HIGH);
    EXPECT_TRUE(testing::RunGenerate(*n.stub, req).status.ok());
  }
  {  // refused for its priority: the line has no level to name
    v1::GenerateRequest req;
    req.set_prompt("x");
    req.set_max_tokens(1);
    req.set_priority(static_cast<v1::Priority>(7));
    EXPECT_EQ(testing::RunGenerate(*n.stub, req).status.error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  n.server->Shutdown(std::chrono::milliseconds(0));  // every stream's line is written

  std::map<std::string, json> by_rpc;
  size_t others = 0;
  std::optional<json> refused;
  for (const json& j : JsonLines()) {
    ASSERT_TRUE(j.contains("ts") && j.contains("level")) << j.dump();
    if (j.contains("rpc") && j.at("code") == "INVALID_ARGUMENT") {
      refused = j;
    } else if (j.contains("rpc")) {
      by_rpc[j.at("rpc").get<std::string>()] = j;
    } else {
      EXPECT_TRUE(j.at("msg").is_string()) << j.dump();  // startup, stop
      ++others;
    }
  }
  EXPECT_GT(others, 0u);
  ASSERT_EQ(by_rpc.size(), 5u);

  const json& get = by_rpc["GetSession"];
  EXPECT_EQ(get.at("code"), "NOT_FOUND");
  EXPECT_EQ(get.at("session"), std::string("no\"such\nid\x01", 11));
  EXPECT_EQ(get.at("traceparent"), kTrace);
  EXPECT_EQ(get.at("peer").get<std::string>().rfind("ipv4:127.0.0.1:", 0), 0u) << get.dump();
  EXPECT_TRUE(get.at("request_id").is_number_unsigned());
  EXPECT_TRUE(get.at("duration_ms").is_number());
  EXPECT_TRUE(get.at("error").is_string());

  EXPECT_FALSE(by_rpc["Tokenize"].contains("traceparent"));
  EXPECT_EQ(by_rpc["GetModelInfo"].at("traceparent"), kTrace);
  EXPECT_FALSE(by_rpc["ListSessions"].contains("traceparent"));

  const json& gen = by_rpc["Generate"];
  EXPECT_EQ(gen.at("code"), "OK");
  EXPECT_GT(gen.at("prompt_tokens").get<int64_t>(), 0);
  EXPECT_EQ(gen.at("completion_tokens"), 4);
  EXPECT_TRUE(gen.at("session").is_string());
  EXPECT_EQ(gen.at("priority"), "high");
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->at("rpc"), "Generate");
  EXPECT_FALSE(refused->contains("priority")) << refused->dump();
  EXPECT_NE(refused->at("error").get<std::string>().find("priority: unknown value 7"),
            std::string::npos);

  const std::string all = sink_->All();
  EXPECT_EQ(all.find("THE-PROMPT-TEXT"), std::string::npos);
  EXPECT_EQ(all.find("THE-STOP-TEXT"), std::string::npos);
  EXPECT_EQ(all.find(std::string(32, 'A')), std::string::npos);
}

// A real HTTP request whose URL-decoded path holds a newline and ESC: its
// line stays one line, escaped, and nothing else is written as if a second
// request had been logged.
TEST_F(LogTest, HttpPathCannotForgeALine) {
  Capture(LogFormat::kText);
  ServerConfig c;
  c.model_dir = DefaultModelDir();
  c.http_listen = "127.0.0.1:0";
  c.grace = std::chrono::milliseconds(0);
  testing::TestNode n = testing::StartTestNode(c);
  ASSERT_NE(n.server, nullptr);
  httplib::Client http("127.0.0.1", n.server->http_port());
  auto r = http.Get("/x%0Aforged-line%1B[31m");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  n.server->Shutdown(std::chrono::milliseconds(0));
  size_t found = 0;
  for (const std::string& l : sink_->Lines()) {
    EXPECT_EQ(l.find('\n'), l.size() - 1) << l;
    EXPECT_EQ(l.find('\x1b'), std::string::npos) << l;
    EXPECT_FALSE(l.starts_with("forged-line")) << l;
    if (l.find("rpc=GET /x\\nforged-line\\x1b[31m code=NOT_FOUND") != std::string::npos) ++found;
  }
  EXPECT_EQ(found, 1u) << sink_->All();
}

}  // namespace
}  // namespace cortiq::server
