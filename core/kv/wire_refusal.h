// Why an export was refused, as a type: a wire exporter (LayerWireSource,
// LayerKvCache::ExportWire, session::SessionWireSource) that refuses state
// its format does not describe returns FailedPrecondition carrying a
// WireRefusal as an absl::Status payload. Whoever needs the reason (the
// server's metrics label) reads it with WireRefusalOf, never from the
// message text, which stays free to change.
//
// Contract
//   * The payload lives under kWireRefusalTypeUrl; its bytes are
//     WireRefusalName(reason) (stable, readable in a debugger or a log of
//     the payloads).
//   * A status that wraps a refusal (a session naming the layer) keeps the
//     payload: build it with PrefixStatus, never absl::Status(code, text).
//   * Costs: WireRefused and PrefixStatus allocate the status's message (and
//     the payload's few bytes); WireRefusalOf allocates nothing beyond
//     reading the payload. None of them is on a per-token path.
//
// Thread-safety: free functions over values; thread-safe.
//
// Example:
//   absl::StatusOr<std::string> blob = cache.ExportWire({.version = 1});
//   if (std::optional<WireRefusal> why = WireRefusalOf(blob.status())) {
//     metrics.CountExportRefused(*why);  // e.g. WireRefusal::kInt8Rows
//   }
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace cortiq::kv {

enum class WireRefusal : uint8_t {
  kO1Collecting,  // an O(1) query trace being collected (any version)
  kImportance,    // accumulated importance (any version)
  kDeadHeads,     // a head skipped positions: no version carries the alive log
  kInt8Rows,      // int8 rows, asked for in a version without them (1)
  kO1Overlay,     // a sealed O(1) layer, asked for in a version without O(1) state (1)
  kF16Range,      // f16 rows asked for, and a finite value is beyond f16's range
  kWireVersion,   // an attention state only a later session wire version carries (window: 3)
  kOther,  // never attached here: a consumer's bucket for a refusal without a reason it names
};
inline constexpr size_t kNumWireRefusals = 8;

// "o1_collecting", "importance", "dead_heads", "int8_rows", "o1_overlay",
// "f16_range", "wire_version", "other". O(1), static strings.
std::string_view WireRefusalName(WireRefusal reason);

// The payload's type URL.
inline constexpr std::string_view kWireRefusalTypeUrl = "type.googleapis.com/cortiq.kv.WireRefusal";

// FailedPrecondition with `message`, carrying `reason`.
absl::Status WireRefused(WireRefusal reason, absl::string_view message);

// The reason `status` carries: nullopt for OK or a status without the
// payload (it was not refused by a wire exporter); kOther for a payload this
// build does not name.
std::optional<WireRefusal> WireRefusalOf(const absl::Status& status);

// `status` with `prefix` before its message, the same code and every
// payload (a typed refusal survives the wrapping). OK stays OK.
absl::Status PrefixStatus(absl::string_view prefix, const absl::Status& status);

}  // namespace cortiq::kv
