// The shared command-line parser (core/util/flags.h): every binding type, both
// value syntaxes, switches, positional modes, help, and the error messages
// (each names the flag as spelled). The value parsers' tests came here from
// tests/client/cli_test.cc (NumberFlagTest) with the parsers themselves.
#include "core/util/flags.h"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/usage_error.h"

namespace cortiq::util {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

using Args = std::vector<std::string>;

using ::cortiq::testing::ExpectUsageError;

// ---------------------------------------------------------------------------
// Value parsers

TEST(NumberFlagTest, StrictUnsigned) {
  EXPECT_EQ(*ParseIntFlag<uint32_t>("--n", "0"), 0u);
  EXPECT_EQ(*ParseIntFlag<uint32_t>("--n", "4294967295"), 4294967295u);
  EXPECT_EQ(*ParseIntFlag<uint64_t>("--seed", "18446744073709551615"), 18446744073709551615ull);
  ExpectUsageError(ParseIntFlag<uint32_t>("--n", "4294967296"), "--n: out of range");
  ExpectUsageError(ParseIntFlag<uint32_t>("--n", "-1"), "--n: must not be negative");
  ExpectUsageError(ParseIntFlag<uint32_t>("--n", "12abc"), "--n: expected a non-negative integer");
  ExpectUsageError(ParseIntFlag<uint32_t>("--n", " 12"), "--n");
  ExpectUsageError(ParseIntFlag<uint32_t>("--n", "12 "), "--n");
  ExpectUsageError(ParseIntFlag<uint32_t>("--n", ""), "--n");
  ExpectUsageError(ParseIntFlag<uint32_t>("--n", "+3"), "--n");
  ExpectUsageError(ParseIntFlag<uint32_t>("--n", "0x10"), "--n");
  ExpectUsageError(ParseIntFlag<uint64_t>("--seed", "-5"), "--seed: must not be negative");
  ExpectUsageError(ParseIntFlag<int32_t>("--k", "2147483648", {.min = 0}), "--k: out of range");
  EXPECT_EQ(*ParseIntFlag<int32_t>("--k", "2147483647", {.min = 0}), 2147483647);
}

TEST(NumberFlagTest, SignedAndRanges) {
  EXPECT_EQ(*ParseIntFlag<int64_t>("--w", "-1"), -1);
  EXPECT_EQ(*ParseIntFlag<int32_t>("--w", "-2147483648"), INT32_MIN);
  ExpectUsageError(ParseIntFlag<int32_t>("--w", "-2147483649"),
                   "--w: must be at least -2147483648");
  ExpectUsageError(ParseIntFlag<int32_t>("--w", "1.5"), "--w: expected an integer");
  // A range without negative values refuses a sign the same way as an unsigned type.
  ExpectUsageError(ParseIntFlag<int32_t>("--k", "-1", {.min = 0}), "--k: must not be negative");
  // The brief's example: the limit and the value, both named.
  const absl::StatusOr<size_t> zero = ParseIntFlag<size_t>("--max-tokens", "0", {1, 65536});
  ExpectUsageError(zero, "--max-tokens: must be at least 1 (got \"0\")");
  ExpectUsageError(ParseIntFlag<size_t>("--max-tokens", "65537", {1, 65536}),
                   "--max-tokens: out of range, at most 65536 (got \"65537\")");
  // Past the type: the range's limit is named, not the parser's internal type.
  ExpectUsageError(ParseIntFlag<uint16_t>("--p", "70000"), "--p: out of range, at most 65535");
  ExpectUsageError(ParseIntFlag<uint16_t>("--p", "99999999999999999999"),
                   "--p: out of range, at most 65535");
}

TEST(NumberFlagTest, StrictFloat) {
  EXPECT_FLOAT_EQ(*ParseNumberFlag<float>("--t", "0.7"), 0.7f);
  EXPECT_FLOAT_EQ(*ParseNumberFlag<float>("--t", "1e-3"), 1e-3f);
  EXPECT_FLOAT_EQ(*ParseNumberFlag<float>("--t", "-2"), -2.0f);
  ExpectUsageError(ParseNumberFlag<float>("--t", "0.7x"), "--t: expected a number");
  ExpectUsageError(ParseNumberFlag<float>("--t", "inf"), "--t: must be a finite number");
  ExpectUsageError(ParseNumberFlag<float>("--t", "nan"), "--t");
  ExpectUsageError(ParseNumberFlag<float>("--t", "1e39"), "--t: out of range");
  ExpectUsageError(ParseNumberFlag<float>("--t", ""), "--t");
  EXPECT_DOUBLE_EQ(*ParseNumberFlag<double>("--gb", "1e39"), 1e39);
  ExpectUsageError(ParseNumberFlag<double>("--p", "1.5", {0.0, 1.0}),
                   "--p: out of range, at most 1");
  ExpectUsageError(ParseNumberFlag<double>("--p", "-0.5", {0.0, 1.0}), "--p: must be at least 0");
}

TEST(NumberFlagTest, Seconds) {
  EXPECT_EQ(*ParseSecondsFlag("--timeout", "1"), std::chrono::milliseconds(1000));
  EXPECT_EQ(*ParseSecondsFlag("--timeout", "2.5"), std::chrono::milliseconds(2500));
  EXPECT_EQ(*ParseSecondsFlag("--timeout", "0.0001"), std::chrono::milliseconds(1));
  EXPECT_EQ(*ParseSecondsFlag("--timeout", "0"), std::chrono::milliseconds(0));
  ExpectUsageError(ParseSecondsFlag("--timeout", "1e10"), "--timeout: out of range");
  ExpectUsageError(ParseSecondsFlag("--timeout", "-1"), "--timeout: must be at least 0");
  ExpectUsageError(ParseSecondsFlag("--timeout", "soon"), "--timeout: expected a number");
}

TEST(NumberFlagTest, Bytes) {
  EXPECT_EQ(*ParseBytesFlag("--b", "0"), 0u);
  EXPECT_EQ(*ParseBytesFlag("--b", "512"), 512u);
  EXPECT_EQ(*ParseBytesFlag("--b", "1K"), 1024u);
  EXPECT_EQ(*ParseBytesFlag("--b", "512m"), size_t{512} << 20);
  EXPECT_EQ(*ParseBytesFlag("--b", "1.5G"), size_t{3} << 29);
  EXPECT_EQ(*ParseBytesFlag("--b", "2T"), size_t{2} << 40);
  for (const char* bad : {"", "G", "-1", "1X", "1GB", "inf", "nan", "2e18", "1 G"}) {
    ExpectUsageError(ParseBytesFlag("--b", bad), "--b: expected a byte size");
  }
}

TEST(NumberFlagTest, TokenIds) {
  auto ids = [](std::string_view v) {
    return ParseIntListFlag<int32_t>("--tokens", v, "id", {.min = 0});
  };
  EXPECT_THAT(*ids("1,2,3"), ElementsAre(1, 2, 3));
  EXPECT_THAT(*ids(" 7, 0 ,151643"), ElementsAre(7, 0, 151643));
  EXPECT_THAT(*ids("42"), ElementsAre(42));
  ExpectUsageError(ids(""), "--tokens: empty id at position 1");
  ExpectUsageError(ids("1,,2"), "--tokens: empty id at position 2");
  ExpectUsageError(ids("1,2,"), "--tokens: empty id at position 3");
  ExpectUsageError(ids("1,-2"), "--tokens: must not be negative");
  ExpectUsageError(ids("1,x"), "--tokens");
  ExpectUsageError(ParseIntListFlag<size_t>("--batches", "1,0", "batch size", {.min = 1}),
                   "--batches: must be at least 1");
}

TEST(ChoiceFlagTest, NamesTheChoices) {
  const std::vector<std::string> two = {"agg", "fm"};
  const std::vector<std::string> three = {"exact", "o1", "qsa"};
  EXPECT_EQ(*ParseChoiceFlag("--o1-rect", "fm", two), 1u);
  ExpectUsageError(ParseChoiceFlag("--o1-rect", "max", two),
                   "--o1-rect: expected agg or fm (got \"max\")");
  ExpectUsageError(ParseChoiceFlag("--attention", "sparse", three),
                   "--attention: expected exact, o1 or qsa");
  ExpectUsageError(ParseChoiceFlag("--attention", "EXACT", three), "--attention");  // case matters
}

// ---------------------------------------------------------------------------
// The table

// One of each binding, as a program declares them.
struct Values {
  std::string name = "default";
  std::string non_empty = "x";
  std::optional<std::string> maybe;
  std::vector<std::string> repeated;
  size_t count = 7;
  std::optional<uint32_t> ratio;
  int64_t windows = -1;
  double gb = 2.0;
  std::optional<float> temperature;
  std::chrono::milliseconds grace{10'000};
  size_t budget = 0;
  std::string kv = "f32";
  enum class Mode { kExact, kO1 } mode = Mode::kExact;
  bool keep = false;
  std::vector<size_t> batches = {1, 8};
  std::vector<std::string> peers;

  std::vector<Flag> Table() {
    return {
        StringFlag("name", &name),
        NonEmptyStringFlag("non-empty", &non_empty),
        StringFlag("maybe", &maybe),
        RepeatedStringFlag("stop", &repeated),
        IntFlag("count", &count, {.min = 1}),
        IntFlag("ratio", &ratio, {.min = 1, .max = 1024}),
        IntFlag("windows", &windows),
        NumberFlag("gb", &gb, {.min = 0}),
        NumberFlag("temperature", &temperature),
        SecondsFlag("grace", &grace),
        BytesFlag("budget", &budget),
        ChoiceFlag("kv", &kv, {"f32", "int8"}),
        EnumFlag("mode", &mode, {{"exact", Mode::kExact}, {"o1", Mode::kO1}}),
        SwitchFlag("keep", &keep),
        IntListFlag("batches", &batches, "batch size", {.min = 1}),
        ParsedFlag("peers", &peers,
                   [](std::string_view v) -> absl::StatusOr<std::vector<std::string>> {
                     if (v.find(':') == v.npos) return absl::InvalidArgumentError("expected H:P");
                     return std::vector<std::string>{std::string(v)};
                   }),
        StringFlag("o", &name),  // a single-letter spelling: -o
    };
  }
};

absl::StatusOr<ParsedArgs> Parse(Values& v, const Args& args, ParseOptions options = {}) {
  return ParseFlags(v.Table(), args, options);
}

TEST(ParseFlagsTest, DefaultsStayWhenNothingIsGiven) {
  Values v;
  absl::StatusOr<ParsedArgs> p = Parse(v, {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->help);
  EXPECT_THAT(p->positional, IsEmpty());
  EXPECT_THAT(p->given, IsEmpty());
  EXPECT_EQ(v.name, "default");
  EXPECT_FALSE(v.maybe.has_value());
  EXPECT_FALSE(v.ratio.has_value());
  EXPECT_FALSE(v.temperature.has_value());
  EXPECT_EQ(v.count, 7u);
  EXPECT_EQ(v.grace, std::chrono::milliseconds(10'000));
  EXPECT_FALSE(v.keep);
  EXPECT_THAT(v.batches, ElementsAre(1, 8));
}

TEST(ParseFlagsTest, EveryTypeInBothSyntaxes) {
  for (bool inline_values : {false, true}) {
    Values v;
    const std::vector<std::pair<std::string, std::string>> given = {
        {"--name", "n"},  {"--non-empty", "ne"},   {"--maybe", ""},      {"--stop", "a"},
        {"--stop", "b"},  {"--count", "3"},        {"--ratio", "64"},    {"--windows", "-5"},
        {"--gb", "0.5"},  {"--temperature", "-1"}, {"--grace", "2.5"},   {"--budget", "8G"},
        {"--kv", "int8"}, {"--mode", "o1"},        {"--batches", "2,4"}, {"--peers", "h:1"},
    };
    Args args;
    for (const auto& [flag, value] : given) {
      if (inline_values) {
        args.push_back(flag + "=" + value);
      } else {
        args.push_back(flag);
        args.push_back(value);
      }
    }
    args.push_back("--keep");
    absl::StatusOr<ParsedArgs> p = Parse(v, args);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(v.name, "n");
    EXPECT_EQ(v.non_empty, "ne");
    EXPECT_EQ(v.maybe, std::optional<std::string>(""));  // given empty: set, not unset
    EXPECT_THAT(v.repeated, ElementsAre("a", "b"));
    EXPECT_EQ(v.count, 3u);
    EXPECT_EQ(v.ratio, std::optional<uint32_t>(64));
    EXPECT_EQ(v.windows, -5);
    EXPECT_DOUBLE_EQ(v.gb, 0.5);
    EXPECT_EQ(v.temperature, std::optional<float>(-1.0f));  // a value may start with '-'
    EXPECT_EQ(v.grace, std::chrono::milliseconds(2500));
    EXPECT_EQ(v.budget, size_t{8} << 30);
    EXPECT_EQ(v.kv, "int8");
    EXPECT_EQ(v.mode, Values::Mode::kO1);
    EXPECT_TRUE(v.keep);
    EXPECT_THAT(v.batches, ElementsAre(2, 4));
    EXPECT_THAT(v.peers, ElementsAre("h:1"));
    EXPECT_EQ(p->given.size(), given.size() + 1);
    EXPECT_EQ(p->given.front(), "name");
    EXPECT_EQ(p->given.back(), "keep");
    EXPECT_TRUE(p->Given("stop"));
    EXPECT_FALSE(p->Given("o"));
  }
}

TEST(ParseFlagsTest, ValueEqualsSignsAndTheLastValueWins) {
  Values v;
  ASSERT_TRUE(Parse(v, {"--name=a=b", "--count", "2", "--count=5"}).ok());
  EXPECT_EQ(v.name, "a=b");  // split at the first '='
  EXPECT_EQ(v.count, 5u);
  ASSERT_TRUE(Parse(v, {"--name="}).ok());
  EXPECT_EQ(v.name, "");
}

TEST(ParseFlagsTest, SingleLetterFlags) {
  Values v;
  ASSERT_TRUE(Parse(v, {"-o", "out.bin"}).ok());
  EXPECT_EQ(v.name, "out.bin");
  ExpectUsageError(Parse(v, {"--o", "x"}), "unknown flag --o");
  ExpectUsageError(Parse(v, {"-o=x"}), "unknown flag -o=x");  // no inline value after one dash
  ExpectUsageError(Parse(v, {"-name", "x"}), "unknown flag -name");
}

TEST(ParseFlagsTest, Switches) {
  Values v;
  ASSERT_TRUE(Parse(v, {"--keep"}).ok());
  EXPECT_TRUE(v.keep);
  // There are no negative or explicit forms: a switch given means on.
  ExpectUsageError(Parse(v, {"--keep=true"}), "--keep takes no value");
  ExpectUsageError(Parse(v, {"--keep=false"}), "--keep takes no value");
  ExpectUsageError(Parse(v, {"--keep="}), "--keep takes no value");
  ExpectUsageError(Parse(v, {"--no-keep"}), "unknown flag --no-keep");
  // A switch does not swallow the next argument.
  Values w;
  absl::StatusOr<ParsedArgs> p = Parse(w, {"--keep", "text"});
  ASSERT_TRUE(p.ok());
  EXPECT_THAT(p->positional, ElementsAre("text"));
}

TEST(ParseFlagsTest, ErrorsNameTheFlag) {
  Values v;
  ExpectUsageError(Parse(v, {"--frobnicate", "1"}), "unknown flag --frobnicate");
  ExpectUsageError(Parse(v, {"--frobnicate"}, {.command = "generate"}),
                   "unknown flag --frobnicate for generate");
  ExpectUsageError(Parse(v, {"--count"}), "--count needs a value");
  ExpectUsageError(Parse(v, {"--count", "0"}), "--count: must be at least 1 (got \"0\")");
  ExpectUsageError(Parse(v, {"--count", "-3"}), "--count: must not be negative");
  ExpectUsageError(Parse(v, {"--count", "ten"}), "--count: expected a non-negative integer");
  ExpectUsageError(Parse(v, {"--ratio", "2048"}), "--ratio: out of range, at most 1024");
  ExpectUsageError(Parse(v, {"--gb", "-1"}), "--gb: must be at least 0");
  ExpectUsageError(Parse(v, {"--temperature", "warm"}), "--temperature: expected a number");
  ExpectUsageError(Parse(v, {"--grace", "-2"}), "--grace: must be at least 0");
  ExpectUsageError(Parse(v, {"--budget", "lots"}), "--budget: expected a byte size");
  ExpectUsageError(Parse(v, {"--kv", "f16"}), "--kv: expected f32 or int8 (got \"f16\")");
  ExpectUsageError(Parse(v, {"--mode", "qsa"}), "--mode: expected exact or o1");
  ExpectUsageError(Parse(v, {"--non-empty", ""}), "--non-empty: empty value");
  ExpectUsageError(Parse(v, {"--stop="}), "--stop: empty value");
  ExpectUsageError(Parse(v, {"--batches", "1,0"}), "--batches: must be at least 1");
  ExpectUsageError(Parse(v, {"--peers", "nohost"}), "--peers: expected H:P (got \"nohost\")");
}

TEST(ParseFlagsTest, TheFirstErrorStopsTheScan) {
  Values v;
  ExpectUsageError(Parse(v, {"--count", "2", "--kv", "bad", "--name", "late"}), "--kv");
  EXPECT_EQ(v.count, 2u);
  EXPECT_EQ(v.name, "default");
}

TEST(ParseFlagsTest, RequiredAndRefusedFlags) {
  std::string model;
  bool tls = false;
  const std::vector<Flag> flags = {
      StringFlag("model", &model).Required(),
      Flag::Refused("server", "is a global flag: put it before the command"),
      SwitchFlag("tls", &tls),
  };
  ExpectUsageError(ParseFlags(flags, {}), "--model is required");
  ExpectUsageError(ParseFlags(flags, {"--tls"}), "--model is required");
  ASSERT_TRUE(ParseFlags(flags, {"--model", ""}).ok());  // given (empty) is given
  ExpectUsageError(ParseFlags(flags, {"--model", "m", "--server", "h:1"}),
                   "--server is a global flag: put it before the command");
  ExpectUsageError(ParseFlags(flags, {"--model", "m", "--server=h:1"}),
                   "--server is a global flag");
}

TEST(ParseFlagsTest, JoinedTables) {
  // A shared group of flags plus a command's own, as the programs build them.
  bool keep = false;
  size_t count = 0;
  const std::vector<Flag> flags =
      JoinFlags({{SwitchFlag("keep", &keep)}, {IntFlag("count", &count)}, {}});
  ASSERT_EQ(flags.size(), 2u);
  ASSERT_TRUE(ParseFlags(flags, {"--count=3", "--keep"}).ok());
  EXPECT_TRUE(keep);
  EXPECT_EQ(count, 3u);
}

TEST(ParseFlagsTest, PositionalArgumentsInterleaved) {
  Values v;
  absl::StatusOr<ParsedArgs> p = Parse(v, {"one", "--count", "2", "-", "two"});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->positional, ElementsAre("one", "-", "two"));  // a lone `-` is positional
  EXPECT_EQ(v.count, 2u);
  // `--` ends the flags.
  p = Parse(v, {"--count", "3", "--", "--count", "-x"});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->positional, ElementsAre("--count", "-x"));
  EXPECT_EQ(v.count, 3u);
}

TEST(ParseFlagsTest, PositionalArgumentsAsACommand) {
  Values v;
  absl::StatusOr<ParsedArgs> p = Parse(v, {"--count", "4", "generate", "--count", "9", "x"},
                                       {.positionals = Positionals::kCommand});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->positional, ElementsAre("generate", "--count", "9", "x"));  // unparsed
  EXPECT_EQ(v.count, 4u);
  p = Parse(v, {"--keep"}, {.positionals = Positionals::kCommand});
  ASSERT_TRUE(p.ok());
  EXPECT_THAT(p->positional, IsEmpty());
}

TEST(ParseFlagsTest, NoPositionalArguments) {
  Values v;
  const ParseOptions none = {.positionals = Positionals::kNone};
  ExpectUsageError(Parse(v, {"--count", "2", "stray"}, none), "unexpected argument 'stray'");
  ExpectUsageError(Parse(v, {"--", "stray"}, none), "unexpected argument 'stray'");
  EXPECT_TRUE(Parse(v, {"--count", "2", "--"}, none).ok());
}

TEST(ParseFlagsTest, HelpWinsBeforeDoubleDash) {
  for (const Args& args : {Args{"--help"}, Args{"-h"}, Args{"--count", "0", "--help"},
                           Args{"--bogus", "-h"}, Args{"cmd", "--kv", "bad", "--help"}}) {
    Values v;
    absl::StatusOr<ParsedArgs> p = Parse(v, args, {.positionals = Positionals::kCommand});
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_TRUE(p->help) << args[0];
    EXPECT_TRUE(HelpRequested(args));
    EXPECT_EQ(v.count, 7u);  // nothing else was parsed
  }
  Values v;
  absl::StatusOr<ParsedArgs> p = Parse(v, {"--", "--help"});
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->help);
  EXPECT_THAT(p->positional, ElementsAre("--help"));
  EXPECT_FALSE(HelpRequested({"x", "--", "-h"}));
}

TEST(ParseFlagsTest, ParsingIsRepeatable) {
  // Tests (and sub-commands) parse many command lines in one process.
  for (int i = 0; i < 3; ++i) {
    Values v;
    ASSERT_TRUE(Parse(v, {"--count", std::to_string(i + 1)}).ok());
    EXPECT_EQ(v.count, static_cast<size_t>(i + 1));
  }
}

TEST(ReportUsageErrorTest, ExitStatusTwo) {
  ::testing::internal::CaptureStderr();
  const int rc = ReportUsageError("prog", absl::InvalidArgumentError("--port: expected a number"));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, 2);
  EXPECT_EQ(rc, kExitUsage);
  EXPECT_EQ(err, "prog: --port: expected a number\nrun 'prog --help' for usage\n");
}

}  // namespace
}  // namespace cortiq::util
