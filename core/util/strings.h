// Abseil 20220623 (Debian 12) has its own absl::string_view, distinct from
// std::string_view; Sv() bridges the two for absl::StrCat and friends.
#pragma once

#include <string_view>

#include "absl/strings/string_view.h"

namespace cortiq::util {

inline absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace cortiq::util
