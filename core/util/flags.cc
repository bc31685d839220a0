// Command-line flags: see flags.h.
#include "core/util/flags.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/util/strings.h"

namespace cortiq::util {

absl::Status FlagValueError(std::string_view flag, std::string_view problem,
                            std::string_view value) {
  return absl::InvalidArgumentError(
      absl::StrCat(Sv(flag), ": ", Sv(problem), " (got \"", Sv(value), "\")"));
}

namespace flags_internal {
namespace {

bool StartsWithMinus(std::string_view value) { return !value.empty() && value[0] == '-'; }

// The range checks shared by every number type.
template <typename T>
absl::Status CheckRange(std::string_view flag, std::string_view value, T v, Range<T> range) {
  if (v < range.min)
    return FlagValueError(flag, absl::StrCat("must be at least ", range.min), value);
  if (v > range.max) {
    return FlagValueError(flag, absl::StrCat("out of range, at most ", range.max), value);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int64_t> ParseSigned(std::string_view flag, std::string_view value,
                                    Range<int64_t> range) {
  if (StartsWithMinus(value) && range.min >= 0) {
    return FlagValueError(flag, "must not be negative", value);
  }
  int64_t out = 0;
  const char* end = value.data() + value.size();
  auto [ptr, ec] = std::from_chars(value.data(), end, out);
  if (ec == std::errc::result_out_of_range) {
    return StartsWithMinus(value)
               ? FlagValueError(flag, absl::StrCat("must be at least ", range.min), value)
               : FlagValueError(flag, absl::StrCat("out of range, at most ", range.max), value);
  }
  if (ec != std::errc() || ptr != end) return FlagValueError(flag, "expected an integer", value);
  if (absl::Status s = CheckRange(flag, value, out, range); !s.ok()) return s;
  return out;
}

absl::StatusOr<uint64_t> ParseUnsigned(std::string_view flag, std::string_view value,
                                       Range<uint64_t> range) {
  if (StartsWithMinus(value)) return FlagValueError(flag, "must not be negative", value);
  uint64_t out = 0;
  const char* end = value.data() + value.size();
  auto [ptr, ec] = std::from_chars(value.data(), end, out);
  if (ec == std::errc::result_out_of_range) {
    return FlagValueError(flag, absl::StrCat("out of range, at most ", range.max), value);
  }
  if (ec != std::errc() || ptr != end) {
    return FlagValueError(flag, "expected a non-negative integer", value);
  }
  if (absl::Status s = CheckRange(flag, value, out, range); !s.ok()) return s;
  return out;
}

absl::StatusOr<double> ParseDouble(std::string_view flag, std::string_view value,
                                   Range<double> range) {
  double out = 0;
  const char* end = value.data() + value.size();
  auto [ptr, ec] = std::from_chars(value.data(), end, out);
  if (ec == std::errc::result_out_of_range) return FlagValueError(flag, "out of range", value);
  if (ec != std::errc() || ptr != end) return FlagValueError(flag, "expected a number", value);
  if (!std::isfinite(out)) return FlagValueError(flag, "must be a finite number", value);
  if (absl::Status s = CheckRange(flag, value, out, range); !s.ok()) return s;
  return out;
}

absl::StatusOr<std::vector<std::string_view>> SplitListFlag(std::string_view flag,
                                                            std::string_view value,
                                                            std::string_view item) {
  std::vector<std::string_view> items;
  for (absl::string_view piece : absl::StrSplit(Sv(value), ',')) {
    piece = absl::StripAsciiWhitespace(piece);
    if (piece.empty()) {
      return FlagValueError(
          flag, absl::StrCat("empty ", Sv(item), " at position ", items.size() + 1), value);
    }
    items.emplace_back(piece.data(), piece.size());
  }
  return items;
}

}  // namespace flags_internal

absl::StatusOr<std::chrono::milliseconds> ParseSecondsFlag(std::string_view flag,
                                                           std::string_view value) {
  // 1e9 s (31 years) keeps the milliseconds far inside int64.
  absl::StatusOr<double> seconds = flags_internal::ParseDouble(flag, value, {.min = 0, .max = 1e9});
  if (!seconds.ok()) return seconds.status();
  auto ms = std::chrono::milliseconds(std::llround(*seconds * 1000.0));
  if (*seconds > 0 && ms.count() == 0) ms = std::chrono::milliseconds(1);
  return ms;
}

absl::StatusOr<size_t> ParseBytesFlag(std::string_view flag, std::string_view value) {
  std::string_view number = value;
  double multiplier = 1;
  if (!number.empty()) {
    switch (absl::ascii_toupper(static_cast<unsigned char>(number.back()))) {
      case 'K':
        multiplier = 0x1p10;
        break;
      case 'M':
        multiplier = 0x1p20;
        break;
      case 'G':
        multiplier = 0x1p30;
        break;
      case 'T':
        multiplier = 0x1p40;
        break;
      default:
        break;
    }
    if (multiplier != 1) number.remove_suffix(1);
  }
  double d = 0;
  const char* end = number.data() + number.size();
  auto [ptr, ec] = std::from_chars(number.data(), end, d);
  if (number.empty() || number[0] == '-' || ec != std::errc() || ptr != end || !std::isfinite(d) ||
      d * multiplier > 1e18) {
    return FlagValueError(flag, "expected a byte size (e.g. 512M, 8G)", value);
  }
  return static_cast<size_t>(d * multiplier);
}

absl::StatusOr<size_t> ParseChoiceFlag(std::string_view flag, std::string_view value,
                                       const std::vector<std::string>& choices) {
  for (size_t i = 0; i < choices.size(); ++i) {
    if (value == choices[i]) return i;
  }
  std::string list;
  for (size_t i = 0; i < choices.size(); ++i) {
    absl::StrAppend(&list, i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ", choices[i]);
  }
  return FlagValueError(flag, absl::StrCat("expected ", list), value);
}

absl::StatusOr<std::string> ParseNonEmptyFlag(std::string_view flag, std::string_view value) {
  if (value.empty()) return FlagValueError(flag, "empty value", value);
  return std::string(value);
}

Flag::Flag(std::string name, Kind kind, Setter set, std::string reason)
    : name_(std::move(name)), kind_(kind), set_(std::move(set)), reason_(std::move(reason)) {}

Flag Flag::Value(std::string name, Setter set) {
  return Flag(std::move(name), Kind::kValue, std::move(set), "");
}

Flag Flag::Switch(std::string name, Setter set) {
  return Flag(std::move(name), Kind::kSwitch, std::move(set), "");
}

Flag Flag::Refused(std::string name, std::string reason) {
  return Flag(std::move(name), Kind::kRefused, nullptr, std::move(reason));
}

Flag Flag::Required() && {
  required_ = true;
  return std::move(*this);
}

std::string SpelledFlag(std::string_view name) {
  return absl::StrCat(name.size() == 1 ? "-" : "--", Sv(name));
}

Flag RepeatedStringFlag(std::string name, std::vector<std::string>* out) {
  return Flag::Value(std::move(name), [out](std::string_view flag, std::string_view value) {
    absl::StatusOr<std::string> v = ParseNonEmptyFlag(flag, value);
    if (!v.ok()) return v.status();
    out->push_back(*std::move(v));
    return absl::OkStatus();
  });
}

Flag SwitchFlag(std::string name, bool* out) {
  return Flag::Switch(std::move(name), [out](std::string_view, std::string_view) {
    *out = true;
    return absl::OkStatus();
  });
}

std::vector<Flag> JoinFlags(std::initializer_list<std::vector<Flag>> tables) {
  std::vector<Flag> all;
  for (const std::vector<Flag>& t : tables) all.insert(all.end(), t.begin(), t.end());
  return all;
}

bool ParsedArgs::Given(std::string_view name) const {
  for (const std::string& g : given) {
    if (g == name) return true;
  }
  return false;
}

bool HelpRequested(const std::vector<std::string>& args) {
  for (const std::string& arg : args) {
    if (arg == "--") return false;
    if (arg == "--help" || arg == "-h") return true;
  }
  return false;
}

namespace {

// `-x` / `--name` (a lone `-` is a positional argument: stdin, by convention).
bool LooksLikeFlag(std::string_view arg) { return arg.size() > 1 && arg[0] == '-'; }

const Flag* FindFlag(const std::vector<Flag>& flags, std::string_view spelled) {
  for (const Flag& f : flags) {
    if (SpelledFlag(f.name()) == spelled) return &f;
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<ParsedArgs> ParseFlags(const std::vector<Flag>& flags,
                                      const std::vector<std::string>& args,
                                      const ParseOptions& options) {
  ParsedArgs parsed;
  if (HelpRequested(args)) {
    parsed.help = true;
    return parsed;
  }
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (!LooksLikeFlag(arg)) {
      if (options.positionals == Positionals::kCommand) break;
      if (options.positionals == Positionals::kNone) {
        return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
      }
      parsed.positional.push_back(arg);
      continue;
    }
    // `--name=value`; a single-dash flag never carries its value inline.
    std::string_view spelled = arg;
    std::optional<std::string_view> inline_value;
    if (const size_t eq = spelled.find('='); spelled.starts_with("--") && eq != spelled.npos) {
      inline_value = spelled.substr(eq + 1);
      spelled = spelled.substr(0, eq);
    }
    const Flag* flag = FindFlag(flags, spelled);
    if (flag == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", Sv(spelled),
                                                     options.command.empty() ? "" : " for ",
                                                     Sv(options.command)));
    }
    switch (flag->kind()) {
      case Flag::Kind::kRefused:
        return absl::InvalidArgumentError(absl::StrCat(Sv(spelled), " ", flag->reason()));
      case Flag::Kind::kSwitch:
        if (inline_value.has_value()) {
          return absl::InvalidArgumentError(absl::StrCat(Sv(spelled), " takes no value"));
        }
        if (absl::Status s = flag->setter()(spelled, ""); !s.ok()) return s;
        break;
      case Flag::Kind::kValue: {
        if (!inline_value.has_value()) {
          if (i + 1 >= args.size()) {
            return absl::InvalidArgumentError(absl::StrCat(Sv(spelled), " needs a value"));
          }
          inline_value = args[++i];
        }
        if (absl::Status s = flag->setter()(spelled, *inline_value); !s.ok()) return s;
        break;
      }
    }
    parsed.given.push_back(flag->name());
  }
  // After `--` (or, for a command, from the command on): all positional.
  if (i < args.size() && options.positionals == Positionals::kNone) {
    return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", args[i], "'"));
  }
  parsed.positional.insert(parsed.positional.end(), args.begin() + static_cast<std::ptrdiff_t>(i),
                           args.end());
  for (const Flag& f : flags) {
    if (f.required() && !parsed.Given(f.name())) {
      return absl::InvalidArgumentError(absl::StrCat(SpelledFlag(f.name()), " is required"));
    }
  }
  return parsed;
}

int ReportUsageError(std::string_view program, const absl::Status& status) {
  const std::string text = absl::StrCat(Sv(program), ": ", status.message(), "\nrun '", Sv(program),
                                        " --help' for usage\n");
  std::fputs(text.c_str(), stderr);
  return kExitUsage;
}

}  // namespace cortiq::util
