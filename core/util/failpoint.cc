#include "core/util/failpoint.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace cortiq::util {
namespace {

const std::string& Armed() {
  static const std::string armed = [] {
    const char* v = std::getenv("CORTIQ_FAILPOINTS");
    return std::string(v == nullptr ? "" : v);
  }();
  return armed;
}

}  // namespace

void Failpoint(std::string_view name) {
  const std::string& armed = Armed();
  if (armed.empty()) return;
  std::string_view rest = armed;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view n = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (n == name) {
      std::fprintf(stderr, "failpoint %.*s: SIGKILL\n", static_cast<int>(name.size()), name.data());
      std::fflush(stderr);
      std::raise(SIGKILL);
    }
  }
}

}  // namespace cortiq::util
