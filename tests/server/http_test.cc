// The OpenAI-compatible HTTP front end to end: a real server on loopback
// port 0 with the embedded model, driven with httplib's client (and a raw
// socket where a client must vanish mid-stream). Every endpoint, the SSE
// framing, the errors (status, type, param), auth, draining, admission,
// the body limit, a client that disconnects mid-stream (its one-shot session
// released: the store and the in-flight counts back to zero), the logprobs
// shapes, and that HTTP and gRPC run the same generation.
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/model/model_files.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/http/http_server.h"
#include "server/log_format.h"
#include "server/server.h"
#include "spdlog/spdlog.h"
#include "tests/common/log_capture.h"
#include "tests/common/prom_text.h"
#include "tests/common/server_test_util.h"

namespace cortiq::server {
namespace {

using Json = nlohmann::json;
using session::Clock;

constexpr char kClientToken[] = "alice-token-0123456789";
constexpr char kAdminToken[] = "ops-token-0123456789ab";

struct HttpNode {
  testing::TestNode node;
  std::unique_ptr<httplib::Client> http;
  Server& server() { return *node.server; }
};

HttpNode StartHttpNode(ServerConfig c = {}) {
  if (c.model_dir.empty()) c.model_dir = DefaultModelDir();
  c.http_listen = "127.0.0.1:0";
  c.grace = std::chrono::milliseconds(0);
  HttpNode n;
  n.node = testing::StartTestNode(c);
  if (!n.node.server) return n;
  EXPECT_GT(n.node.server->http_port(), 0);
  n.http = std::make_unique<httplib::Client>("127.0.0.1", n.node.server->http_port());
  n.http->set_read_timeout(60, 0);
  return n;
}

struct Reply {
  int status = 0;
  std::string body;
  httplib::Headers headers;
  Json json() const { return Json::parse(body, nullptr, false); }
};

Reply Post(HttpNode& n, const std::string& path, const Json& body,
           const httplib::Headers& headers = {}) {
  auto r = n.http->Post(path.c_str(), headers, body.dump(), "application/json");
  if (!r) return {.status = -1, .body = httplib::to_string(r.error()), .headers = {}};
  return {.status = r->status, .body = r->body, .headers = r->headers};
}

Reply Get(HttpNode& n, const std::string& path, const httplib::Headers& headers = {}) {
  auto r = n.http->Get(path.c_str(), headers);
  if (!r) return {.status = -1, .body = httplib::to_string(r.error()), .headers = {}};
  return {.status = r->status, .body = r->body, .headers = r->headers};
}

// Checks the OpenAI error shape and returns the error object.
Json ExpectError(const Reply& r, int status, const std::string& param) {
  EXPECT_EQ(r.status, status) << r.body;
  const Json j = r.json();
  EXPECT_TRUE(j.is_object() && j.contains("error")) << r.body;
  if (!j.is_object() || !j.contains("error")) return {};
  const Json& e = j["error"];
  EXPECT_TRUE(e["message"].is_string());
  EXPECT_TRUE(e["type"].is_string());
  EXPECT_TRUE(e.contains("code"));
  if (param.empty()) {
    EXPECT_TRUE(e["param"].is_null()) << r.body;
  } else {
    EXPECT_EQ(e["param"], param) << r.body;
  }
  return e;
}

// The SSE body split into its events' data; EXPECTs the framing: every
// event is exactly "data: <payload>\n\n", the last one [DONE].
std::vector<std::string> SseData(const std::string& body) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < body.size()) {
    const size_t end = body.find("\n\n", at);
    EXPECT_NE(end, std::string::npos) << "unterminated event at " << at;
    if (end == std::string::npos) break;
    const std::string event = body.substr(at, end - at);
    EXPECT_TRUE(event.starts_with("data: ")) << event;
    EXPECT_EQ(event.find('\n'), std::string::npos) << event;
    out.push_back(event.substr(6));
    at = end + 2;
  }
  EXPECT_FALSE(out.empty());
  if (!out.empty()) {
    EXPECT_EQ(out.back(), "[DONE]");
  }
  return out;
}

Json Greedy(const std::string& prompt, int max_tokens) {
  return {{"model", "cortiq-byte-4m"},
          {"prompt", prompt},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"ignore_eos", true}};
}

TEST(HttpTest, ModelsAndHealth) {
  HttpNode n = StartHttpNode();
  ASSERT_TRUE(n.http);
  Reply h = Get(n, "/health");
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.json()["status"], "ok");
  Reply m = Get(n, "/v1/models");
  ASSERT_EQ(m.status, 200) << m.body;
  const Json j = m.json();
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "cortiq-byte-4m");  // the model directory's name
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_EQ(Get(n, "/v1/models/cortiq-byte-4m").json()["id"], "cortiq-byte-4m");
  ExpectError(Get(n, "/v1/models/gpt-4"), 404, "model");
  ExpectError(Get(n, "/v1/nothing"), 404, "");
  Reply wrong = Get(n, "/v1/completions");
  ExpectError(wrong, 405, "");
  EXPECT_EQ(wrong.headers.find("Allow")->second, "POST");
  ExpectError(Post(n, "/v1/models", Json::object()), 405, "");
}

// Every HTTP request is counted by route pattern and status, and its
// generation in the per-request series under frontend="http".
TEST(HttpTest, MetricsCountRequestsByRouteAndFrontend) {
  ServerConfig c;
  c.metrics_listen = "127.0.0.1:0";
  HttpNode n = StartHttpNode(c);
  ASSERT_TRUE(n.http);
  ASSERT_GT(n.server().metrics_port(), 0);
  EXPECT_EQ(Get(n, "/health").status, 200);
  EXPECT_EQ(Get(n, "/v1/models/cortiq-byte-4m").status, 200);
  EXPECT_EQ(Get(n, "/v1/nothing").status, 404);
  EXPECT_EQ(Post(n, "/v1/completions", Greedy("Hello", 4)).status, 200);
  Json bad = Greedy("Hello", 4);
  bad["temperature"] = -1;
  EXPECT_EQ(Post(n, "/v1/completions", bad).status, 400);

  const testing::Exposition e = testing::Scrape(n.server().metrics_port());
  auto requests = [&](const std::string& route, const std::string& status) {
    return e.Value("cortiq_http_requests_total", {{"route", route}, {"status", status}});
  };
  EXPECT_EQ(requests("/health", "200"), 1);
  EXPECT_EQ(requests("/v1/models", "200"), 1);  // /v1/models/{model} counts as /v1/models
  EXPECT_EQ(requests("other", "404"), 1);       // a client's path never becomes a label
  EXPECT_EQ(requests("/v1/completions", "200"), 1);
  EXPECT_EQ(requests("/v1/completions", "400"), 1);
  EXPECT_EQ(e.Value("cortiq_http_request_duration_seconds_count", {{"route", "/v1/completions"}}),
            2);
  EXPECT_EQ(e.Value("cortiq_requests_finished_total",
                    {{"frontend", "http"}, {"finished_reason", "length"}}),
            1);
  EXPECT_EQ(e.Value("cortiq_requests_finished_total",
                    {{"frontend", "grpc"}, {"finished_reason", "length"}}),
            0);
  EXPECT_EQ(e.Value("cortiq_time_to_first_token_seconds_count", {{"frontend", "http"}}), 1);
  EXPECT_EQ(e.Value("cortiq_request_generation_tokens_sum", {{"frontend", "http"}}), 4);
}

TEST(HttpTest, CompletionMatchesGrpcAndStreams) {
  HttpNode n = StartHttpNode();
  ASSERT_TRUE(n.http);
  Reply r = Post(n, "/v1/completions", Greedy("Call me Ishmael.", 12));
  ASSERT_EQ(r.status, 200) << r.body;
  const Json j = r.json();
  EXPECT_TRUE(j["id"].get<std::string>().starts_with("cmpl-"));
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "cortiq-byte-4m");
  EXPECT_TRUE(j["created"].is_number_integer());
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  const std::string text = j["choices"][0]["text"];
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 16);  // one byte, one token
  EXPECT_EQ(j["usage"]["total_tokens"], 28);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

  // The same request over gRPC: the same engine, the same tokens.
  v1::GenerateRequest g;
  g.set_prompt("Call me Ishmael.");
  g.set_max_tokens(12);
  g.set_ignore_eos(true);
  g.mutable_sampling()->set_temperature(0);
  testing::StreamOut grpc_out = testing::RunGenerate(*n.node.stub, g);
  ASSERT_TRUE(grpc_out.status.ok()) << grpc_out.status.error_message();
  std::string grpc_text;
  for (int32_t id : grpc_out.ids) grpc_text += static_cast<char>(id);  // byte-level model
  EXPECT_EQ(text, grpc_text);

  // Streamed, with usage: the chunks add up to the same text.
  Json s = Greedy("Call me Ishmael.", 12);
  s["stream"] = true;
  s["stream_options"] = {{"include_usage", true}};
  Reply sr = Post(n, "/v1/completions", s);
  ASSERT_EQ(sr.status, 200) << sr.body;
  EXPECT_TRUE(sr.headers.find("Content-Type")->second.starts_with("text/event-stream"));
  const std::vector<std::string> data = SseData(sr.body);
  ASSERT_GE(data.size(), 4u);
  std::string streamed;
  std::string finish;
  for (size_t i = 0; i + 2 < data.size(); ++i) {
    const Json c = Json::parse(data[i]);
    EXPECT_EQ(c["object"], "text_completion");
    EXPECT_EQ(c["id"], Json::parse(data[0])["id"]);
    EXPECT_TRUE(c.contains("usage") && c["usage"].is_null());
    ASSERT_EQ(c["choices"].size(), 1u);
    streamed += c["choices"][0]["text"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(streamed, text);
  EXPECT_EQ(finish, "length");
  const Json usage = Json::parse(data[data.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 12);

  // Every priority: scheduling only, the same tokens (whole and streamed).
  for (const char* p : {"low", "normal", "high"}) {
    SCOPED_TRACE(p);
    Json prio = Greedy("Call me Ishmael.", 12);
    prio["priority"] = p;
    const Reply pr = Post(n, "/v1/completions", prio);
    ASSERT_EQ(pr.status, 200) << pr.body;
    EXPECT_EQ(pr.json()["choices"][0]["text"], text);
  }
  Json high_stream = s;
  high_stream["priority"] = "high";
  const Reply hs = Post(n, "/v1/completions", high_stream);
  ASSERT_EQ(hs.status, 200) << hs.body;
  EXPECT_EQ(SseData(hs.body).size(), data.size());
  v1::GenerateRequest low = g;
  low.set_priority(v1::PRIORITY_LOW);
  testing::StreamOut low_out = testing::RunGenerate(*n.node.stub, low);
  ASSERT_TRUE(low_out.status.ok()) << low_out.status.error_message();
  EXPECT_EQ(low_out.ids, grpc_out.ids);

  // A prompt as token ids is the same prompt.
  Json ids = Greedy("", 12);
  ids["prompt"] = Json::array();
  for (char ch : std::string("Call me Ishmael.")) ids["prompt"].push_back(static_cast<int>(ch));
  EXPECT_EQ(Post(n, "/v1/completions", ids).json()["choices"][0]["text"], text);
  ids["prompt"] = Json::array({ids["prompt"]});  // a list of one list
  EXPECT_EQ(Post(n, "/v1/completions", ids).json()["choices"][0]["text"], text);
  // A stop sequence ends it with "stop".
  Json stop = Greedy("Call me Ishmael.", 12);
  stop["stop"] = text.substr(3, 2);
  const Json st = Post(n, "/v1/completions", stop).json();
  EXPECT_EQ(st["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(st["choices"][0]["text"], text.substr(0, text.find(text.substr(3, 2))));
}

// n choices from one request: indexed 0..n-1, choice i is the n = 1 answer
// with seed + i (the engine's contract), streamed chunks carry their index.
TEST(HttpTest, SeveralChoices) {
  HttpNode n = StartHttpNode();
  ASSERT_TRUE(n.http);
  auto sampled = [](int choices, int seed) {
    Json b = Greedy("It was the best", 8);
    b["temperature"] = 1.0;
    b["seed"] = seed;
    b["n"] = choices;
    b["presence_penalty"] = 0.5;  // the sampling controls ride along
    b["logit_bias"] = {{"65", 1.0}};
    return b;
  };
  const Json two = Post(n, "/v1/completions", sampled(2, 7)).json();
  ASSERT_EQ(two["choices"].size(), 2u) << two;
  EXPECT_EQ(two["choices"][0]["index"], 0);
  EXPECT_EQ(two["choices"][1]["index"], 1);
  EXPECT_EQ(two["usage"]["completion_tokens"], 16);
  const Json seven = Post(n, "/v1/completions", sampled(1, 7)).json();
  const Json eight = Post(n, "/v1/completions", sampled(1, 8)).json();
  EXPECT_EQ(two["choices"][0]["text"], seven["choices"][0]["text"]);
  EXPECT_EQ(two["choices"][1]["text"], eight["choices"][0]["text"]);
  Json streamed = sampled(2, 7);
  streamed["stream"] = true;
  std::string text[2];
  int finished = 0;
  const std::vector<std::string> data = SseData(Post(n, "/v1/completions", streamed).body);
  for (size_t i = 0; i + 1 < data.size(); ++i) {
    const Json c = Json::parse(data[i]);
    const Json& ch = c["choices"][0];
    text[ch["index"].get<int>()] += ch["text"].get<std::string>();
    if (!ch["finish_reason"].is_null()) ++finished;
  }
  EXPECT_EQ(text[0], two["choices"][0]["text"]);
  EXPECT_EQ(text[1], two["choices"][1]["text"]);
  EXPECT_EQ(finished, 2);
  // Beyond --max-n: 400 naming n.
  ExpectError(Post(n, "/v1/completions", sampled(100, 7)), 400, "n");
  EXPECT_EQ(n.server().store().num_sessions(), 0u);  // every fork released
}

TEST(HttpTest, LegacyLogprobs) {
  HttpNode n = StartHttpNode();
  ASSERT_TRUE(n.http);
  Json b = Greedy("It was", 6);
  b["logprobs"] = 3;
  Reply r = Post(n, "/v1/completions", b);
  ASSERT_EQ(r.status, 200) << r.body;
  const Json lp = r.json()["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 6u);
  ASSERT_EQ(lp["token_logprobs"].size(), 6u);
  ASSERT_EQ(lp["top_logprobs"].size(), 6u);
  ASSERT_EQ(lp["text_offset"].size(), 6u);
  std::string joined;
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(lp["text_offset"][i], joined.size());
    joined += lp["tokens"][i].get<std::string>();
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
    EXPECT_EQ(lp["top_logprobs"][i].size(), 3u);
    // Greedy: the chosen token is the most likely one.
    double best = -1e30;
    for (auto& [tok, v] : lp["top_logprobs"][i].items()) best = std::max(best, v.get<double>());
    EXPECT_DOUBLE_EQ(lp["token_logprobs"][i].get<double>(), best);
  }
  EXPECT_EQ(joined, r.json()["choices"][0]["text"]);
}

TEST(HttpTest, BadRequestsNameTheField) {
  ServerConfig c;
  c.max_prompt_bytes = 1000;
  HttpNode n = StartHttpNode(c);
  ASSERT_TRUE(n.http);
  auto with = [](Json b, const std::string& k, Json v) {
    b[k] = std::move(v);
    return b;
  };
  const Json ok = Greedy("hello", 4);
  ExpectError(Post(n, "/v1/completions", with(ok, "max_tokens", 0)), 400, "max_tokens");
  ExpectError(Post(n, "/v1/completions", with(ok, "max_tokens", 100000)), 400, "max_tokens");
  ExpectError(Post(n, "/v1/completions", with(ok, "temperature", "hot")), 400, "temperature");
  ExpectError(Post(n, "/v1/completions", with(ok, "temperature", -1)), 400, "temperature");
  ExpectError(Post(n, "/v1/completions", with(ok, "top_p", -0.1)), 400, "top_p");
  ExpectError(Post(n, "/v1/completions", with(ok, "stop", Json::array({1}))), 400, "stop[0]");
  ExpectError(Post(n, "/v1/completions", with(ok, "stop", Json::array({""}))), 400, "stop[0]");
  ExpectError(Post(n, "/v1/completions", with(ok, "logit_bias", {{"x", 1}})), 400, "logit_bias");
  ExpectError(Post(n, "/v1/completions", with(ok, "prompt", Json::array({"a", "b"}))), 400,
              "prompt");
  ExpectError(Post(n, "/v1/completions", with(ok, "prompt", Json::array({300}))), 400, "prompt[0]");
  ExpectError(Post(n, "/v1/completions", with(ok, "echo", true)), 400, "echo");
  ExpectError(Post(n, "/v1/completions", with(ok, "best_of", 2)), 400, "best_of");
  ExpectError(Post(n, "/v1/completions", with(ok, "model", "gpt-4")), 404, "model");
  // priority: a level's name; vLLM's integer (lower = sooner) is refused.
  for (const Json& bad : {Json("urgent"), Json("High"), Json(2), Json(0)}) {
    SCOPED_TRACE(bad.dump());
    const Json e =
        ExpectError(Post(n, "/v1/completions", with(ok, "priority", bad)), 400, "priority");
    EXPECT_EQ(e["type"], "invalid_request_error");
    EXPECT_EQ(e["message"], R"(priority: must be "low", "normal" or "high")");
  }
  Json chat_bad = {{"model", "cortiq-byte-4m"},
                   {"messages", Json::array({{{"role", "user"}, {"content", "hi"}}})},
                   {"max_tokens", 2},
                   {"priority", 1}};
  ExpectError(Post(n, "/v1/chat/completions", chat_bad), 400, "priority");
  EXPECT_EQ(n.server().store().num_sessions(), 0u);  // nothing was created
  Json none = ok;
  none.erase("prompt");
  ExpectError(Post(n, "/v1/completions", none), 400, "prompt");
  // The prompt limit names its flag; the body limit is 4 x it + 64 KiB.
  const Json big =
      Post(n, "/v1/completions", with(ok, "prompt", std::string(1001, 'a'))).json()["error"];
  EXPECT_NE(big["message"].get<std::string>().find("--max-prompt-bytes"), std::string::npos);
  EXPECT_EQ(big["param"], "prompt");
  Reply huge = Post(n, "/v1/completions", with(ok, "pad", std::string(70 << 10, 'a')));
  const Json he = ExpectError(huge, 413, "body");
  EXPECT_NE(he["message"].get<std::string>().find("--max-prompt-bytes"), std::string::npos);
  // A body whose objects would cost the square of their size to read (the
  // ordered members): refused before it is built, naming the limit.
  Json bias = Json::object();
  for (int i = 0; i <= 2048; ++i) bias[std::to_string(i)] = 1;
  const Json many =
      ExpectError(Post(n, "/v1/completions", with(ok, "logit_bias", bias)), 400, "body");
  EXPECT_EQ(many["message"], "body: an object with more than 2048 members");
  auto deep = n.http->Post("/v1/completions",
                           "{\"pad\":" + std::string(200, '[') + std::string(200, ']') + "}",
                           "application/json");
  ASSERT_TRUE(deep);
  EXPECT_EQ(deep->status, 400);
  EXPECT_NE(deep->body.find("nested deeper than 128 levels"), std::string::npos) << deep->body;
  // Not JSON.
  auto raw = n.http->Post("/v1/completions", "{not json", "application/json");
  ASSERT_TRUE(raw);
  EXPECT_EQ(raw->status, 400);
  // The server still serves after all that.
  EXPECT_EQ(Post(n, "/v1/completions", ok).status, 200);
}

// A token file with a client (alice) and an admin (ops); removed by the caller.
std::filesystem::path WriteTokenFile(const std::string& name) {
  const auto file = std::filesystem::temp_directory_path() /
                    absl::StrCat("cortiq_", name, "_", getpid(), ".tokens");
  std::ofstream(file) << "alice client " << kClientToken << "\nops admin " << kAdminToken << "\n";
  return file;
}

TEST(HttpTest, AuthWithTheServersTokens) {
  const auto file = WriteTokenFile("http_test");
  ServerConfig c;
  c.auth_tokens_file = file.string();
  HttpNode n = StartHttpNode(c);
  ASSERT_TRUE(n.http);
  const Json body = Greedy("hi", 2);
  const Json e = ExpectError(Post(n, "/v1/completions", body), 401, "");
  EXPECT_EQ(e["type"], "authentication_error");
  ExpectError(Post(n, "/v1/completions", body, {{"Authorization", "Bearer wrong-token-0123456"}}),
              401, "");
  ExpectError(Get(n, "/v1/models"), 401, "");
  EXPECT_EQ(Get(n, "/health").status, 200);  // probes carry no token
  Reply ok =
      Post(n, "/v1/completions", body, {{"Authorization", absl::StrCat("Bearer ", kClientToken)}});
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(Get(n, "/v1/models", {{"Authorization", absl::StrCat("Bearer ", kAdminToken)}}).status,
            200);
  std::filesystem::remove(file);
}

TEST(HttpTest, DrainingAnswers503) {
  HttpNode n = StartHttpNode();
  ASSERT_TRUE(n.http);
  n.server().context().draining.store(true);
  ExpectError(Get(n, "/health"), 503, "");
  const Json e = ExpectError(Post(n, "/v1/completions", Greedy("hi", 2)), 503, "");
  EXPECT_EQ(e["type"], "service_unavailable");
  EXPECT_EQ(n.server().store().num_sessions(), 0u);
}

TEST(HttpTest, AdmissionAnswers429) {
  ServerConfig c;
  c.max_sessions = 1;
  HttpNode n = StartHttpNode(c);
  ASSERT_TRUE(n.http);
  // One kept session fills the cap: a one-shot HTTP request has no room.
  testing::StreamOut kept = testing::KeptTurn(n.node, "", "hello");
  ASSERT_TRUE(kept.status.ok()) << kept.status.error_message();
  const Json e = ExpectError(Post(n, "/v1/completions", Greedy("hi", 2)), 429, "");
  EXPECT_EQ(e["type"], "rate_limit_error");
  EXPECT_NE(e["message"].get<std::string>().find("--max-sessions"), std::string::npos)
      << e["message"];
  EXPECT_EQ(n.server().store().num_sessions(), 1u);  // nothing created, nothing changed
}

// A socket to the HTTP port that sends one request and reads raw bytes.
class RawHttp {
 public:
  explicit RawHttp(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ok_ = fd_ >= 0 && connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    timeval tv{.tv_sec = 30, .tv_usec = 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~RawHttp() { Close(); }
  bool ok() const { return ok_; }
  bool Send(const std::string& path, const std::string& body) {
    const std::string req = absl::StrCat(
        "POST ", path, " HTTP/1.1\r\nHost: 127.0.0.1\r\n",
        "Content-Type: application/json\r\nContent-Length: ", body.size(), "\r\n\r\n", body);
    return write(fd_, req.data(), req.size()) == static_cast<ssize_t>(req.size());
  }
  // Reads until `needle` has arrived (or the 30 s receive timeout).
  bool ReadUntil(const std::string& needle) {
    char buf[4096];
    while (got_.find(needle) == std::string::npos) {
      const ssize_t n = read(fd_, buf, sizeof(buf));
      if (n <= 0) return false;
      got_.append(buf, static_cast<size_t>(n));
    }
    return true;
  }
  bool SendBytes(const std::string& bytes) {
    return write(fd_, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size());
  }
  // Reads until the server closes (or the 30 s receive timeout): true on a
  // close (EOF, or a reset after the answer: a server that closes with
  // bytes of ours unread resets).
  bool ReadToEnd() {
    char buf[4096];
    for (;;) {
      const ssize_t n = read(fd_, buf, sizeof(buf));
      if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
      if (n < 0) return false;
      got_.append(buf, static_cast<size_t>(n));
    }
  }
  const std::string& received() const { return got_; }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  bool ok_ = false;
  std::string got_;
};

TEST(HttpTest, ClientGoneMidStreamReleasesTheSession) {
  ServerConfig c;
  c.queue_capacity = 4;  // the job pauses soon when nobody reads
  HttpNode n = StartHttpNode(c);
  ASSERT_TRUE(n.http);
  Server& s = n.server();
  Json b = Greedy("Call me Ishmael.", 2000);
  b["stream"] = true;
  RawHttp raw(s.http_port());
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE(raw.Send("/v1/completions", b.dump()));
  ASSERT_TRUE(raw.ReadUntil("data: "));  // the stream has begun: the job runs
  EXPECT_EQ(s.store().num_sessions(), 1u);
  EXPECT_EQ(s.context().jobs_in_flight.count(), 1u);
  raw.Close();
  // The next write (or the liveness check while the job waits) fails: the
  // job is cancelled, the engine lets go of it and frees its session.
  ASSERT_TRUE(s.context().jobs_in_flight.WaitIdleUntil(std::chrono::steady_clock::now() +
                                                       std::chrono::seconds(30)));
  ASSERT_TRUE(s.context().streams_in_flight.WaitIdleUntil(std::chrono::steady_clock::now() +
                                                          std::chrono::seconds(30)));
  EXPECT_EQ(s.store().num_sessions(), 0u);
  EXPECT_EQ(s.store().committed_bytes(), 0u);
  EXPECT_EQ(s.store().releases()[static_cast<size_t>(session::ReleaseReason::kCancelled)], 1u);
  // And the server serves the next request.
  EXPECT_EQ(Post(n, "/v1/completions", Greedy("again", 3)).status, 200);
}

// One raw answer: status and JSON body (Content-Length framed).
struct RawAnswer {
  int status = 0;
  Json body;
  int answers = 0;      // "HTTP/1.1 " status lines received in all
  bool closes = false;  // "Connection: close"
};
RawAnswer ParseRaw(const std::string& got) {
  RawAnswer a;
  for (size_t at = got.find("HTTP/1.1 "); at != std::string::npos;
       at = got.find("HTTP/1.1 ", at + 1)) {
    ++a.answers;
  }
  if (got.size() > 12) a.status = std::atoi(got.substr(9, 3).c_str());
  a.closes = got.find("Connection: close\r\n") != std::string::npos;
  const size_t head_end = got.find("\r\n\r\n");
  if (head_end != std::string::npos) {
    a.body = Json::parse(got.substr(head_end + 4), nullptr, false);
  }
  return a;
}

const char kHead[] = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n";
const char kJsonHead[] = "Content-Type: application/json\r\n";

// A body httplib would read without a bound is refused after the headers,
// before the body is read: chunked (411), no Content-Length (411, where
// httplib would read until the client closes), compressed (415: inflated
// as it is read). Each answer names the header and the limit, in the
// OpenAI shape, and closes the connection (the unread body must not be
// read as the next request; so does a 405, answered unread too); the server
// serves on.
TEST(HttpTest, BodiesWithoutABoundAreRefusedBeforeTheyAreRead) {
  ServerConfig c;
  c.max_prompt_bytes = 1000;  // limit: 4 x 1000 + 64 KiB = 69536 bytes
  HttpNode n = StartHttpNode(c);
  ASSERT_TRUE(n.http);
  const int port = n.server().http_port();
  const std::string body = Greedy("hi", 1).dump();
  auto expect_refused = [](const std::string& got, int status, const std::string& header) {
    SCOPED_TRACE(got);
    const RawAnswer a = ParseRaw(got);
    EXPECT_EQ(a.status, status);
    EXPECT_EQ(a.answers, 1);  // and nothing for the bytes after the headers
    EXPECT_TRUE(a.closes);
    ASSERT_TRUE(a.body.is_object() && a.body.contains("error"));
    const std::string message = a.body["error"]["message"];
    EXPECT_TRUE(message.starts_with(header + ": ")) << message;
    EXPECT_NE(message.find("69536 bytes"), std::string::npos) << message;
    EXPECT_EQ(a.body["error"]["type"], "invalid_request_error");
  };
  {  // chunked, a valid body, and a second request behind it
    RawHttp raw(port);
    ASSERT_TRUE(raw.ok());
    ASSERT_TRUE(raw.SendBytes(absl::StrCat(
        kHead, kJsonHead, "Transfer-Encoding: chunked\r\n\r\n", absl::StrFormat("%x", body.size()),
        "\r\n", body, "\r\n0\r\n\r\n", "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")));
    ASSERT_TRUE(raw.ReadToEnd());
    expect_refused(raw.received(), 411, "Transfer-Encoding");
  }
  {  // no Content-Length: httplib would wait for the body's end, the close
    RawHttp raw(port);
    ASSERT_TRUE(raw.ok());
    ASSERT_TRUE(raw.SendBytes(absl::StrCat(kHead, kJsonHead, "\r\n", body)));
    ASSERT_TRUE(raw.ReadToEnd());
    expect_refused(raw.received(), 411, "Content-Length");
  }
  {  // gzip: {"prompt":"hi","max_tokens":1} in 50 bytes
    const std::string gz(
        "\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\x03\xab\x56\x2a\x28\xca\xcf\x2d\x28\x51\xb2\x52"
        "\xca\xc8\x54\xd2\x51\xca\x4d\xac\x88\x2f\xc9\xcf\x4e\xcd\x2b\x56\xb2\x32\xac\x05\x00"
        "\xa6\xe7\x9f\x14\x1e\x00\x00\x00",
        50);
    RawHttp raw(port);
    ASSERT_TRUE(raw.ok());
    ASSERT_TRUE(raw.SendBytes(absl::StrCat(kHead, kJsonHead, "Content-Encoding: gzip\r\n",
                                           "Content-Length: ", gz.size(), "\r\n\r\n", gz)));
    ASSERT_TRUE(raw.ReadToEnd());
    expect_refused(raw.received(), 415, "Content-Encoding");
  }
  {  // a 405 is answered before its body is read: closed too, so that the
     // body is not read as the next request
    RawHttp raw(port);
    ASSERT_TRUE(raw.ok());
    ASSERT_TRUE(raw.SendBytes(absl::StrCat(
        "POST /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n", kJsonHead, "Content-Length: ",
        body.size(), "\r\n\r\n", body, "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")));
    ASSERT_TRUE(raw.ReadToEnd());
    const RawAnswer a = ParseRaw(raw.received());
    EXPECT_EQ(a.status, 405) << raw.received();
    EXPECT_EQ(a.answers, 1) << raw.received();
    EXPECT_TRUE(a.closes) << raw.received();
    EXPECT_EQ(a.body["error"]["code"], "method_not_allowed") << raw.received();
  }
  {  // the same body, plainly, with its length: served
    RawHttp raw(port);
    ASSERT_TRUE(raw.ok());
    ASSERT_TRUE(raw.SendBytes(absl::StrCat(kHead, kJsonHead, "Connection: close\r\n",
                                           "Content-Length: ", body.size(), "\r\n\r\n", body)));
    ASSERT_TRUE(raw.ReadToEnd());
    EXPECT_EQ(ParseRaw(raw.received()).status, 200) << raw.received();
  }
  EXPECT_EQ(n.server().store().num_sessions(), 0u);
  EXPECT_EQ(Post(n, "/v1/completions", Greedy("again", 2)).status, 200);
}

// A handler that throws is answered 500 server_error in the OpenAI shape,
// without what it threw, and logged with it. Here the chat template throws
// (an HttpServer on the node's context with a renderer that does).
TEST(HttpTest, AHandlerThatThrowsIsAServerErrorAndLogged) {
  auto sink = std::make_shared<testing::CaptureSink>();
  const std::shared_ptr<spdlog::logger> saved = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("", sink));
  ConfigureLogging(LogFormat::kText);
  {
    HttpNode n = StartHttpNode();
    ASSERT_TRUE(n.http);
    http::ChatRenderer throws;
    throws.render = [](const http::ChatRequest&) -> absl::StatusOr<std::string> {
      throw std::runtime_error("template bug 12345");
    };
    absl::StatusOr<std::unique_ptr<http::HttpServer>> s =
        http::HttpServer::Start(&n.server().context(), std::move(throws));
    ASSERT_TRUE(s.ok()) << s.status();
    httplib::Client client("127.0.0.1", (*s)->port());
    client.set_read_timeout(60, 0);
    const Json chat = {{"messages", Json::array({{{"role", "user"}, {"content", "hi"}}})},
                       {"max_tokens", 2}};
    auto r = client.Post("/v1/chat/completions", chat.dump(), "application/json");
    ASSERT_TRUE(r);
    const Json e =
        ExpectError({.status = r->status, .body = r->body, .headers = r->headers}, 500, "");
    EXPECT_EQ(e["type"], "server_error");
    EXPECT_EQ(r->body.find("template bug"), std::string::npos) << r->body;
    (*s)->Stop();
    EXPECT_EQ(n.server().store().num_sessions(), 0u);
  }
  std::vector<std::string> lines;
  for (const std::string& l : sink->Lines()) {
    if (l.find("rpc=POST /v1/chat/completions") != std::string::npos) lines.push_back(l);
  }
  spdlog::set_default_logger(saved);
  ConfigureLogging(LogFormat::kText);
  ASSERT_EQ(lines.size(), 1u) << sink->All();
  EXPECT_NE(lines[0].find("code=INTERNAL"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("http_status=500"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("error=\"internal error: template bug 12345\""), std::string::npos)
      << lines[0];
}

Json Chat(const std::string& user, int max_tokens) {
  return {{"model", "cortiq-byte-4m"},
          {"messages", Json::array({{{"role", "system"}, {"content", "You are Ahab."}},
                                    {{"role", "user"}, {"content", user}}})},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"ignore_eos", true}};
}

// The end of a chat turn (<|im_end|>, a stop id) is not a content token:
// it has no logprobs entry (they used to list it, so their tokens did not
// join up to the content). ignore_eos (benchmark clients) runs past it to
// max_tokens, as vLLM does (it used to stop there all the same).
TEST(HttpTest, AChatTurnsEndIsNoContentAndIgnoreEosRunsPastIt) {
  HttpNode n = StartHttpNode();
  ASSERT_TRUE(n.http);
  Json b = Chat("Where is the whale?", 5);
  b["ignore_eos"] = false;
  b["logit_bias"] = {{"258", 100}};  // <|im_end|> at once
  b["logprobs"] = true;
  Reply r = Post(n, "/v1/chat/completions", b);
  ASSERT_EQ(r.status, 200) << r.body;
  Json j = r.json();
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop") << r.body;
  EXPECT_EQ(j["choices"][0]["message"]["content"], "") << r.body;
  EXPECT_EQ(j["usage"]["completion_tokens"], 1) << r.body;
  EXPECT_EQ(j["choices"][0]["logprobs"]["content"].size(), 0u) << r.body;
  b["ignore_eos"] = true;
  r = Post(n, "/v1/chat/completions", b);
  ASSERT_EQ(r.status, 200) << r.body;
  j = r.json();
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length") << r.body;
  EXPECT_EQ(j["usage"]["completion_tokens"], 5) << r.body;
}

TEST(HttpTest, ChatCompletionWholeAndStreamed) {
  HttpNode n = StartHttpNode();
  ASSERT_TRUE(n.http);
  Json b = Chat("Where is the whale?", 10);
  b["logprobs"] = true;
  b["top_logprobs"] = 2;
  Reply r = Post(n, "/v1/chat/completions", b);
  ASSERT_EQ(r.status, 200) << r.body;
  const Json j = r.json();
  EXPECT_TRUE(j["id"].get<std::string>().starts_with("chatcmpl-"));
  EXPECT_EQ(j["object"], "chat.completion");
  const Json& choice = j["choices"][0];
  EXPECT_EQ(choice["message"]["role"], "assistant");
  const std::string content = choice["message"]["content"];
  EXPECT_FALSE(choice["message"].contains("tool_calls"));
  // The ChatML prompt of the embedded model: every message framed.
  const std::string prompt =
      "<|im_start|>system\nYou are Ahab.<|im_end|>\n<|im_start|>user\nWhere is the "
      "whale?<|im_end|>\n<|im_start|>assistant\n";
  // Byte-level: one token per byte, one per special marker (3 starts, 2 ends).
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt.size() -
                                             3 * (std::string("<|im_start|>").size() - 1) -
                                             2 * (std::string("<|im_end|>").size() - 1));
  // Chat logprobs: content[{token, logprob, bytes, top_logprobs}].
  const Json& lp = choice["logprobs"]["content"];
  ASSERT_EQ(lp.size(), 10u);
  std::string joined;
  for (const Json& t : lp) {
    joined += t["token"].get<std::string>();
    ASSERT_EQ(t["bytes"].size(), t["token"].get<std::string>().size());
    EXPECT_EQ(t["top_logprobs"].size(), 2u);
    EXPECT_EQ(t["top_logprobs"][0]["logprob"], t["logprob"]);  // greedy: the top one
  }
  EXPECT_EQ(joined, content);
  // The same request over gRPC with the rendered prompt gives the same text.
  v1::GenerateRequest g;
  g.set_prompt(prompt);
  g.set_max_tokens(10);
  g.set_ignore_eos(true);
  g.mutable_sampling()->set_temperature(0);
  g.add_stop_token_ids(258);  // <|im_end|>, as the chat endpoint adds it
  testing::StreamOut grpc_out = testing::RunGenerate(*n.node.stub, g);
  ASSERT_TRUE(grpc_out.status.ok()) << grpc_out.status.error_message();
  std::string grpc_text;
  for (int32_t id : grpc_out.ids) grpc_text += static_cast<char>(id);
  EXPECT_EQ(content, grpc_text);

  // Streamed: a role delta first, content deltas, a finish chunk, [DONE].
  Json s = Chat("Where is the whale?", 10);
  s["stream"] = true;
  Reply sr = Post(n, "/v1/chat/completions", s);
  ASSERT_EQ(sr.status, 200) << sr.body;
  const std::vector<std::string> data = SseData(sr.body);
  ASSERT_GE(data.size(), 3u);
  const Json first = Json::parse(data[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string streamed;
  for (size_t i = 1; i + 1 < data.size(); ++i) {
    const Json c = Json::parse(data[i]);
    EXPECT_FALSE(c.contains("usage"));  // no include_usage
    const Json& d = c["choices"][0]["delta"];
    if (d.contains("content")) streamed += d["content"].get<std::string>();
  }
  EXPECT_EQ(streamed, content);
  EXPECT_EQ(Json::parse(data[data.size() - 2])["choices"][0]["finish_reason"], "length");
}

// --model FILE.gguf: the embedded model exported to GGUF serves under the
// file's name, with the tokenizer and chat template the file carries, and
// answers exactly as the directory does (chat over HTTP and Generate over
// gRPC); its wire fingerprint differs (another tokenizer source).
TEST(HttpTest, ServesAGgufModelWithItsOwnTokenizerAndTemplate) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/cortiq_http_gguf_", getpid());
  std::filesystem::create_directories(dir);
  const std::string gguf = dir + "/cortiq-byte-4m.gguf";
  ASSERT_TRUE(model::ExportGgufModel(DefaultModelDir(), gguf, math::DType::kF32).ok());
  ServerConfig c;
  c.model_dir = gguf;
  HttpNode g = StartHttpNode(c);
  HttpNode d = StartHttpNode();
  ASSERT_TRUE(g.http && d.http);
  EXPECT_EQ(Get(g, "/v1/models").json()["data"][0]["id"], "cortiq-byte-4m");
  const Json b = Chat("Where is the whale?", 12);
  const Reply rg = Post(g, "/v1/chat/completions", b), rd = Post(d, "/v1/chat/completions", b);
  ASSERT_EQ(rg.status, 200) << rg.body;
  ASSERT_EQ(rd.status, 200) << rd.body;
  EXPECT_EQ(rg.json()["choices"][0]["message"]["content"],
            rd.json()["choices"][0]["message"]["content"]);
  EXPECT_EQ(rg.json()["usage"], rd.json()["usage"]);
  v1::GenerateRequest r = testing::KeptTurnRequest("", "Call me Ishmael.");
  r.set_keep_session(false);
  const testing::StreamOut og = testing::RunGenerate(*g.node.stub, r);
  const testing::StreamOut od = testing::RunGenerate(*d.node.stub, r);
  ASSERT_TRUE(og.status.ok()) << og.status.error_message();
  ASSERT_TRUE(od.status.ok()) << od.status.error_message();
  EXPECT_EQ(og.ids, od.ids);
  EXPECT_EQ(og.ids.size(), 8u);
  std::filesystem::remove_all(dir);
}

TEST(HttpTest, ChatToolsAndThinkingThroughTheTemplate) {
  ServerConfig c;
  c.chat_template = std::string(CORTIQ_SOURCE_DIR) + "/tests/chat/data/qwen3_chat_template.jinja";
  HttpNode n = StartHttpNode(c);
  ASSERT_TRUE(n.http);
  const Json tools =
      Json::array({{{"type", "function"},
                    {"function",
                     {{"name", "get_weather"},
                      {"description", "The weather in a city"},
                      {"parameters",
                       {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}}});
  auto prompt_tokens = [&](Json b) {
    b["max_tokens"] = 1;
    Reply r = Post(n, "/v1/chat/completions", b);
    EXPECT_EQ(r.status, 200) << r.body;
    return r.json()["usage"]["prompt_tokens"].get<int64_t>();
  };
  const Json plain = Chat("Weather in Paris?", 1);
  Json with_tools = plain;
  with_tools["tools"] = tools;
  Json tools_none = with_tools;
  tools_none["tool_choice"] = "none";
  Json no_think = plain;
  no_think["chat_template_kwargs"] = {{"enable_thinking", false}};
  const int64_t base = prompt_tokens(plain);
  // The tool schemas are rendered into the prompt (Qwen3's <tools> block) ...
  EXPECT_GT(prompt_tokens(with_tools), base + 100);
  // ... and not with tool_choice "none".
  EXPECT_EQ(prompt_tokens(tools_none), base);
  // enable_thinking false: the template writes an empty think block.
  EXPECT_EQ(prompt_tokens(no_think),
            base + static_cast<int64_t>(std::string("<think>\n\n</think>\n\n").size()));
  // A tool-call history with a tool result renders.
  Json history = with_tools;
  history["messages"].push_back(
      {{"role", "assistant"},
       {"content", nullptr},
       {"tool_calls",
        Json::array(
            {{{"id", "call_1"},
              {"type", "function"},
              {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\"}"}}}}})}});
  history["messages"].push_back(
      {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "sunny"}});
  EXPECT_GT(prompt_tokens(history), prompt_tokens(with_tools));
}

// A stream whose job the server cancels (here: its session released; a
// drain does the same) ends with an error event and [DONE], not a finish
// reason that would pass a truncated answer for a whole one.
TEST(HttpTest, ServerCancelledStreamEndsWithAnError) {
  ServerConfig c;
  c.queue_capacity = 4;
  HttpNode n = StartHttpNode(c);
  ASSERT_TRUE(n.http);
  Json b = Greedy("Call me Ishmael.", 2000);
  b["stream"] = true;
  RawHttp raw(n.server().http_port());
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE(raw.Send("/v1/completions", b.dump()));
  ASSERT_TRUE(raw.ReadUntil("data: "));
  const auto sessions = n.server().store().List();
  ASSERT_EQ(sessions.size(), 1u);
  EXPECT_TRUE(n.server().store().Release(sessions[0].id).released);
  ASSERT_TRUE(raw.ReadUntil("data: [DONE]\n\n"));
  const std::string& got = raw.received();
  const size_t err = got.find("data: {\"error\":");
  ASSERT_NE(err, std::string::npos) << got.substr(got.size() > 400 ? got.size() - 400 : 0);
  EXPECT_NE(got.find("service_unavailable", err), std::string::npos);
  EXPECT_EQ(got.find("\"finish_reason\":\"stop\""), std::string::npos);
}

// A conversation (x-cortiq-session, or user with --session-from-user) runs on
// one kept session: the second turn resends the whole chat and only its new
// suffix is prefilled (usage.prompt_tokens_details.cached_tokens > 0).
TEST(HttpTest, ConversationReusesItsSession) {
  ServerConfig c;
  c.session_from_user = true;
  HttpNode n = StartHttpNode(c);
  ASSERT_TRUE(n.http);
  const httplib::Headers conv = {{"x-cortiq-session", "chat-1"}};
  Json turn1 = Chat("Where is the whale?", 6);
  Reply r1 = Post(n, "/v1/chat/completions", turn1, conv);
  ASSERT_EQ(r1.status, 200) << r1.body;
  const std::string id = r1.headers.find("x-cortiq-session-id")->second;
  EXPECT_TRUE(session::SessionStore::IsIdForm(id)) << id;
  EXPECT_EQ(r1.json()["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  ASSERT_EQ(n.server().store().num_sessions(), 1u);  // kept
  const int64_t first_prompt = r1.json()["usage"]["prompt_tokens"];
  // Turn 2: the history, the answer, a new question.
  Json turn2 = turn1;
  turn2["messages"].push_back(
      {{"role", "assistant"}, {"content", r1.json()["choices"][0]["message"]["content"]}});
  turn2["messages"].push_back({{"role", "user"}, {"content", "And the captain?"}});
  Reply r2 = Post(n, "/v1/chat/completions", turn2, conv);
  ASSERT_EQ(r2.status, 200) << r2.body;
  EXPECT_EQ(r2.headers.find("x-cortiq-session-id")->second, id);
  const int64_t cached = r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_GE(cached, first_prompt);  // at least the first turn's prompt was not prefilled again
  EXPECT_LT(cached, r2.json()["usage"]["prompt_tokens"].get<int64_t>());
  EXPECT_EQ(n.server().store().num_sessions(), 1u);
  // The same answer as without reuse (a fresh conversation of the same chat).
  Reply fresh = Post(n, "/v1/chat/completions", turn2, {{"x-cortiq-session", "chat-2"}});
  ASSERT_EQ(fresh.status, 200) << fresh.body;
  EXPECT_EQ(fresh.json()["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(fresh.json()["choices"][0]["message"], r2.json()["choices"][0]["message"]);
  EXPECT_EQ(n.server().store().num_sessions(), 2u);
  // With --session-from-user the user field names it (the same id as the header).
  Json by_user = turn2;
  by_user["user"] = "chat-1";
  Reply r3 = Post(n, "/v1/chat/completions", by_user);
  ASSERT_EQ(r3.status, 200) << r3.body;
  EXPECT_EQ(r3.headers.find("x-cortiq-session-id")->second, id);
  EXPECT_GT(r3.json()["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), 0);
  // Without a conversation nothing is kept.
  EXPECT_EQ(Post(n, "/v1/chat/completions", Chat("hi", 2)).status, 200);
  EXPECT_EQ(n.server().store().num_sessions(), 2u);
}

// Names are per tenant: two tenants' "chat-1" are different sessions, and
// neither sees the other's.
TEST(HttpTest, ConversationNamesArePerTenant) {
  const auto file = WriteTokenFile("http_conv");
  ServerConfig c;
  c.auth_tokens_file = file.string();
  HttpNode n = StartHttpNode(c);
  ASSERT_TRUE(n.http);
  auto as = [](const char* token) {
    return httplib::Headers{{"Authorization", absl::StrCat("Bearer ", token)},
                            {"x-cortiq-session", "chat-1"}};
  };
  Reply a = Post(n, "/v1/chat/completions", Chat("hi", 2), as(kClientToken));
  Reply o = Post(n, "/v1/chat/completions", Chat("hi", 2), as(kAdminToken));
  ASSERT_EQ(a.status, 200) << a.body;
  ASSERT_EQ(o.status, 200) << o.body;
  EXPECT_NE(a.headers.find("x-cortiq-session-id")->second,
            o.headers.find("x-cortiq-session-id")->second);
  EXPECT_EQ(n.server().store().List(std::string("alice")).size(), 1u);
  EXPECT_EQ(n.server().store().num_sessions(), 2u);
  std::filesystem::remove(file);
}

// A template's raise_exception is the request's fault: 400 naming messages.
TEST(HttpTest, TemplateRefusalIs400) {
  const auto file = std::filesystem::temp_directory_path() /
                    absl::StrCat("cortiq_http_template_", getpid(), ".jinja");
  {
    std::ofstream(file) << "{%- if messages[0].role != 'user' %}{{ raise_exception('first "
                           "message must be from the user') }}{%- endif %}"
                           "{{ messages[0].content }}";
  }
  ServerConfig c;
  c.chat_template = file.string();
  HttpNode n = StartHttpNode(c);
  ASSERT_TRUE(n.http);
  const Json e = ExpectError(Post(n, "/v1/chat/completions", Chat("hi", 1)), 400, "messages");
  EXPECT_NE(e["message"].get<std::string>().find("must be from the user"), std::string::npos) << e;
  Json user_first = Chat("hi", 1);
  user_first["messages"].erase(0);
  EXPECT_EQ(Post(n, "/v1/chat/completions", user_first).status, 200);
  std::filesystem::remove(file);
  // A template the subset cannot parse stops the server, naming the flag.
  ServerConfig bad;
  bad.model_dir = DefaultModelDir();
  bad.listen = "127.0.0.1:0";
  bad.metrics_listen = "off";
  bad.http_listen = "127.0.0.1:0";
  bad.threads = 1;
  bad.chat_template = file.string() + ".missing";
  absl::StatusOr<std::unique_ptr<Server>> s = Server::Start(bad);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("--chat-template"), std::string::npos) << s.status();
}

// TLS with the server's --tls-cert / --tls-key: the HTTP front speaks HTTPS
// (a client trusting the certificate gets answers; plain HTTP gets none).
TEST(HttpTest, ServesTlsWithTheServersCertificate) {
  if (std::system("openssl version >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "the openssl command is missing: this test makes its certificate with it";
  }
  const std::string dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("cortiq_http_tls_", getpid()))
          .string();
  std::filesystem::create_directories(dir);
  const std::string cmd =
      "cd '" + dir +
      "' && openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 "
      "-addext subjectAltName=IP:127.0.0.1 -keyout key.pem -out cert.pem >openssl.log 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  ServerConfig c;
  c.tls_cert = dir + "/cert.pem";
  c.tls_key = dir + "/key.pem";
  HttpNode n = StartHttpNode(c);
  ASSERT_TRUE(n.node.server);
  httplib::SSLClient tls("127.0.0.1", n.server().http_port());
  tls.set_ca_cert_path((dir + "/cert.pem").c_str());
  tls.enable_server_certificate_verification(true);
  auto r = tls.Post("/v1/completions", Greedy("hi", 3).dump(), "application/json");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(Json::parse(r->body)["usage"]["completion_tokens"], 3);
  // Plain HTTP to the TLS port is not served.
  httplib::Client plain("127.0.0.1", n.server().http_port());
  plain.set_read_timeout(5, 0);
  auto p = plain.Get("/health");
  EXPECT_TRUE(!p || p->status != 200);
  // A certificate that is not one stops the server (gRPC refuses it first).
  ServerConfig bad;
  bad.model_dir = DefaultModelDir();
  bad.listen = "127.0.0.1:0";
  bad.metrics_listen = "off";
  bad.http_listen = "127.0.0.1:0";
  bad.threads = 1;
  bad.tls_cert = dir + "/openssl.log";
  bad.tls_key = dir + "/key.pem";
  absl::StatusOr<std::unique_ptr<Server>> s = Server::Start(bad);
  EXPECT_FALSE(s.ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace cortiq::server
