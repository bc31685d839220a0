// The `cortiq` CLI's argument parsing (client/cli_args.h), the grpc -> absl
// status conversion and the hand-written health-check wire format. No server.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/cli_args.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/usage_error.h"

namespace cortiq::client {
namespace {

namespace v1 = ::cortiq::v1;
using ::testing::ElementsAre;

using Args = std::vector<std::string>;

using ::cortiq::testing::ExpectUsageError;

// ---------------------------------------------------------------------------
// Global flags

TEST(CommandLineTest, DefaultsWithoutFlagsOrEnvironment) {
  absl::StatusOr<CommandLine> cl = ParseCommandLine({"model"}, {});
  ASSERT_TRUE(cl.ok()) << cl.status();
  EXPECT_EQ(cl->client.server, "127.0.0.1:50051");
  EXPECT_EQ(cl->client.token, "");
  EXPECT_FALSE(cl->client.tls);
  EXPECT_EQ(cl->client.timeout, std::chrono::milliseconds(0));
  EXPECT_EQ(cl->command, "model");
  EXPECT_TRUE(cl->args.empty());
  EXPECT_FALSE(cl->help);
}

TEST(CommandLineTest, EachGlobalFlagParses) {
  absl::StatusOr<CommandLine> cl =
      ParseCommandLine({"--server", "h:1", "--token", "tok", "--tls", "--tls-ca", "ca.pem",
                        "--timeout", "2.5", "generate", "--max-tokens", "3", "hi"},
                       {});
  ASSERT_TRUE(cl.ok()) << cl.status();
  EXPECT_EQ(cl->client.server, "h:1");
  EXPECT_EQ(cl->client.token, "tok");
  EXPECT_TRUE(cl->client.tls);
  EXPECT_EQ(cl->client.tls_ca_file, "ca.pem");
  EXPECT_EQ(cl->client.timeout, std::chrono::milliseconds(2500));
  EXPECT_EQ(cl->command, "generate");
  EXPECT_THAT(cl->args, ElementsAre("--max-tokens", "3", "hi"));
}

TEST(CommandLineTest, InlineValuesAndTlsCaImpliesTls) {
  absl::StatusOr<CommandLine> cl =
      ParseCommandLine({"--server=h:2", "--tls-ca=ca.pem", "--timeout=0", "sessions"}, {});
  ASSERT_TRUE(cl.ok()) << cl.status();
  EXPECT_EQ(cl->client.server, "h:2");
  EXPECT_TRUE(cl->client.tls);
  EXPECT_EQ(cl->client.timeout, std::chrono::milliseconds(0));
}

TEST(CommandLineTest, EnvironmentIsTheFallback) {
  CliEnvironment env{.server = "envhost:7", .token = "envtok"};
  absl::StatusOr<CommandLine> cl = ParseCommandLine({"model"}, env);
  ASSERT_TRUE(cl.ok());
  EXPECT_EQ(cl->client.server, "envhost:7");
  EXPECT_EQ(cl->client.token, "envtok");

  cl = ParseCommandLine({"--server", "flag:8", "--token", "flagtok", "model"}, env);
  ASSERT_TRUE(cl.ok());
  EXPECT_EQ(cl->client.server, "flag:8");
  EXPECT_EQ(cl->client.token, "flagtok");

  // An empty CORTIQ_SERVER does not replace the default.
  cl = ParseCommandLine({"model"}, CliEnvironment{.server = "", .token = std::nullopt});
  ASSERT_TRUE(cl.ok());
  EXPECT_EQ(cl->client.server, "127.0.0.1:50051");
}

TEST(CommandLineTest, Help) {
  for (const Args& argv : {Args{"--help"}, Args{"-h"}, Args{"help"}, Args{"generate", "--help"},
                           Args{"--server", "x:1", "sessions", "-h"}}) {
    absl::StatusOr<CommandLine> cl = ParseCommandLine(argv, {});
    ASSERT_TRUE(cl.ok()) << cl.status();
    EXPECT_TRUE(cl->help) << argv[0];
  }
  // After `--` it is a prompt.
  absl::StatusOr<CommandLine> cl = ParseCommandLine({"generate", "--", "--help"}, {});
  ASSERT_TRUE(cl.ok());
  EXPECT_FALSE(cl->help);
}

TEST(CommandLineTest, NoCommand) {
  absl::StatusOr<CommandLine> cl = ParseCommandLine({}, {});
  ASSERT_TRUE(cl.ok());
  EXPECT_TRUE(cl->command.empty());
  EXPECT_FALSE(cl->help);
}

TEST(CommandLineTest, BadGlobalFlagsNameTheFlag) {
  ExpectUsageError(ParseCommandLine({"--bogus", "model"}, {}), "--bogus");
  ExpectUsageError(ParseCommandLine({"--server"}, {}), "--server needs a value");
  ExpectUsageError(ParseCommandLine({"--server", ""}, {}), "--server");
  ExpectUsageError(ParseCommandLine({"--timeout", "soon", "model"}, {}), "--timeout");
  ExpectUsageError(ParseCommandLine({"--timeout", "-1", "model"}, {}), "--timeout");
  ExpectUsageError(ParseCommandLine({"--timeout", "nan", "model"}, {}), "--timeout");
  ExpectUsageError(ParseCommandLine({"--tls=yes", "model"}, {}), "--tls takes no value");
}

TEST(CommandLineTest, GlobalFlagAfterTheCommandIsExplained) {
  absl::StatusOr<CommandLine> cl = ParseCommandLine({"generate", "--server", "h:1", "hi"}, {});
  ASSERT_TRUE(cl.ok());
  ExpectUsageError(ParseGenerateArgs(cl->args), "--server is a global flag");
}

// (The number parsers' tests, NumberFlagTest, moved to tests/util/flags_test.cc
// with the parsers: core/util/flags.h.)

// ---------------------------------------------------------------------------
// generate

TEST(GenerateArgsTest, DefaultsLeaveOptionalFieldsUnset) {
  absl::StatusOr<GenerateArgs> g = ParseGenerateArgs({"Hello there"});
  ASSERT_TRUE(g.ok()) << g.status();
  const v1::GenerateRequest& r = g->request;
  EXPECT_EQ(r.prompt(), "Hello there");
  EXPECT_EQ(r.prompt_tokens_size(), 0);
  EXPECT_EQ(r.max_tokens(), 64u);
  EXPECT_FALSE(r.has_sampling());
  EXPECT_FALSE(r.has_session_config());
  EXPECT_TRUE(r.session_id().empty());
  EXPECT_FALSE(r.keep_session());
  EXPECT_FALSE(r.logprobs());
  EXPECT_EQ(r.top_logprobs(), 0u);
  EXPECT_FALSE(r.ignore_eos());
  EXPECT_EQ(r.stop_size(), 0);
  EXPECT_FALSE(g->json);
  EXPECT_FALSE(g->prompt_from_stdin);
}

TEST(GenerateArgsTest, EveryFlag) {
  absl::StatusOr<GenerateArgs> g = ParseGenerateArgs({"--max-tokens",
                                                      "5",
                                                      "--keep",
                                                      "--temperature",
                                                      "0.5",
                                                      "--top-k=40",
                                                      "--top-p",
                                                      "0.9",
                                                      "--min-p",
                                                      "0.05",
                                                      "--repetition-penalty",
                                                      "1.1",
                                                      "--seed",
                                                      "12345678901",
                                                      "--stop",
                                                      "\n\n",
                                                      "--stop=END",
                                                      "--logprobs",
                                                      "--top-logprobs",
                                                      "3",
                                                      "--ignore-eos",
                                                      "--json",
                                                      "--kv",
                                                      "int8",
                                                      "prompt text"});
  ASSERT_TRUE(g.ok()) << g.status();
  const v1::GenerateRequest& r = g->request;
  EXPECT_EQ(r.prompt(), "prompt text");
  EXPECT_EQ(r.max_tokens(), 5u);
  EXPECT_TRUE(r.keep_session());
  ASSERT_TRUE(r.has_sampling());
  EXPECT_FLOAT_EQ(r.sampling().temperature(), 0.5f);
  EXPECT_EQ(r.sampling().top_k(), 40);
  EXPECT_FLOAT_EQ(r.sampling().top_p(), 0.9f);
  EXPECT_FLOAT_EQ(r.sampling().min_p(), 0.05f);
  EXPECT_FLOAT_EQ(r.sampling().repetition_penalty(), 1.1f);
  EXPECT_EQ(r.sampling().seed(), 12345678901ull);
  EXPECT_THAT(r.stop(), ElementsAre("\n\n", "END"));
  EXPECT_TRUE(r.logprobs());
  EXPECT_EQ(r.top_logprobs(), 3u);
  EXPECT_TRUE(r.ignore_eos());
  EXPECT_TRUE(g->json);
  ASSERT_TRUE(r.has_session_config());
  EXPECT_EQ(r.session_config().kv_dtype(), v1::KV_DTYPE_INT8);
  EXPECT_EQ(r.session_config().attention(), v1::ATTENTION_MODE_UNSPECIFIED);
}

TEST(GenerateArgsTest, SamplingFieldsSetOnlyWhenGiven) {
  absl::StatusOr<GenerateArgs> g = ParseGenerateArgs({"--top-k", "0", "hi"});
  ASSERT_TRUE(g.ok()) << g.status();
  const v1::SamplingParams& s = g->request.sampling();
  EXPECT_TRUE(s.has_top_k());  // an explicit 0 is sent
  EXPECT_EQ(s.top_k(), 0);
  EXPECT_FALSE(s.has_temperature());
  EXPECT_FALSE(s.has_top_p());
  EXPECT_FALSE(s.has_min_p());
  EXPECT_FALSE(s.has_repetition_penalty());
  EXPECT_FALSE(s.has_seed());

  g = ParseGenerateArgs({"--temperature", "0", "hi"});
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(g->request.sampling().has_temperature());
  EXPECT_EQ(g->request.sampling().temperature(), 0.0f);
  EXPECT_FALSE(g->request.sampling().has_top_k());
}

TEST(GenerateArgsTest, OpenAiStyleControls) {
  auto g = ParseGenerateArgs({"--presence-penalty", "0.5", "--frequency-penalty=-1.5",
                              "--logit-bias", "50=-100,7=2.5", "--logit-bias=9=1",
                              "--stop-token-id", "3", "--stop-token-id=4,5", "--min-tokens",
                              "6", "--n", "3", "hi"});
  ASSERT_TRUE(ParseGenerateArgs({"-n", "2", "hi"}).ok());
  ASSERT_TRUE(g.ok()) << g.status();
  const v1::GenerateRequest& r = g->request;
  EXPECT_FLOAT_EQ(r.sampling().presence_penalty(), 0.5f);
  EXPECT_FLOAT_EQ(r.sampling().frequency_penalty(), -1.5f);
  ASSERT_EQ(r.sampling().logit_bias().size(), 3u);
  EXPECT_FLOAT_EQ(r.sampling().logit_bias().at(50), -100.0f);
  EXPECT_FLOAT_EQ(r.sampling().logit_bias().at(7), 2.5f);
  EXPECT_FLOAT_EQ(r.sampling().logit_bias().at(9), 1.0f);
  EXPECT_THAT(r.stop_token_ids(), ElementsAre(3, 4, 5));
  EXPECT_EQ(r.min_tokens(), 6u);
  EXPECT_EQ(r.n(), 3u);
  // Unset: not sent.
  g = ParseGenerateArgs({"hi"});
  ASSERT_TRUE(g.ok());
  EXPECT_FALSE(g->request.sampling().has_presence_penalty());
  EXPECT_FALSE(g->request.sampling().has_frequency_penalty());
  EXPECT_EQ(g->request.n(), 0u);
  EXPECT_EQ(g->request.min_tokens(), 0u);

  ExpectUsageError(ParseGenerateArgs({"--presence-penalty", "x", "hi"}), "--presence-penalty");
  ExpectUsageError(ParseGenerateArgs({"--frequency-penalty", "", "hi"}), "--frequency-penalty");
  ExpectUsageError(ParseGenerateArgs({"--logit-bias", "50", "hi"}), "--logit-bias");
  ExpectUsageError(ParseGenerateArgs({"--logit-bias", "-1=2", "hi"}), "--logit-bias");
  ExpectUsageError(ParseGenerateArgs({"--logit-bias", "5=abc", "hi"}), "--logit-bias");
  ExpectUsageError(ParseGenerateArgs({"--logit-bias", "5=1,", "hi"}), "--logit-bias");
  ExpectUsageError(ParseGenerateArgs({"--stop-token-id", "-2", "hi"}), "--stop-token-id");
  ExpectUsageError(ParseGenerateArgs({"--stop-token-id", "a", "hi"}), "--stop-token-id");
  ExpectUsageError(ParseGenerateArgs({"--min-tokens", "-1", "hi"}), "--min-tokens");
  ExpectUsageError(ParseGenerateArgs({"--n=0", "hi"}), "-n: must be at least 1");
  // After `--` it is the prompt.
  auto prompt = ParseGenerateArgs({"--", "--n"});
  ASSERT_TRUE(prompt.ok());
  EXPECT_EQ(prompt->request.prompt(), "--n");
}

TEST(GenerateArgsTest, TopLogprobsImpliesLogprobs) {
  absl::StatusOr<GenerateArgs> g = ParseGenerateArgs({"--top-logprobs", "5", "hi"});
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(g->request.logprobs());
  EXPECT_EQ(g->request.top_logprobs(), 5u);
}

TEST(GenerateArgsTest, ContinuedSession) {
  absl::StatusOr<GenerateArgs> g = ParseGenerateArgs({"--session", "abc123", "more"});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->request.session_id(), "abc123");
  EXPECT_FALSE(g->request.has_session_config());
  // A continued session keeps its own configuration.
  ExpectUsageError(ParseGenerateArgs({"--session", "abc", "--kv", "int8", "x"}),
                   "--kv cannot be combined with --session");
  ExpectUsageError(ParseGenerateArgs({"--session", "", "x"}), "--session: empty value");
}

TEST(GenerateArgsTest, PromptAsTokens) {
  absl::StatusOr<GenerateArgs> g = ParseGenerateArgs({"--tokens", "151644,872,198"});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(g->request.prompt().empty());
  EXPECT_THAT(g->request.prompt_tokens(), ElementsAre(151644, 872, 198));
  ExpectUsageError(ParseGenerateArgs({"--tokens", "1,2", "text"}),
                   "--tokens and a PROMPT cannot be combined");
  ExpectUsageError(ParseGenerateArgs({"--tokens", "1,a"}), "--tokens");
}

TEST(GenerateArgsTest, PromptForms) {
  ExpectUsageError(ParseGenerateArgs({}), "generate needs a PROMPT");
  ExpectUsageError(ParseGenerateArgs({"two", "words"}), "generate takes one PROMPT");
  ExpectUsageError(ParseGenerateArgs({""}), "PROMPT is empty");
  absl::StatusOr<GenerateArgs> g = ParseGenerateArgs({"-"});
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(g->prompt_from_stdin);
  g = ParseGenerateArgs({"--max-tokens", "2", "--", "--not-a-flag"});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->request.prompt(), "--not-a-flag");
}

TEST(GenerateArgsTest, BadFlagsNameTheFlag) {
  ExpectUsageError(ParseGenerateArgs({"--frobnicate", "x"}), "unknown flag --frobnicate");
  ExpectUsageError(ParseGenerateArgs({"x", "--max-tokens"}), "--max-tokens needs a value");
  ExpectUsageError(ParseGenerateArgs({"--max-tokens", "ten", "x"}), "--max-tokens");
  ExpectUsageError(ParseGenerateArgs({"--max-tokens", "-1", "x"}),
                   "--max-tokens: must not be negative");
  ExpectUsageError(ParseGenerateArgs({"--max-tokens", "0", "x"}),
                   "--max-tokens: must be at least 1");
  ExpectUsageError(ParseGenerateArgs({"--max-tokens", "5x", "x"}), "--max-tokens");
  ExpectUsageError(ParseGenerateArgs({"--temperature", "hot", "x"}), "--temperature");
  ExpectUsageError(ParseGenerateArgs({"--top-k", "-1", "x"}), "--top-k");
  ExpectUsageError(ParseGenerateArgs({"--top-p", "0.9.1", "x"}), "--top-p");
  ExpectUsageError(ParseGenerateArgs({"--min-p", "", "x"}), "--min-p");
  ExpectUsageError(ParseGenerateArgs({"--repetition-penalty", "inf", "x"}), "--repetition-penalty");
  ExpectUsageError(ParseGenerateArgs({"--seed", "-3", "x"}), "--seed");
  ExpectUsageError(ParseGenerateArgs({"--top-logprobs", "many", "x"}), "--top-logprobs");
  ExpectUsageError(ParseGenerateArgs({"--stop", "", "x"}), "--stop: empty value");
  ExpectUsageError(ParseGenerateArgs({"--keep=1", "x"}), "--keep takes no value");
  ExpectUsageError(ParseGenerateArgs({"--kv", "f16", "x"}), "--kv");
  ExpectUsageError(ParseGenerateArgs({"--attention", "sparse", "x"}), "--attention");
}

TEST(GenerateArgsTest, O1Parameters) {
  absl::StatusOr<GenerateArgs> g =
      ParseGenerateArgs({"--attention", "o1", "--o1-layers", "deep", "--o1-m", "16", "--o1-window",
                         "64", "--o1-sink", "0", "--o1-rect", "fm", "x"});
  ASSERT_TRUE(g.ok()) << g.status();
  const v1::SessionConfig& c = g->request.session_config();
  EXPECT_EQ(c.attention(), v1::ATTENTION_MODE_O1);
  EXPECT_EQ(c.kv_dtype(), v1::KV_DTYPE_UNSPECIFIED);
  ASSERT_TRUE(c.has_o1());
  EXPECT_EQ(c.o1().layers(), "deep");
  EXPECT_EQ(c.o1().m(), 16u);
  EXPECT_EQ(c.o1().window(), 64u);
  EXPECT_TRUE(c.o1().has_sink());  // an explicit 0 is sent
  EXPECT_EQ(c.o1().sink(), 0u);
  EXPECT_EQ(c.o1().rect(), "fm");
  EXPECT_FALSE(c.has_qsa());
}

TEST(GenerateArgsTest, O1FlagsImplyO1AndUnsetFieldsStayUnset) {
  absl::StatusOr<GenerateArgs> g = ParseGenerateArgs({"--o1-m", "8", "x"});
  ASSERT_TRUE(g.ok()) << g.status();
  const v1::SessionConfig& c = g->request.session_config();
  EXPECT_EQ(c.attention(), v1::ATTENTION_MODE_O1);
  EXPECT_TRUE(c.o1().has_m());
  EXPECT_FALSE(c.o1().has_layers());
  EXPECT_FALSE(c.o1().has_window());
  EXPECT_FALSE(c.o1().has_sink());
  EXPECT_FALSE(c.o1().has_rect());
  // --attention o1 alone leaves every parameter to the server.
  g = ParseGenerateArgs({"--attention", "o1", "x"});
  ASSERT_TRUE(g.ok());
  EXPECT_FALSE(g->request.session_config().has_o1());
}

TEST(GenerateArgsTest, QsaParameters) {
  absl::StatusOr<GenerateArgs> g = ParseGenerateArgs(
      {"--qsa-layers", "3,5-7", "--qsa-ratio", "64", "--qsa-budget", "16", "--kv", "f32", "x"});
  ASSERT_TRUE(g.ok()) << g.status();
  const v1::SessionConfig& c = g->request.session_config();
  EXPECT_EQ(c.attention(), v1::ATTENTION_MODE_QSA);
  EXPECT_EQ(c.kv_dtype(), v1::KV_DTYPE_F32);
  EXPECT_EQ(c.qsa().layers(), "3,5-7");
  EXPECT_EQ(c.qsa().ratio(), 64u);
  EXPECT_EQ(c.qsa().budget(), 16u);
  EXPECT_FALSE(c.has_o1());
}

TEST(GenerateArgsTest, WindowParameters) {
  absl::StatusOr<GenerateArgs> g = ParseGenerateArgs(
      {"--window-layers", "deep2", "--window-sink", "4", "--window-size", "256", "x"});
  ASSERT_TRUE(g.ok()) << g.status();
  const v1::SessionConfig& c = g->request.session_config();
  EXPECT_EQ(c.attention(), v1::ATTENTION_MODE_WINDOW);
  EXPECT_EQ(c.window().layers(), "deep2");
  EXPECT_EQ(c.window().sink(), 4u);
  EXPECT_EQ(c.window().window(), 256u);
  EXPECT_FALSE(c.has_o1());
  EXPECT_FALSE(c.has_qsa());
  g = ParseGenerateArgs({"--attention", "window", "x"});
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->request.session_config().attention(), v1::ATTENTION_MODE_WINDOW);
  EXPECT_FALSE(g->request.session_config().has_window());  // the server's defaults
  ExpectUsageError(ParseGenerateArgs({"--attention", "o1", "--window-size", "8", "x"}),
                   "--window-size needs --attention window");
  ExpectUsageError(ParseGenerateArgs({"--qsa-ratio", "8", "--window-sink", "2", "x"}),
                   "--qsa-ratio and --window-sink cannot be combined");
}

TEST(GenerateArgsTest, AttentionConflicts) {
  ExpectUsageError(ParseGenerateArgs({"--attention", "exact", "--o1-m", "8", "x"}),
                   "--o1-m needs --attention o1");
  ExpectUsageError(ParseGenerateArgs({"--attention", "o1", "--qsa-ratio", "8", "x"}),
                   "--qsa-ratio needs --attention qsa");
  ExpectUsageError(ParseGenerateArgs({"--o1-window", "8", "--qsa-budget", "4", "x"}),
                   "--o1-window and --qsa-budget cannot be combined");
  ExpectUsageError(ParseGenerateArgs({"--o1-rect", "max", "x"}), "--o1-rect: expected agg or fm");
  ExpectUsageError(ParseGenerateArgs({"--o1-m", "-4", "x"}), "--o1-m: must not be negative");
  ExpectUsageError(ParseGenerateArgs({"--qsa-layers", "", "x"}), "--qsa-layers: empty value");
}

// ---------------------------------------------------------------------------
// Other commands

TEST(SessionCreateArgsTest, Flags) {
  absl::StatusOr<v1::CreateSessionRequest> r = ParseSessionCreateArgs({});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->config().attention(), v1::ATTENTION_MODE_UNSPECIFIED);
  EXPECT_EQ(r->config().kv_dtype(), v1::KV_DTYPE_UNSPECIFIED);

  r = ParseSessionCreateArgs({"--kv", "int8", "--attention", "qsa", "--qsa-budget", "8"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->config().kv_dtype(), v1::KV_DTYPE_INT8);
  EXPECT_EQ(r->config().attention(), v1::ATTENTION_MODE_QSA);
  EXPECT_EQ(r->config().qsa().budget(), 8u);
  EXPECT_FALSE(r->config().qsa().has_ratio());

  ExpectUsageError(ParseSessionCreateArgs({"extra"}), "session create takes no arguments");
  ExpectUsageError(ParseSessionCreateArgs({"--max-tokens", "3"}),
                   "unknown flag --max-tokens for session create");
}

TEST(TokenizeArgsTest, Flags) {
  absl::StatusOr<TokenizeArgs> t = ParseTokenizeArgs({"hello world"});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->request.text(), "hello world");
  EXPECT_FALSE(t->request.has_parse_special());
  EXPECT_FALSE(t->verbose);

  t = ParseTokenizeArgs({"--no-special", "--verbose", "<|im_start|>"});
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(t->request.has_parse_special());
  EXPECT_FALSE(t->request.parse_special());
  EXPECT_TRUE(t->verbose);

  ExpectUsageError(ParseTokenizeArgs({}), "tokenize takes one TEXT");
  ExpectUsageError(ParseTokenizeArgs({"a", "b"}), "tokenize takes one TEXT");
  ExpectUsageError(ParseTokenizeArgs({"--special", "a"}), "unknown flag --special");
}

TEST(ExportImportMigrateArgsTest, Flags) {
  absl::StatusOr<ExportArgs> e =
      ParseExportArgs({"sid", "-o", "out.bin", "--version", "2", "--f16"});
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->request.session_id(), "sid");
  EXPECT_EQ(e->output, "out.bin");
  EXPECT_EQ(e->request.version(), 2u);
  EXPECT_EQ(e->request.dtype(), v1::WIRE_DTYPE_F16);
  e = ParseExportArgs({"--output=-", "sid"});
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->output, "-");
  EXPECT_EQ(e->request.dtype(), v1::WIRE_DTYPE_UNSPECIFIED);
  ExpectUsageError(ParseExportArgs({"sid"}), "export needs -o FILE");
  ExpectUsageError(ParseExportArgs({"-o", "f"}), "export takes one session ID");
  ExpectUsageError(ParseExportArgs({"sid", "-o", "f", "--version", "v2"}), "--version");

  absl::StatusOr<std::string> in = ParseImportArgs({"state.bin"});
  ASSERT_TRUE(in.ok());
  EXPECT_EQ(*in, "state.bin");
  ExpectUsageError(ParseImportArgs({}), "import takes one FILE");

  absl::StatusOr<v1::MigrateSessionRequest> m =
      ParseMigrateArgs({"sid", "--to", "peer:50051", "--peer-token", "pt", "--f16"});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->session_id(), "sid");
  EXPECT_EQ(m->peer(), "peer:50051");
  EXPECT_EQ(m->peer_token(), "pt");
  EXPECT_EQ(m->dtype(), v1::WIRE_DTYPE_F16);
  ExpectUsageError(ParseMigrateArgs({"sid"}), "migrate needs --to");
  ExpectUsageError(ParseMigrateArgs({"sid", "--to"}), "--to needs a value");
}

TEST(SimpleCommandArgsTest, PositionalsAndNoArgs) {
  absl::StatusOr<std::string> id = ParseOnePositional("session show", "ID", {"abc"});
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(*id, "abc");
  ExpectUsageError(ParseOnePositional("session show", "ID", {}), "session show takes one ID");
  ExpectUsageError(ParseOnePositional("session release", "ID", {"a", "b"}),
                   "session release takes one ID");
  ExpectUsageError(ParseOnePositional("session show", "ID", {"--json", "a"}),
                   "unknown flag --json");

  EXPECT_EQ(*ParseHealthArgs({}), "");
  EXPECT_EQ(*ParseHealthArgs({"cortiq.v1.Inference"}), "cortiq.v1.Inference");
  ExpectUsageError(ParseHealthArgs({"a", "b"}), "health takes at most one SERVICE");

  EXPECT_TRUE(ParseNoArgs("sessions", {}).ok());
  ExpectUsageError(ParseNoArgs("sessions", {"x"}), "sessions takes no arguments");
  ExpectUsageError(ParseNoArgs("model", {"--all"}), "unknown flag --all for model");
}

// ---------------------------------------------------------------------------
// Status conversion, health wire format, Connect

TEST(FromGrpcStatusTest, SameCodeAndMessage) {
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
  const std::vector<std::pair<grpc::StatusCode, absl::StatusCode>> pairs = {
      {grpc::StatusCode::CANCELLED, absl::StatusCode::kCancelled},
      {grpc::StatusCode::UNKNOWN, absl::StatusCode::kUnknown},
      {grpc::StatusCode::INVALID_ARGUMENT, absl::StatusCode::kInvalidArgument},
      {grpc::StatusCode::DEADLINE_EXCEEDED, absl::StatusCode::kDeadlineExceeded},
      {grpc::StatusCode::NOT_FOUND, absl::StatusCode::kNotFound},
      {grpc::StatusCode::ALREADY_EXISTS, absl::StatusCode::kAlreadyExists},
      {grpc::StatusCode::PERMISSION_DENIED, absl::StatusCode::kPermissionDenied},
      {grpc::StatusCode::RESOURCE_EXHAUSTED, absl::StatusCode::kResourceExhausted},
      {grpc::StatusCode::FAILED_PRECONDITION, absl::StatusCode::kFailedPrecondition},
      {grpc::StatusCode::ABORTED, absl::StatusCode::kAborted},
      {grpc::StatusCode::OUT_OF_RANGE, absl::StatusCode::kOutOfRange},
      {grpc::StatusCode::UNIMPLEMENTED, absl::StatusCode::kUnimplemented},
      {grpc::StatusCode::INTERNAL, absl::StatusCode::kInternal},
      {grpc::StatusCode::UNAVAILABLE, absl::StatusCode::kUnavailable},
      {grpc::StatusCode::DATA_LOSS, absl::StatusCode::kDataLoss},
      {grpc::StatusCode::UNAUTHENTICATED, absl::StatusCode::kUnauthenticated},
  };
  for (const auto& [grpc_code, absl_code] : pairs) {
    absl::Status s = FromGrpcStatus(grpc::Status(grpc_code, "max_tokens: 0 < 1"));
    EXPECT_EQ(s.code(), absl_code) << static_cast<int>(grpc_code);
    EXPECT_EQ(s.message(), "max_tokens: 0 < 1");
  }
  // (A code outside 0..16 cannot be built as a grpc::StatusCode without
  // undefined behaviour, so the out-of-range branch is not exercised here.)
}

TEST(HealthWireTest, RequestEncoding) {
  EXPECT_EQ(EncodeHealthCheckRequest(""), "");
  EXPECT_EQ(EncodeHealthCheckRequest("ab"), std::string("\x0a\x02"
                                                        "ab",
                                                        4));
  // A 200-byte name: the length is a two-byte varint (0xc8 0x01).
  const std::string long_name(200, 'x');
  const std::string encoded = EncodeHealthCheckRequest(long_name);
  ASSERT_EQ(encoded.size(), 203u);
  EXPECT_EQ(encoded.substr(0, 3), std::string("\x0a\xc8\x01", 3));
  EXPECT_EQ(encoded.substr(3), long_name);
}

TEST(HealthWireTest, ResponseDecoding) {
  EXPECT_EQ(*DecodeHealthCheckResponse(""), ServingStatus::kUnknown);
  EXPECT_EQ(*DecodeHealthCheckResponse(std::string("\x08\x01", 2)), ServingStatus::kServing);
  EXPECT_EQ(*DecodeHealthCheckResponse(std::string("\x08\x02", 2)), ServingStatus::kNotServing);
  EXPECT_EQ(*DecodeHealthCheckResponse(std::string("\x08\x03", 2)), ServingStatus::kServiceUnknown);
  EXPECT_EQ(*DecodeHealthCheckResponse(std::string("\x08\x09", 2)), ServingStatus::kUnknown);
  // Unknown fields are skipped: field 2 (string "hi") before the status.
  EXPECT_EQ(*DecodeHealthCheckResponse(std::string("\x12\x02hi\x08\x01", 6)),
            ServingStatus::kServing);
  EXPECT_EQ(DecodeHealthCheckResponse(std::string("\x08", 1)).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeHealthCheckResponse(std::string("\x12\x05hi", 4)).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_STREQ(ServingStatusName(ServingStatus::kServing), "SERVING");
  EXPECT_STREQ(ServingStatusName(ServingStatus::kNotServing), "NOT_SERVING");
}

TEST(ConnectTest, ValidatesOptionsWithoutDialing) {
  EXPECT_TRUE(Client::Connect({}).ok());  // lazy: nothing listens on the default port
  EXPECT_EQ(Client::Connect({.server = ""}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Client::Connect({.timeout = std::chrono::milliseconds(-1)}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Client::Connect({.tls = true, .tls_ca_file = "/nonexistent/ca.pem"}).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(ConnectTest, UnreachableServerIsUnavailable) {
  // Port 1 on localhost refuses connections; the call fails fast, not hangs.
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Connect({.server = "127.0.0.1:1", .timeout = std::chrono::milliseconds(5000)});
  ASSERT_TRUE(client.ok());
  absl::StatusOr<v1::ModelInfo> info = (*client)->GetModelInfo();
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kUnavailable) << info.status();
  absl::StatusOr<v1::GenerateSummary> summary = (*client)->Generate({}, nullptr);
  EXPECT_EQ(summary.status().code(), absl::StatusCode::kUnavailable) << summary.status();
  absl::StatusOr<ServingStatus> health = (*client)->Health();
  EXPECT_EQ(health.status().code(), absl::StatusCode::kUnavailable) << health.status();
}

TEST(CancelTokenTest, CancelBeforeTheCallCancelsIt) {
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect({.server = "127.0.0.1:1"});
  ASSERT_TRUE(client.ok());
  CancelToken cancel;
  cancel.Cancel();
  EXPECT_TRUE(cancel.cancelled());
  absl::StatusOr<v1::GenerateSummary> summary = (*client)->Generate({}, nullptr, &cancel);
  EXPECT_EQ(summary.status().code(), absl::StatusCode::kCancelled) << summary.status();
}

}  // namespace
}  // namespace cortiq::client
