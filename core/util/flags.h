// Command-line flags: the one parser of cortiq-server, the `cortiq` client and
// cortiq-tool. A program declares its flags once, as a table of typed
// bindings (each flag writes straight into a variable the caller owns), and
// ParseFlags() scans argv against that table.
//
// Syntax (the same in every program):
//   --name value, --name=value   a flag with a value (the value may start with
//                                `-`: `--temperature -1`); single-letter names
//                                are spelled `-o value` (no `-o=value`)
//   --name                       a switch (SwitchFlag); `--name=...` is an
//                                error. There is no `--no-name` and no
//                                `--name=false`: a switch given means on, its
//                                default is off. A program that needs a
//                                negative switch declares it by that name
//                                (`--no-special`).
//   --help, -h                   anywhere before `--`: ParsedArgs::help, and
//                                nothing else is checked (help wins)
//   --                           ends the flags; what follows is positional
//   anything else                a positional argument (`-` alone included)
// A flag given twice: the last value wins, except RepeatedStringFlag (each
// occurrence appends).
//
// Errors are INVALID_ARGUMENT whose message names the flag as spelled:
//   "unknown flag --frobnicate" (+ " for COMMAND" when ParseOptions::command)
//   "--max-tokens needs a value", "--keep takes no value", "--model is required"
//   "--max-tokens: must be at least 1 (got \"0\")"
//   "--n: out of range, at most 4294967295 (got \"4294967296\")"
//   "--kv: expected f32 or int8 (got \"f16\")"
// Nothing throws. A program reports a usage error with ReportUsageError()
// (message, a hint, exit status 2) and prints its usage for --help (exit 0).
//
// Why not Abseil's flags library (in Debian's package): ABSL_FLAG is one
// global registry per process, parsed once from main(); the client and the
// tool have sub-commands with different flags (and the same name with
// different meanings: `generate --max-tokens` vs the server's), and tests
// parse many command lines in one process. A table bound to local variables
// has neither problem and keeps every parse a pure function of its arguments.
//
// Cost: ParseFlags is O(args x flags) (tables are tens of flags); it allocates
// the returned positional list. Flags bind raw pointers: the variables must
// outlive the ParseFlags call, nothing more. Thread-compatible: a table is
// only read by ParseFlags; parse one table from one thread at a time because
// the bound variables are written.
//
// Example:
//   size_t threads = 0;
//   std::chrono::milliseconds grace{10'000};
//   std::string kv = "f32";
//   std::optional<size_t> ratio;  // set only when given
//   const std::vector<util::Flag> flags = {
//       util::IntFlag("threads", &threads),
//       util::SecondsFlag("grace", &grace),
//       util::ChoiceFlag("kv", &kv, {"f32", "int8"}),
//       util::IntFlag("qsa-ratio", &ratio, {.min = 1}),
//   };
//   absl::StatusOr<util::ParsedArgs> parsed = util::ParseFlags(flags, args);
//   if (!parsed.ok()) return util::ReportUsageError("cortiq-server", parsed.status());
//   if (parsed->help) { std::fputs(kUsage, stdout); return 0; }
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace cortiq::util {

// The exit status of a usage error, in every program.
inline constexpr int kExitUsage = 2;

// An inclusive range of accepted values; the defaults are the type's limits.
template <typename T>
struct Range {
  T min = std::numeric_limits<T>::lowest();
  T max = std::numeric_limits<T>::max();
};

namespace flags_internal {
template <typename T>
struct ValueOf {
  using type = T;
};
template <typename T>
struct ValueOf<std::optional<T>> {
  using type = T;
};
}  // namespace flags_internal

// A flag binds a variable of type T or std::optional<T> (set only when the
// flag is given); FlagValue<D> is that T.
template <typename D>
using FlagValue = typename flags_internal::ValueOf<D>::type;

// ---------------------------------------------------------------------------
// Value parsers. Each takes the flag as spelled ("--top-k") for its message,
// accepts the whole value or nothing (no surrounding spaces, no `+`, no hex),
// and returns INVALID_ARGUMENT "FLAG: PROBLEM (got "VALUE")".

// The one error shape of every value error.
absl::Status FlagValueError(std::string_view flag, std::string_view problem,
                            std::string_view value);

namespace flags_internal {
absl::StatusOr<int64_t> ParseSigned(std::string_view flag, std::string_view value,
                                    Range<int64_t> range);
absl::StatusOr<uint64_t> ParseUnsigned(std::string_view flag, std::string_view value,
                                       Range<uint64_t> range);
absl::StatusOr<double> ParseDouble(std::string_view flag, std::string_view value,
                                   Range<double> range);
// The trimmed items of a comma-separated list; an empty one is an error.
absl::StatusOr<std::vector<std::string_view>> SplitListFlag(std::string_view flag,
                                                            std::string_view value,
                                                            std::string_view item);
}  // namespace flags_internal

// A decimal integer in `range`. A `-` where the range has no negative values
// is "must not be negative"; below the range "must be at least MIN"; above it
// (or past the type) "out of range, at most MAX".
template <typename T>
requires(std::integral<T> && !std::same_as<T, bool>) absl::StatusOr<T> ParseIntFlag(
    std::string_view flag, std::string_view value, Range<T> range = {}) {
  if constexpr (std::is_signed_v<T>) {
    absl::StatusOr<int64_t> v = flags_internal::ParseSigned(flag, value, {range.min, range.max});
    if (!v.ok()) return v.status();
    return static_cast<T>(*v);
  } else {
    absl::StatusOr<uint64_t> v = flags_internal::ParseUnsigned(flag, value, {range.min, range.max});
    if (!v.ok()) return v.status();
    return static_cast<T>(*v);
  }
}

// A finite decimal number ("0.7", "1e-3", "-2") in `range` (default: every
// finite T, so a float flag refuses 1e39 as "out of range").
template <typename T>
requires std::floating_point<T> absl::StatusOr<T> ParseNumberFlag(std::string_view flag,
                                                                  std::string_view value,
                                                                  Range<T> range = {}) {
  absl::StatusOr<double> v = flags_internal::ParseDouble(
      flag, value, {static_cast<double>(range.min), static_cast<double>(range.max)});
  if (!v.ok()) return v.status();
  return static_cast<T>(*v);
}

// Non-negative decimal seconds, at most 1e9, rounded to milliseconds; a
// positive value never rounds down to 0 ("0.0001" -> 1 ms), because 0 often
// means "none" (no deadline, no TTL).
absl::StatusOr<std::chrono::milliseconds> ParseSecondsFlag(std::string_view flag,
                                                           std::string_view value);

// A byte size: a non-negative number (fractions allowed) with an optional
// K/M/G/T suffix (powers of 1024, either case), at most 1e18: "512M", "1.5G".
absl::StatusOr<size_t> ParseBytesFlag(std::string_view flag, std::string_view value);

// The index of `value` in `choices`; else "expected A, B or C".
absl::StatusOr<size_t> ParseChoiceFlag(std::string_view flag, std::string_view value,
                                       const std::vector<std::string>& choices);

// "1,2,3": a non-empty comma-separated list of integers in `range`;
// whitespace around each item is allowed. `item` names one item in errors
// ("--tokens: empty id at position 2").
template <typename T>
requires(std::integral<T> && !std::same_as<T, bool>)
    absl::StatusOr<std::vector<T>> ParseIntListFlag(std::string_view flag, std::string_view value,
                                                    std::string_view item, Range<T> range = {}) {
  absl::StatusOr<std::vector<std::string_view>> items =
      flags_internal::SplitListFlag(flag, value, item);
  if (!items.ok()) return items.status();
  std::vector<T> out;
  out.reserve(items->size());
  for (std::string_view piece : *items) {
    absl::StatusOr<T> v = ParseIntFlag<T>(flag, piece, range);
    if (!v.ok()) return v.status();
    out.push_back(*v);
  }
  return out;
}

// ---------------------------------------------------------------------------
// The table.

class Flag {
 public:
  // Parses `value` (the flag spelled as given, for messages) into the bound
  // variable. Switches are called with an empty value.
  using Setter = std::function<absl::Status(std::string_view flag, std::string_view value)>;

  enum class Kind { kValue, kSwitch, kRefused };

  // Prefer the factories below; these are their building blocks.
  static Flag Value(std::string name, Setter set);
  static Flag Switch(std::string name, Setter set);
  // A name that is refused with "--NAME REASON" (a flag that belongs elsewhere).
  static Flag Refused(std::string name, std::string reason);

  // Parsing fails with "--NAME is required" unless the flag is given.
  Flag Required() &&;

  const std::string& name() const { return name_; }  // without dashes: "max-tokens", "o"
  Kind kind() const { return kind_; }
  bool required() const { return required_; }
  const std::string& reason() const { return reason_; }
  const Setter& setter() const { return set_; }

 private:
  Flag(std::string name, Kind kind, Setter set, std::string reason);

  std::string name_;
  Kind kind_;
  Setter set_;
  std::string reason_;
  bool required_ = false;
};

// "--name", or "-n" for a single-letter name.
std::string SpelledFlag(std::string_view name);

// Binds `out` through `parse(flag, value) -> absl::StatusOr<FlagValue<D>>`,
// one of the parsers above or the program's own (it must name the flag).
template <typename D, typename Parse>
Flag BoundFlag(std::string name, D* out, Parse parse) {
  return Flag::Value(std::move(name),
                     [out, parse = std::move(parse)](std::string_view flag,
                                                     std::string_view value) -> absl::Status {
                       absl::StatusOr<FlagValue<D>> v = parse(flag, value);
                       if (!v.ok()) return v.status();
                       *out = *std::move(v);
                       return absl::OkStatus();
                     });
}

// A program's own value syntax: `parse(value)` returns the value or an error
// describing the problem; the message becomes "--NAME: PROBLEM (got "VALUE")".
template <typename D, typename Parse>
Flag ParsedFlag(std::string name, D* out, Parse parse) {
  return BoundFlag(
      std::move(name), out,
      [parse = std::move(parse)](std::string_view flag,
                                 std::string_view value) -> absl::StatusOr<FlagValue<D>> {
        auto v = parse(value);
        if (!v.ok()) {
          const absl::string_view problem = v.status().message();
          return FlagValueError(flag, {problem.data(), problem.size()}, value);
        }
        return *std::move(v);
      });
}

// Any string, "" included (`--token ""` clears a token from the environment).
template <typename D>
requires std::same_as<FlagValue<D>, std::string> Flag StringFlag(std::string name, D* out) {
  return BoundFlag(std::move(name), out,
                   [](std::string_view, std::string_view value) -> absl::StatusOr<std::string> {
                     return std::string(value);
                   });
}

// A string that must not be empty ("--session: empty value").
absl::StatusOr<std::string> ParseNonEmptyFlag(std::string_view flag, std::string_view value);
template <typename D>
requires std::same_as<FlagValue<D>, std::string> Flag NonEmptyStringFlag(std::string name, D* out) {
  return BoundFlag(std::move(name), out, ParseNonEmptyFlag);
}

// Every occurrence appends a non-empty value (`--stop A --stop B`).
Flag RepeatedStringFlag(std::string name, std::vector<std::string>* out);

// `--name`: sets *out to true.
Flag SwitchFlag(std::string name, bool* out);

template <typename D>
requires(std::integral<FlagValue<D>> && !std::same_as<FlagValue<D>, bool>) Flag
    IntFlag(std::string name, D* out, Range<FlagValue<D>> range = {}) {
  return BoundFlag(std::move(name), out, [range](std::string_view flag, std::string_view value) {
    return ParseIntFlag<FlagValue<D>>(flag, value, range);
  });
}

template <typename D>
requires std::floating_point<FlagValue<D>> Flag NumberFlag(std::string name, D* out,
                                                           Range<FlagValue<D>> range = {}) {
  return BoundFlag(std::move(name), out, [range](std::string_view flag, std::string_view value) {
    return ParseNumberFlag<FlagValue<D>>(flag, value, range);
  });
}

template <typename D>
requires std::same_as<FlagValue<D>, std::chrono::milliseconds> Flag SecondsFlag(std::string name,
                                                                                D* out) {
  return BoundFlag(std::move(name), out, ParseSecondsFlag);
}

template <typename D>
requires std::same_as<FlagValue<D>, size_t> Flag BytesFlag(std::string name, D* out) {
  return BoundFlag(std::move(name), out, ParseBytesFlag);
}

// One of `choices`, stored as the string itself.
template <typename D>
requires std::same_as<FlagValue<D>, std::string> Flag ChoiceFlag(std::string name, D* out,
                                                                 std::vector<std::string> choices) {
  return BoundFlag(
      std::move(name), out,
      [choices = std::move(choices)](std::string_view flag,
                                     std::string_view value) -> absl::StatusOr<std::string> {
        absl::StatusOr<size_t> i = ParseChoiceFlag(flag, value, choices);
        if (!i.ok()) return i.status();
        return choices[*i];
      });
}

// One of the names in `choices`, stored as the value paired with it (an enum,
// a bool): EnumFlag("kv", &mode, {{"f32", KvMode::kF32}, {"int8", KvMode::kInt8}}).
template <typename D>
Flag EnumFlag(std::string name, D* out, std::vector<std::pair<std::string, FlagValue<D>>> choices) {
  std::vector<std::string> names;
  for (const auto& c : choices) names.push_back(c.first);
  return BoundFlag(
      std::move(name), out,
      [names = std::move(names), choices = std::move(choices)](
          std::string_view flag, std::string_view value) -> absl::StatusOr<FlagValue<D>> {
        absl::StatusOr<size_t> i = ParseChoiceFlag(flag, value, names);
        if (!i.ok()) return i.status();
        return choices[*i].second;
      });
}

// A comma-separated list of integers (ParseIntListFlag); replaces *out.
template <typename T>
Flag IntListFlag(std::string name, std::vector<T>* out, std::string item, Range<T> range = {}) {
  return BoundFlag(std::move(name), out,
                   [item = std::move(item), range](std::string_view flag, std::string_view value) {
                     return ParseIntListFlag<T>(flag, value, item, range);
                   });
}

// One table from several (a program's shared groups of flags plus a
// command's own), in order.
std::vector<Flag> JoinFlags(std::initializer_list<std::vector<Flag>> tables);

// ---------------------------------------------------------------------------
// Parsing.

enum class Positionals {
  kNone,         // a positional argument is an error ("unexpected argument 'x'")
  kInterleaved,  // flags and positional arguments in any order
  kCommand,      // the first positional argument ends the flags: it (the
                 // command) and everything after it are returned unparsed
};

struct ParseOptions {
  std::string_view command = {};  // named in "unknown flag --x for COMMAND"; "" = none
  Positionals positionals = Positionals::kInterleaved;
};

struct ParsedArgs {
  bool help = false;                    // --help / -h: nothing else was parsed
  std::vector<std::string> positional;  // in order
  std::vector<std::string> given;       // names of the flags given, in order, repeats kept

  bool Given(std::string_view name) const;
};

// Applies `flags` to `args` (argv without the program name) in order; the
// first error stops the scan (variables set before it keep their values).
absl::StatusOr<ParsedArgs> ParseFlags(const std::vector<Flag>& flags,
                                      const std::vector<std::string>& args,
                                      const ParseOptions& options = {});

// True when --help or -h comes before any `--` (what ParseFlags reports as
// ParsedArgs::help), for a dispatcher that must know before it picks a table.
bool HelpRequested(const std::vector<std::string>& args);

// Prints "PROGRAM: MESSAGE" and "run 'PROGRAM --help' for usage" to stderr;
// returns kExitUsage.
int ReportUsageError(std::string_view program, const absl::Status& status);

}  // namespace cortiq::util
