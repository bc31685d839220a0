// Typed wire refusals (see the header for the contract).
#include "core/kv/wire_refusal.h"

#include <array>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/types/optional.h"
#include "core/util/strings.h"

namespace cortiq::kv {

namespace {

// Indexed by WireRefusal; also the payload's bytes.
constexpr std::array<std::string_view, kNumWireRefusals> kNames = {
    "o1_collecting", "importance", "dead_heads", "int8_rows", "o1_overlay", "f16_range", "wire_version", "other"};
static_assert(static_cast<size_t>(WireRefusal::kOther) + 1 == kNumWireRefusals);

}  // namespace

std::string_view WireRefusalName(WireRefusal reason) {
  const size_t i = static_cast<size_t>(reason);
  return i < kNumWireRefusals ? kNames[i] : kNames.back();
}

absl::Status WireRefused(WireRefusal reason, absl::string_view message) {
  absl::Status st = absl::FailedPreconditionError(message);
  const std::string_view name = WireRefusalName(reason);
  st.SetPayload(util::Sv(kWireRefusalTypeUrl), absl::Cord(util::Sv(name)));
  return st;
}

std::optional<WireRefusal> WireRefusalOf(const absl::Status& status) {
  const absl::optional<absl::Cord> payload = status.GetPayload(util::Sv(kWireRefusalTypeUrl));
  if (!payload.has_value()) return std::nullopt;
  for (size_t i = 0; i < kNumWireRefusals; ++i) {
    const auto reason = static_cast<WireRefusal>(i);
    if (*payload == util::Sv(WireRefusalName(reason))) return reason;
  }
  return WireRefusal::kOther;
}

absl::Status PrefixStatus(absl::string_view prefix, const absl::Status& status) {
  if (status.ok()) return status;
  absl::Status out(status.code(), absl::StrCat(prefix, status.message()));
  status.ForEachPayload([&out](absl::string_view type_url, const absl::Cord& payload) {
    out.SetPayload(type_url, payload);
  });
  return out;
}

}  // namespace cortiq::kv
