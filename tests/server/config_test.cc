// cortiq-server's flags (server/config.h): the defaults, every flag in both
// syntaxes, the ranges, the environment fallbacks (CORTIQ_AUTH_TOKEN,
// CORTIQ_PEERS, CORTIQ_MODEL), errors that name the flag, and the refusal of
// a non-loopback --listen without a token. No server.
#include "server/config.h"

#include <stdlib.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_join.h"
#include "core/session/session.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/usage_error.h"

namespace cortiq::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

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

// Every flag's field as text, keyed by the flag's name ("-" = unset), so that
// a whole configuration compares (and prints its difference) in one line.
using Fields = std::map<std::string, std::string>;

std::string Text(const std::string& v) { return v; }
std::string Text(size_t v) { return std::to_string(v); }
std::string Text(std::chrono::milliseconds v) { return std::to_string(v.count()) + "ms"; }
std::string Text(kv::O1Rect v) { return kv::O1RectName(v); }
std::string Text(const std::vector<std::string>& v) { return absl::StrJoin(v, ","); }
std::string Text(const std::vector<std::pair<std::string, double>>& v) {
  return absl::StrJoin(v, ",", absl::PairFormatter("="));
}
template <typename T>
std::string Text(const std::optional<T>& v) {
  return v.has_value() ? Text(*v) : "-";
}

Fields FieldsOf(const ServerConfig& c) {
  return {
      {"model", Text(c.model_dir)},
      {"listen", Text(c.listen)},
      {"metrics-listen", Text(c.metrics_listen)},
      {"threads", Text(c.threads)},
      {"activations", Text(c.activations)},
      {"max-sessions", Text(c.max_sessions)},
      {"memory-budget", Text(c.memory_budget_bytes)},
      {"memory-capacity", Text(c.memory_capacity_bytes)},
      {"page-pool", Text(c.page_pool_bytes)},
      {"session-ttl", Text(c.session_ttl)},
      {"kv-dtype", Text(c.kv_dtype)},
      {"attention", Text(c.attention)},
      {"o1-layers", Text(c.o1.layers)},
      {"o1-m", Text(c.o1.m)},
      {"o1-window", Text(c.o1.w)},
      {"o1-sink", Text(c.o1.sink)},
      {"o1-rect", Text(c.o1.rect)},
      {"qsa-layers", Text(c.qsa_layers)},
      {"qsa-ratio", Text(c.qsa_ratio)},
      {"qsa-budget", Text(c.qsa_budget)},
      {"window-layers", Text(c.window_layers)},
      {"window-sink", Text(c.window_sink)},
      {"window-size", Text(c.window_size)},
      {"max-tokens", Text(c.max_tokens_limit)},
      {"max-n", Text(c.max_n)},
      {"max-context", Text(c.max_context)},
      {"max-prompt-bytes", Text(c.max_prompt_bytes)},
      {"max-message-bytes", Text(c.max_message_bytes)},
      {"max-import-bytes", Text(c.max_import_bytes)},
      {"max-concurrent-imports", Text(c.max_concurrent_imports)},
      {"max-concurrent-exports", Text(c.max_concurrent_exports)},
      {"max-o1-m", Text(c.max_o1_m)},
      {"import-idle-timeout", Text(c.import_idle_timeout)},
      {"max-batch", Text(c.max_batch)},
      {"step-tokens", Text(c.step_tokens)},
      {"prefill-chunk", Text(c.prefill_chunk)},
      {"aging-steps", Text(c.aging_steps)},
      {"tenant-weights", Text(c.tenant_weights)},
      {"queue-capacity", Text(c.queue_capacity)},
      {"grace", Text(c.grace)},
      {"peers", Text(c.peers)},
      {"peer-dns", Text(c.peer_dns)},
      {"migrate-allow", Text(c.migrate_allow)},
      {"peer-ca", Text(c.peer_ca)},
      {"peer-token", Text(c.peer_token)},
      {"peer-connect-timeout", Text(c.peer_connect_timeout)},
      {"peer-min-throughput", Text(c.peer_min_throughput)},
      {"drain-parallelism", Text(c.drain_parallelism)},
      {"drain-timeout", Text(c.drain_timeout)},
      {"auth-token", Text(c.auth_token)},
      {"auth-tokens", Text(c.auth_tokens_file)},
      {"insecure", c.insecure ? "true" : "false"},
      {"lease-wait", Text(c.lease_wait)},
      {"http-listen", Text(c.http_listen)},
      {"http-threads", Text(c.http_threads)},
      {"http-timeout", Text(c.http_timeout)},
      {"session-from-user", c.session_from_user ? "true" : "false"},
      {"chat-template", Text(c.chat_template)},
      {"tls-cert", Text(c.tls_cert)},
      {"tls-key", Text(c.tls_key)},
      {"log-level", Text(c.log_level)},
      {"log-format", Text(c.log_format)},
  };
}

TEST_F(ConfigTest, Defaults) {
  absl::StatusOr<ServerConfig> c = Parse({});
  ASSERT_TRUE(c.ok()) << c.status();
  const Fields defaults = {
      {"model", DefaultModelDir()},
      {"listen", "127.0.0.1:50051"},
      {"metrics-listen", "127.0.0.1:9464"},
      {"threads", "0"},
      {"activations", "bf16"},
      {"max-sessions", "256"},
      {"memory-budget", "0"},
      {"memory-capacity", "0"},
      {"page-pool", std::to_string(size_t{256} << 20)},
      {"session-ttl", "600000ms"},
      {"kv-dtype", "f32"},
      {"attention", "exact"},
      {"o1-layers", "-"},
      {"o1-m", "-"},
      {"o1-window", "-"},
      {"o1-sink", "-"},
      {"o1-rect", "-"},
      {"qsa-layers", "-"},
      {"qsa-ratio", "-"},
      {"qsa-budget", "-"},
      {"window-layers", "-"},
      {"window-sink", "-"},
      {"window-size", "-"},
      {"max-tokens", "4096"},
      {"max-n", "8"},
      {"max-context", "0"},
      {"max-prompt-bytes", std::to_string(size_t{1} << 20)},
      {"max-message-bytes", std::to_string(size_t{8} << 20)},
      {"max-import-bytes", std::to_string(size_t{8} << 30)},
      {"max-concurrent-imports", "4"},
      {"max-concurrent-exports", "4"},
      {"max-o1-m", "256"},
      {"import-idle-timeout", "30000ms"},
      {"max-batch", "32"},
      {"step-tokens", "128"},
      {"prefill-chunk", "64"},
      {"aging-steps", "64"},
      {"tenant-weights", ""},
      {"queue-capacity", "64"},
      {"grace", "10000ms"},
      {"peers", ""},
      {"peer-dns", ""},
      {"migrate-allow", ""},
      {"peer-ca", ""},
      {"peer-token", ""},
      {"peer-connect-timeout", "5000ms"},
      {"peer-min-throughput", std::to_string(size_t{20} << 20)},
      {"drain-parallelism", "4"},
      {"drain-timeout", "60000ms"},
      {"auth-token", ""},
      {"auth-tokens", ""},
      {"insecure", "false"},
      {"lease-wait", "1000ms"},
      {"http-listen", "127.0.0.1:8080"},
      {"http-threads", "16"},
      {"http-timeout", "600000ms"},
      {"session-from-user", "false"},
      {"chat-template", ""},
      {"tls-cert", ""},
      {"tls-key", ""},
      {"log-level", "info"},
      {"log-format", "text"},
  };
  EXPECT_THAT(FieldsOf(*c), ::testing::ContainerEq(defaults));
}

TEST_F(ConfigTest, EveryFlagInBothSyntaxes) {
  struct Given {
    std::string flag, value, field;  // --flag value -> the field's text
  };
  const std::vector<Given> given = {
      {"model", "/m", "/m"},
      {"listen", "0.0.0.0:0", "0.0.0.0:0"},
      {"metrics-listen", "off", "off"},
      {"threads", "2", "2"},
      {"activations", "f32", "f32"},
      {"max-sessions", "8", "8"},
      {"memory-budget", "1.5G", std::to_string(size_t{3} << 29)},
      {"memory-capacity", "64G", std::to_string(size_t{64} << 30)},
      {"page-pool", "0", "0"},
      {"session-ttl", "2.5", "2500ms"},
      {"kv-dtype", "int8", "int8"},
      {"attention", "o1", "o1"},
      {"o1-layers", "deep2", "deep2"},
      {"o1-m", "16", "16"},
      {"o1-window", "64", "64"},
      {"o1-sink", "0", "0"},  // an explicit 0 is kept
      {"o1-rect", "fm", kv::O1RectName(kv::O1Rect::kFm)},
      {"qsa-layers", "3,5-7", "3,5-7"},
      {"qsa-ratio", "32", "32"},
      {"qsa-budget", "8", "8"},
      {"window-layers", "deep1", "deep1"},
      {"window-sink", "2", "2"},
      {"window-size", "64", "64"},
      {"max-tokens", "100", "100"},
      {"max-context", "512", "512"},
      {"max-prompt-bytes", "2K", "2048"},
      {"max-message-bytes", "4M", std::to_string(size_t{4} << 20)},
      {"max-import-bytes", "256M", std::to_string(size_t{256} << 20)},
      {"max-concurrent-imports", "9", "9"},
      {"max-concurrent-exports", "3", "3"},
      {"max-o1-m", "64", "64"},
      {"import-idle-timeout", "0.5", "500ms"},
      {"max-batch", "4", "4"},
      {"max-n", "3", "3"},
      {"step-tokens", "512", "512"},
      {"prefill-chunk", "128", "128"},
      {"aging-steps", "8", "8"},
      {"tenant-weights", "alice=2, bob.x-1 = 0.5", "alice=2,bob.x-1=0.5"},
      {"queue-capacity", "16", "16"},
      {"grace", "30", "30000ms"},
      {"peers", "a:1,b:2", "a:1,b:2"},
      {"peer-dns", "svc:50051", "svc:50051"},
      {"migrate-allow", " c:3, [::1]:4 ", "c:3,[::1]:4"},  // items trimmed
      {"peer-ca", "ca.pem", "ca.pem"},
      {"peer-token", "pt", "pt"},
      {"peer-connect-timeout", "0.5", "500ms"},
      {"peer-min-throughput", "1M", std::to_string(size_t{1} << 20)},
      {"drain-parallelism", "8", "8"},
      {"drain-timeout", "3", "3000ms"},
      {"auth-token", "at", "at"},
      {"auth-tokens", "/etc/cortiq/tokens", "/etc/cortiq/tokens"},
      {"lease-wait", "0.25", "250ms"},
      {"http-listen", "0.0.0.0:0", "0.0.0.0:0"},
      {"http-threads", "4", "4"},
      {"http-timeout", "2.5", "2500ms"},
      {"chat-template", "t.jinja", "t.jinja"},
      {"tls-cert", "c.pem", "c.pem"},
      {"tls-key", "k.pem", "k.pem"},
      {"log-level", "warn", "warn"},
      {"log-format", "json", "json"},
  };
  for (bool inline_values : {false, true}) {
    Args args;
    Fields want;
    for (const Given& g : given) {
      if (inline_values) {
        args.push_back("--" + g.flag + "=" + g.value);
      } else {
        args.push_back("--" + g.flag);
        args.push_back(g.value);
      }
      want[g.flag] = g.field;
    }
    args.push_back("--insecure");  // a switch: no value in either syntax
    want["insecure"] = "true";
    args.push_back("--session-from-user");
    want["session-from-user"] = "true";
    absl::StatusOr<ServerConfig> c = Parse(args);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_THAT(FieldsOf(*c), ::testing::ContainerEq(want))
        << (inline_values ? "--flag=value" : "--flag value");
  }
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
  ExpectUsageError({"--max-n=0"}, "--max-n: must be at least 1");
  ExpectUsageError({"--max-batch=4", "--max-n=5"}, "--max-n: 5 is above --max-batch 4");
  ExpectUsageError({"--prefill-chunk", "0"}, "--prefill-chunk: must be at least 1");
  ExpectUsageError({"--step-tokens", "0"}, "--step-tokens: must be at least 1");
  ExpectUsageError({"--aging-steps", "0"}, "--aging-steps: must be at least 1");
  ExpectUsageError({"--queue-capacity", "0"}, "--queue-capacity: must be at least 1");
  ExpectUsageError({"--max-tokens", "0"}, "--max-tokens: must be at least 1 (got \"0\")");
  ExpectUsageError({"--memory-budget", "8GB"}, "--memory-budget: expected a byte size");
  ExpectUsageError({"--memory-capacity", "lots"}, "--memory-capacity: expected a byte size");
  ExpectUsageError({"--page-pool", "-1"}, "--page-pool: expected a byte size");
  ExpectUsageError({"--session-ttl", "-1"}, "--session-ttl");
  ExpectUsageError({"--grace", "soon"}, "--grace: expected a number");
  ExpectUsageError({"--max-concurrent-imports", "0"},
                   "--max-concurrent-imports: must be at least 1");
  ExpectUsageError({"--max-concurrent-exports", "0"},
                   "--max-concurrent-exports: must be at least 1");
  ExpectUsageError({"--max-o1-m", "3"}, "--max-o1-m: must be at least 4");
  ExpectUsageError({"--o1-m", "300"}, "--o1-m: 300 is above --max-o1-m 256");
  ExpectUsageError({"--import-idle-timeout", "0"}, "--import-idle-timeout: must be positive");
  ExpectUsageError({"--kv-dtype", "f16"}, "--kv-dtype: expected f32 or int8");
  ExpectUsageError({"--attention", "sparse"}, "--attention: expected exact, o1, qsa or window");
  ExpectUsageError({"--activations", "f16"}, "--activations: expected bf16 or f32");
  ExpectUsageError({"--log-level", "loud"},
                   "--log-level: expected trace, debug, info, warn, error or off");
  ExpectUsageError({"--log-format", "xml"}, "--log-format: expected text or json");
  ExpectUsageError({"--o1-rect", "max"}, "--o1-rect");
  ExpectUsageError({"--peers", "a:1,b"}, "--peers: expected HOST:PORT");
  ExpectUsageError({"--peer-dns", "svc"}, "--peer-dns: expected NAME:PORT");
  ExpectUsageError({"--migrate-allow", "a:1,b"}, "--migrate-allow: expected HOST:PORT");
  ExpectUsageError({"--peer-connect-timeout", "0"}, "--peer-connect-timeout: must be > 0");
  ExpectUsageError({"--peer-min-throughput", "0"}, "--peer-min-throughput: must be >= 1");
  ExpectUsageError({"--drain-parallelism", "0"}, "--drain-parallelism: must be at least 1");
  ExpectUsageError({"--drain-timeout", "0"}, "--drain-timeout: must be > 0");
  ExpectUsageError({"--tls-cert", "c.pem"}, "--tls-cert and --tls-key");
  ExpectUsageError({"--auth-token-file", "/nonexistent/token"}, "--auth-token-file: cannot read");
}

// --prefill-chunk is at most --step-tokens (a step takes whole chunks): an
// explicit larger one is refused naming both; the default 64 is lowered to
// a smaller --step-tokens.
TEST_F(ConfigTest, PrefillChunkFitsTheStepBudget) {
  ExpectUsageError({"--prefill-chunk", "300"}, "--prefill-chunk: 300 is above --step-tokens 128");
  ExpectUsageError({"--step-tokens", "32", "--prefill-chunk", "33"},
                   "--prefill-chunk: 33 is above --step-tokens 32");
  absl::StatusOr<ServerConfig> c = Parse({"--step-tokens", "32"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->prefill_chunk, 32u);
  c = Parse({"--step-tokens", "32", "--prefill-chunk", "32"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->prefill_chunk, 32u);
  c = Parse({"--step-tokens", "1024"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->prefill_chunk, 64u);
  for (const char* needle :
       {"--step-tokens N", "--prefill-chunk N", "--aging-steps N", "--tenant-weights NAME=W"}) {
    EXPECT_THAT(ServerUsage(), HasSubstr(needle));
  }
}

// --tenant-weights: tenant names as the token file's, each once; weights
// finite, > 0 and <= 1e6; every error names the flag and what is wrong.
TEST_F(ConfigTest, TenantWeights) {
  absl::StatusOr<ServerConfig> c = Parse({"--tenant-weights", "a=1e6,b_2=0.001,C.d=3"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->tenant_weights, ElementsAre(std::pair<std::string, double>("a", 1e6),
                                             std::pair<std::string, double>("b_2", 0.001),
                                             std::pair<std::string, double>("C.d", 3)));
  const std::string long_name(session::kMaxTenantBytes + 1, 'x');
  const std::string max_name(session::kMaxTenantBytes, 'x');
  c = Parse({"--tenant-weights", max_name + "=1"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tenant_weights.at(0).first, max_name);
  const std::string flag = "--tenant-weights: ";
  ExpectUsageError({"--tenant-weights", "alice"}, flag + "expected NAME=WEIGHT");
  ExpectUsageError({"--tenant-weights", "=2"}, flag + "'' is not a tenant name");
  ExpectUsageError({"--tenant-weights", "al ice=2"}, flag + "'al ice' is not a tenant name");
  ExpectUsageError({"--tenant-weights", "al/ice=2"}, "'al/ice' is not a tenant name (1 to 64");
  ExpectUsageError({"--tenant-weights", long_name + "=2"}, "is not a tenant name");
  ExpectUsageError({"--tenant-weights", "alice=1,bob=2,alice=3"},
                   flag + "tenant 'alice' is given twice");
  ExpectUsageError({"--tenant-weights", "alice=1,,bob=2"}, flag + "empty item at position 2");
  ExpectUsageError({"--tenant-weights", ""}, flag + "empty item at position 1");
  for (const char* w : {"0", "-1", "nan", "inf", "1e7", "1000001", "x", "", "0x10"}) {
    SCOPED_TRACE(w);
    ExpectUsageError({"--tenant-weights", std::string("alice=") + w},
                     flag + "the weight of tenant 'alice' must be a number > 0 and <= 1000000");
  }
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

// --peers and --migrate-allow are matched as exact HOST:PORT strings
// (server/peer_dialer.h), so their items are trimmed: "a:1, b:2" allows
// "b:2"; empty items are skipped. --help says how the match works.
TEST_F(ConfigTest, PeerListsAreTrimmedForTheirExactMatch) {
  absl::StatusOr<ServerConfig> c =
      Parse({"--peers", " a:1 ,, b:2", "--migrate-allow", "c:3 , ,d:4 "});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->peers, ElementsAre("a:1", "b:2"));
  EXPECT_THAT(c->migrate_allow, ElementsAre("c:3", "d:4"));
  setenv("CORTIQ_PEERS", " p:1 , q:2", 1);
  c = Parse({});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->peers, ElementsAre("p:1", "q:2"));
  for (const char* needle :
       {"--migrate-allow H:P", "exact HOST:PORT", "PERMISSION_DENIED", "--peer-ca FILE"}) {
    EXPECT_THAT(ServerUsage(), HasSubstr(needle));
  }
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

// The peer token from a file (kept out of the process list); the node's
// name and forwarding flags.
TEST_F(ConfigTest, PeerTokenFileAndClusterFlags) {
  const std::string path = ::testing::TempDir() + "/config_test_peer_token";
  {
    std::ofstream f(path);
    f << "peer-s3cret\n";
  }
  absl::StatusOr<ServerConfig> c =
      Parse({"--auth-token", "admin", "--peer-token-file", path, "--node-name", "cortiq-0",
             "--advertise", "10.0.0.7:50051", "--forward-ttl", "30"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->peer_token, "peer-s3cret");
  EXPECT_EQ(c->node_name, "cortiq-0");
  EXPECT_EQ(c->advertise, "10.0.0.7:50051");
  EXPECT_EQ(c->forward_ttl, std::chrono::seconds(30));
  { std::ofstream f(path, std::ios::trunc); }
  ExpectUsageError({"--peer-token-file", path}, "--peer-token-file");
  std::remove(path.c_str());
  ExpectUsageError({"--node-name", "bad name"}, "--node-name");
  ExpectUsageError({"--node-name", std::string(65, 'x')}, "--node-name");
  // Without --node-name: <hostname>:<port> when --listen names the port.
  c = Parse({"--listen", "127.0.0.1:7001"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->node_name, "");
  const std::string def = DefaultNodeName("127.0.0.1:7001");
  EXPECT_TRUE(def.ends_with(":7001")) << def;
  EXPECT_TRUE(IsValidNodeName(def)) << def;
  EXPECT_TRUE(IsValidNodeName(DefaultNodeName("127.0.0.1:0")));
}

TEST_F(ConfigTest, LoopbackListenAddresses) {
  for (const char* listen : {"127.0.0.1:50051", "127.3.2.1:0", "localhost:50051",
                             "LocalHost:1", "[::1]:50051", "unix:/tmp/cortiq.sock"}) {
    EXPECT_TRUE(IsLoopbackListen(listen)) << listen;
  }
  for (const char* listen : {"0.0.0.0:50051", "[::]:50051", ":50051", "10.0.0.7:50051",
                             "[fe80::1]:50051", "cortiq.example.com:50051", "128.0.0.1:1"}) {
    EXPECT_FALSE(IsLoopbackListen(listen)) << listen;
  }
}

TEST_F(ConfigTest, NonLoopbackListenNeedsATokenOrInsecure) {
  // The message says how to add a token (both ways, and how to make one)
  // and names the way out.
  for (const char* needle : {"--listen 0.0.0.0:50051", "without an auth token",
                             "openssl rand -hex 32", "--auth-token-file", "CORTIQ_AUTH_TOKEN",
                             "--insecure"}) {
    ExpectUsageError({"--listen", "0.0.0.0:50051"}, needle);
  }
  ExpectUsageError({"--listen", "[::]:50051"}, "--insecure");
  ExpectUsageError({"--listen", "node-1.internal:50051"}, "--insecure");

  absl::StatusOr<ServerConfig> c = Parse({"--listen", "0.0.0.0:50051", "--insecure"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->insecure);
  EXPECT_TRUE(c->auth_token.empty());
  c = Parse({"--listen", "0.0.0.0:50051", "--auth-token", "t"});
  ASSERT_TRUE(c.ok()) << c.status();
  // A token file counts as a token (the Server reads it: a bad one stops it).
  c = Parse({"--listen", "0.0.0.0:50051", "--auth-tokens", "/etc/cortiq/tokens"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->insecure);
  ExpectUsageError({"--listen", "0.0.0.0:50051"}, "--auth-tokens FILE");
  setenv("CORTIQ_AUTH_TOKEN", "envtok", 1);
  c = Parse({"--listen", "0.0.0.0:50051"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->peer_token, "envtok");  // peer calls carry the same secret
  unsetenv("CORTIQ_AUTH_TOKEN");

  // Loopback without a token still starts (the default --listen, scripts/run.sh).
  c = Parse({});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->insecure);
  c = Parse({"--listen", "127.0.0.1:0"});
  ASSERT_TRUE(c.ok()) << c.status();
  // /metrics has no auth and is not refused: a Prometheus scraper in the
  // cluster must reach it (README, Security).
  c = Parse({"--metrics-listen", "0.0.0.0:9464"});
  ASSERT_TRUE(c.ok()) << c.status();
  // The HTTP front serves the same API: the same rule, naming its flag.
  ExpectUsageError({"--http-listen", "0.0.0.0:8080"}, "--http-listen 0.0.0.0:8080");
  c = Parse({"--http-listen", "0.0.0.0:8080", "--insecure"});
  ASSERT_TRUE(c.ok()) << c.status();
  c = Parse({"--http-listen", "0.0.0.0:8080", "--auth-token", "t"});
  ASSERT_TRUE(c.ok()) << c.status();
  c = Parse({"--http-listen", "off", "--listen", "127.0.0.1:0"});
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectUsageError({"--http-timeout", "0"}, "--http-timeout");
}

}  // namespace
}  // namespace cortiq::server
