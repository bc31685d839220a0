// cortiq-server's flags (server/config.h): the defaults, every flag in both
// syntaxes, the ranges, the environment fallbacks (CORTIQ_AUTH_TOKEN,
// CORTIQ_PEERS, CORTIQ_MODEL) and errors that name the flag. No server.
#include "server/config.h"

#include <stdlib.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/usage_error.h"

namespace cortiq::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

using Args = std::vector<std::string>;

// Unsets the variables the parser reads for the test's duration, restoring
// them after (ctest may run with any environment).
class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : kEnv) {
      const char* v = getenv(name);
      saved_.push_back(v == nullptr ? std::nullopt : std::optional<std::string>(v));
      unsetenv(name);
    }
  }
  void TearDown() override {
    for (size_t i = 0; i < std::size(kEnv); ++i) {
      if (saved_[i].has_value()) {
        setenv(kEnv[i], saved_[i]->c_str(), 1);
      } else {
        unsetenv(kEnv[i]);
      }
    }
  }

  static absl::StatusOr<ServerConfig> Parse(const Args& args) {
    bool help = true;
    absl::StatusOr<ServerConfig> c = ParseServerFlags(args, &help);
    EXPECT_FALSE(help);
    return c;
  }

  static void ExpectUsageError(const Args& args, const std::string& needle) {
    bool help = false;
    ::cortiq::testing::ExpectUsageError(ParseServerFlags(args, &help), needle);
  }

  static constexpr const char* kEnv[] = {"CORTIQ_AUTH_TOKEN", "CORTIQ_PEERS", "CORTIQ_MODEL"};
  std::vector<std::optional<std::string>> saved_;
};

TEST_F(ConfigTest, Defaults) {
  absl::StatusOr<ServerConfig> c = Parse({});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_dir, DefaultModelDir());
  EXPECT_EQ(c->listen, "127.0.0.1:50051");
  EXPECT_EQ(c->metrics_listen, "127.0.0.1:9464");
  EXPECT_EQ(c->threads, 0u);
  EXPECT_EQ(c->activations, "bf16");
  EXPECT_EQ(c->max_sessions, 256u);
  EXPECT_EQ(c->memory_budget_bytes, 0u);
  EXPECT_EQ(c->session_ttl, std::chrono::milliseconds(600'000));
  EXPECT_EQ(c->kv_dtype, "f32");
  EXPECT_EQ(c->attention, "exact");
  EXPECT_FALSE(c->o1.layers.has_value());
  EXPECT_FALSE(c->o1.m.has_value());
  EXPECT_FALSE(c->o1.w.has_value());
  EXPECT_FALSE(c->o1.sink.has_value());
  EXPECT_FALSE(c->o1.rect.has_value());
  EXPECT_FALSE(c->qsa_layers.has_value());
  EXPECT_FALSE(c->qsa_ratio.has_value());
  EXPECT_FALSE(c->qsa_budget.has_value());
  EXPECT_EQ(c->max_tokens_limit, 4096u);
  EXPECT_EQ(c->max_context, 0u);
  EXPECT_EQ(c->max_prompt_bytes, size_t{1} << 20);
  EXPECT_EQ(c->max_message_bytes, size_t{8} << 20);
  EXPECT_EQ(c->max_import_bytes, size_t{8} << 30);
  EXPECT_EQ(c->max_batch, 32u);
  EXPECT_EQ(c->prefill_chunk, 256u);
  EXPECT_EQ(c->queue_capacity, 64u);
  EXPECT_EQ(c->grace, std::chrono::milliseconds(10'000));
  EXPECT_THAT(c->peers, IsEmpty());
  EXPECT_EQ(c->peer_dns, "");
  EXPECT_EQ(c->peer_token, "");
  EXPECT_EQ(c->auth_token, "");
  EXPECT_EQ(c->tls_cert, "");
  EXPECT_EQ(c->tls_key, "");
  EXPECT_EQ(c->log_level, "info");
}

TEST_F(ConfigTest, EveryFlag) {
  absl::StatusOr<ServerConfig> c = Parse({"--model",
                                          "/m",
                                          "--listen=0.0.0.0:0",
                                          "--metrics-listen",
                                          "off",
                                          "--threads",
                                          "2",
                                          "--activations=f32",
                                          "--max-sessions",
                                          "8",
                                          "--memory-budget",
                                          "1.5G",
                                          "--session-ttl",
                                          "2.5",
                                          "--kv-dtype",
                                          "int8",
                                          "--attention",
                                          "o1",
                                          "--o1-layers",
                                          "deep2",
                                          "--o1-m",
                                          "16",
                                          "--o1-window",
                                          "64",
                                          "--o1-sink=0",
                                          "--o1-rect",
                                          "fm",
                                          "--qsa-layers",
                                          "3,5-7",
                                          "--qsa-ratio",
                                          "32",
                                          "--qsa-budget",
                                          "8",
                                          "--max-tokens",
                                          "100",
                                          "--max-context",
                                          "512",
                                          "--max-prompt-bytes",
                                          "2K",
                                          "--max-message-bytes=4M",
                                          "--max-import-bytes",
                                          "256M",
                                          "--max-batch",
                                          "4",
                                          "--prefill-chunk",
                                          "128",
                                          "--queue-capacity",
                                          "16",
                                          "--grace",
                                          "30",
                                          "--peers",
                                          "a:1,b:2",
                                          "--peer-dns",
                                          "svc:50051",
                                          "--peer-token",
                                          "pt",
                                          "--auth-token",
                                          "at",
                                          "--tls-cert",
                                          "c.pem",
                                          "--tls-key",
                                          "k.pem",
                                          "--log-level",
                                          "warn"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_dir, "/m");
  EXPECT_EQ(c->listen, "0.0.0.0:0");
  EXPECT_EQ(c->metrics_listen, "off");
  EXPECT_EQ(c->threads, 2u);
  EXPECT_EQ(c->activations, "f32");
  EXPECT_EQ(c->max_sessions, 8u);
  EXPECT_EQ(c->memory_budget_bytes, size_t{3} << 29);
  EXPECT_EQ(c->session_ttl, std::chrono::milliseconds(2500));
  EXPECT_EQ(c->kv_dtype, "int8");
  EXPECT_EQ(c->attention, "o1");
  EXPECT_EQ(c->o1.layers, std::optional<std::string>("deep2"));
  EXPECT_EQ(c->o1.m, std::optional<size_t>(16));
  EXPECT_EQ(c->o1.w, std::optional<size_t>(64));
  EXPECT_EQ(c->o1.sink, std::optional<size_t>(0));  // an explicit 0 is kept
  EXPECT_EQ(c->o1.rect, std::optional<kv::O1Rect>(kv::O1Rect::kFm));
  EXPECT_EQ(c->qsa_layers, std::optional<std::string>("3,5-7"));
  EXPECT_EQ(c->qsa_ratio, std::optional<size_t>(32));
  EXPECT_EQ(c->qsa_budget, std::optional<size_t>(8));
  EXPECT_EQ(c->max_tokens_limit, 100u);
  EXPECT_EQ(c->max_context, 512u);
  EXPECT_EQ(c->max_prompt_bytes, 2048u);
  EXPECT_EQ(c->max_message_bytes, size_t{4} << 20);
  EXPECT_EQ(c->max_import_bytes, size_t{256} << 20);
  EXPECT_EQ(c->max_batch, 4u);
  EXPECT_EQ(c->prefill_chunk, 128u);
  EXPECT_EQ(c->queue_capacity, 16u);
  EXPECT_EQ(c->grace, std::chrono::milliseconds(30'000));
  EXPECT_THAT(c->peers, ElementsAre("a:1", "b:2"));
  EXPECT_EQ(c->peer_dns, "svc:50051");
  EXPECT_EQ(c->peer_token, "pt");
  EXPECT_EQ(c->auth_token, "at");
  EXPECT_EQ(c->tls_cert, "c.pem");
  EXPECT_EQ(c->tls_key, "k.pem");
  EXPECT_EQ(c->log_level, "warn");
}

TEST_F(ConfigTest, O1RectAcceptsWhatTheEnvironmentAccepts) {
  absl::StatusOr<ServerConfig> c = Parse({"--o1-rect", "aggregate"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->o1.rect, std::optional<kv::O1Rect>(kv::O1Rect::kAggregate));
}

TEST_F(ConfigTest, Help) {
  for (const Args& args : {Args{"--help"}, Args{"-h"}, Args{"--threads", "x", "--help"}}) {
    bool help = false;
    absl::StatusOr<ServerConfig> c = ParseServerFlags(args, &help);
    EXPECT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE(help) << args[0];
  }
  EXPECT_THAT(ServerUsage(), HasSubstr("--max-import-bytes"));
}

TEST_F(ConfigTest, ErrorsNameTheFlagAndTheLimit) {
  ExpectUsageError({"--port", "1"}, "unknown flag --port");
  ExpectUsageError({"serve"}, "unexpected argument 'serve'");
  ExpectUsageError({"--listen"}, "--listen needs a value");
  ExpectUsageError({"--threads", "abc"}, "--threads: expected a non-negative integer");
  ExpectUsageError({"--threads", "-1"}, "--threads: must not be negative");
  ExpectUsageError({"--max-sessions", "0"}, "--max-sessions: must be at least 1");
  ExpectUsageError({"--max-batch=0"}, "--max-batch: must be at least 1");
  ExpectUsageError({"--prefill-chunk", "0"}, "--prefill-chunk: must be at least 1");
  ExpectUsageError({"--queue-capacity", "0"}, "--queue-capacity: must be at least 1");
  ExpectUsageError({"--max-tokens", "0"}, "--max-tokens: must be at least 1 (got \"0\")");
  ExpectUsageError({"--memory-budget", "8GB"}, "--memory-budget: expected a byte size");
  ExpectUsageError({"--session-ttl", "-1"}, "--session-ttl");
  ExpectUsageError({"--grace", "soon"}, "--grace: expected a number");
  ExpectUsageError({"--kv-dtype", "f16"}, "--kv-dtype: expected f32 or int8");
  ExpectUsageError({"--attention", "sparse"}, "--attention: expected exact, o1 or qsa");
  ExpectUsageError({"--activations", "f16"}, "--activations: expected bf16 or f32");
  ExpectUsageError({"--log-level", "loud"},
                   "--log-level: expected trace, debug, info, warn, error or off");
  ExpectUsageError({"--o1-rect", "max"}, "--o1-rect");
  ExpectUsageError({"--peers", "a:1,b"}, "--peers: expected HOST:PORT");
  ExpectUsageError({"--peer-dns", "svc"}, "--peer-dns: expected NAME:PORT");
  ExpectUsageError({"--tls-cert", "c.pem"}, "--tls-cert and --tls-key");
  ExpectUsageError({"--auth-token-file", "/nonexistent/token"}, "--auth-token-file: cannot read");
}

TEST_F(ConfigTest, EnvironmentFallbacks) {
  setenv("CORTIQ_AUTH_TOKEN", "envtok", 1);
  setenv("CORTIQ_PEERS", "p:1,,q:2", 1);
  setenv("CORTIQ_MODEL", "/env/model", 1);
  absl::StatusOr<ServerConfig> c = Parse({});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->auth_token, "envtok");
  EXPECT_EQ(c->peer_token, "envtok");  // the peers get the auth token by default
  EXPECT_THAT(c->peers, ElementsAre("p:1", "q:2"));
  EXPECT_EQ(c->model_dir, "/env/model");

  // Flags win over the environment.
  c = Parse({"--auth-token", "flagtok", "--peers", "r:3", "--model", "/flag/model"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->auth_token, "flagtok");
  EXPECT_THAT(c->peers, ElementsAre("r:3"));
  EXPECT_EQ(c->model_dir, "/flag/model");
}

TEST_F(ConfigTest, AuthTokenFile) {
  const std::string path = ::testing::TempDir() + "/config_test_token";
  {
    std::ofstream f(path);
    f << "  s3cret \n";
  }
  setenv("CORTIQ_AUTH_TOKEN", "envtok", 1);
  absl::StatusOr<ServerConfig> c = Parse({"--auth-token-file", path});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->auth_token, "s3cret");
  { std::ofstream f(path, std::ios::trunc); }
  ExpectUsageError({"--auth-token-file", path}, "is empty");
  std::remove(path.c_str());
}

}  // namespace
}  // namespace cortiq::server
