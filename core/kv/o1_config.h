// O(1)-attention configuration: which layers run the streaming Nyström kernel
// (core/kv/nystrom.h) and with which {m, w, sink, rect}. Runtime-only — the
// checkpoint format is untouched; a model's config.json may carry a hint.
//
// Every source is a set of optional overrides (O1Overrides). Each field is
// resolved independently, first source that sets it wins:
//
//   request field > server flag > environment (CMF_O1*) > model hint > default
//
// Defaults are the validated setting m=32, w=128, sink=4, Aggregate. Every
// source's m and w are checked against the kernel's minimums
// (kO1MinLandmarks, kO1MinWindow): a value below is an InvalidArgument error
// naming the field and the minimum, never raised silently.
// A layer spec of `off` at any level disables the kernel even if a lower
// source (typically the model hint) enables it. The model hint cannot pin
// the rectifier: it is a property of the kernel, not of the weights.
//
// Layer specs (ASCII case-insensitive keywords, surrounding spaces ignored):
//   all        every layer
//   deepN      the N deepest layers, 1 ≤ N ≤ num_layers
//   i,j,k      explicit indices < num_layers (duplicates collapse)
//   off|none|0 no layer (the escape hatch; note a bare "0" means off, as in
//              the seed — select layer 0 alone with "0,0")
// Anything else ("deep", "deep0", "1,,2", "x", "-1", an index out of range)
// is an InvalidArgument error naming the source and the spec, never a silent
// default.
//
// All functions are pure (EnvOverrides reads the environment through the
// function it is given) and thread-safe.
//
// Example:
//   CORTIQ_ASSIGN_OR_RETURN(O1Overrides env, EnvOverrides());
//   CORTIQ_ASSIGN_OR_RETURN(O1Overrides hint, O1HintFromModelConfig(config_json));
//   CORTIQ_ASSIGN_OR_RETURN(O1Config cfg,
//       ResolveO1Config(request, flags, env, hint, num_layers));
//   if (cfg.IsO1Layer(layer)) { auto st = NystromState::NewGroup(cfg.m, cfg.w, cfg.sink, g); }
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "core/kv/nystrom.h"
#include "nlohmann/json_fwd.hpp"

namespace cortiq::kv {

// Validated defaults (seed: m=32, W=128, sink=4; sink ablation ×2.39).
inline constexpr size_t kO1DefaultM = 32;
inline constexpr size_t kO1DefaultW = 128;
inline constexpr size_t kO1DefaultSink = 4;

// The kernel's minimums (NystromState's invariants): the landmark budget m
// needs 4 segments for a well-posed skeleton, the exact window w at least one
// key. The one definition every check of an O(1) setting compares against.
inline constexpr size_t kO1MinLandmarks = 4;
inline constexpr size_t kO1MinWindow = 1;

// One source's say. Unset fields fall through to the next source.
struct O1Overrides {
  std::optional<std::string> layers;  // raw layer spec, checked by ResolveO1Config
  std::optional<size_t> m;            // landmark budget
  std::optional<size_t> w;            // exact-window width
  std::optional<size_t> sink;         // permanent exact sink keys
  std::optional<O1Rect> rect;         // ignored when it comes from the model hint

  bool operator==(const O1Overrides&) const = default;
};

// The resolved setting for one model.
struct O1Config {
  std::vector<size_t> layers;  // sorted, unique layer indices running the kernel; empty = off
  size_t m = kO1DefaultM;
  size_t w = kO1DefaultW;
  size_t sink = kO1DefaultSink;
  O1Rect rect = kO1DefaultRect;

  bool Enabled() const { return !layers.empty(); }
  // O(log layers).
  bool IsO1Layer(size_t layer) const;
  // e.g. "o1: layers=[26,27] m=32 w=128 sink=4 rect=aggregate" or "o1: off".
  std::string DebugString() const;
};

// InvalidArgument "<m_field>: 2 is below the minimum 4" (resp. w_field and
// kO1MinWindow) unless m ≥ kO1MinLandmarks and w ≥ kO1MinWindow; an unset
// value passes. The field names are the caller's (a request field, a flag,
// an environment variable).
absl::Status CheckO1Minimums(std::optional<size_t> m, std::optional<size_t> w,
                             std::string_view m_field, std::string_view w_field);

// Parses a layer spec against a model of num_layers layers: the sorted,
// unique indices (empty for off), or InvalidArgument naming the spec.
absl::StatusOr<std::vector<size_t>> ParseLayerSpec(std::string_view spec, size_t num_layers);

// Parses a rectifier name: "agg" | "aggregate" | "fm".
absl::StatusOr<O1Rect> ParseO1Rect(std::string_view spec);

// Reads CMF_O1 (layer spec; set-but-empty means off), CMF_O1_M,
// CMF_O1_WINDOW, CMF_O1_SINK (non-negative integers) and CMF_O1_RECT through
// `getenv` (nullptr = unset). Malformed values are InvalidArgument naming the
// variable; the layer spec's syntax is checked here, its range and the
// minimums of CMF_O1_M / CMF_O1_WINDOW at resolve.
absl::StatusOr<O1Overrides> EnvOverrides(absl::FunctionRef<const char*(const char*)> getenv);
// Same, from the process environment.
absl::StatusOr<O1Overrides> EnvOverrides();

// The hint in a model's config.json: an optional top-level object
//   "o1_attn": {"layers": "all" | "deepN" | "i,j,k" | "off" | [i, j, ...],
//               "m": N, "w": N, "sink": N}
// No "o1_attn" key gives empty overrides; a malformed one is InvalidArgument
// (m and w are checked against the minimums at resolve).
// A "rect" key is ignored (with a warning): the file cannot pin the
// rectifier. Other keys are ignored.
absl::StatusOr<O1Overrides> O1HintFromModelConfig(const nlohmann::json& config);

// Resolves the four sources field by field (see the banner). The m and w of
// every source, winning or not, are checked against the minimums:
// InvalidArgument naming the field as its source spells it ("CMF_O1_M: 2 is
// below the minimum 4", "--o1-window: ...", "config.json o1_attn.m: ...").
absl::StatusOr<O1Config> ResolveO1Config(const O1Overrides& request, const O1Overrides& flags,
                                         const O1Overrides& env, const O1Overrides& hint,
                                         size_t num_layers);

}  // namespace cortiq::kv
