// O(1)-attention configuration (see o1_config.h). Parsing is strict: every
// malformed value is an error that names its source, where the seed fell
// back silently (an env typo used to switch the kernel off unnoticed).
#include "core/kv/o1_config.h"

#include <algorithm>
#include <cstdlib>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/util/status_macros.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace cortiq::kv {
namespace {

// Debian's Abseil is built with its own absl::string_view (not an alias of
// std::string_view); the public API speaks std::string_view.
absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }
std::string_view Std(absl::string_view s) { return std::string_view(s.data(), s.size()); }
std::string Trim(std::string_view s) { return std::string(absl::StripAsciiWhitespace(Absl(s))); }
std::string TrimLower(std::string_view s) { return absl::AsciiStrToLower(Trim(s)); }

// A layer spec before it meets a model (syntax only).
struct LayerSpec {
  enum class Kind { kOff, kAll, kDeep, kList };
  Kind kind = Kind::kOff;
  size_t deep = 0;           // kDeep: N
  std::vector<size_t> list;  // kList: indices as written
};

// A non-negative decimal integer: digits only, no sign, no overflow.
std::optional<size_t> ParseCount(std::string_view s) {
  if (s.empty() || s.size() > 18) return std::nullopt;
  size_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<size_t>(c - '0');
  }
  return v;
}

absl::Status SpecError(std::string_view spec, std::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("o1 layer spec '", Absl(spec), "': ", Absl(why),
                                                 " (expected all | deepN | i,j,k | off)"));
}

absl::StatusOr<LayerSpec> ParseLayerSyntax(std::string_view raw) {
  const std::string s = TrimLower(raw);
  LayerSpec spec;
  if (s == "off" || s == "none" || s == "0") return spec;
  if (s.empty()) return SpecError(raw, "empty");
  if (s == "all") {
    spec.kind = LayerSpec::Kind::kAll;
    return spec;
  }
  if (s.rfind("deep", 0) == 0) {
    const std::string_view count = std::string_view{s}.substr(4);
    std::optional<size_t> n = ParseCount(count);
    if (!n) return SpecError(raw, "deepN needs a layer count N");
    if (*n == 0) return SpecError(raw, "deep0 selects no layer; write 'off' to disable");
    spec.kind = LayerSpec::Kind::kDeep;
    spec.deep = *n;
    return spec;
  }
  spec.kind = LayerSpec::Kind::kList;
  for (absl::string_view part : absl::StrSplit(s, ',')) {
    const std::string p = Trim(Std(part));
    std::optional<size_t> idx = ParseCount(p);
    if (!idx) return SpecError(raw, absl::StrCat("'", p, "' is not a layer index"));
    spec.list.push_back(*idx);
  }
  return spec;
}

absl::Status WithSource(const absl::Status& st, std::string_view source) {
  return absl::Status(st.code(), absl::StrCat(Absl(source), ": ", st.message()));
}

// First source (in precedence order) that sets the field.
template <typename T>
std::optional<T> First(std::initializer_list<const std::optional<T>*> sources) {
  for (const std::optional<T>* s : sources) {
    if (s->has_value()) return *s;
  }
  return std::nullopt;
}

}  // namespace

bool O1Config::IsO1Layer(size_t layer) const {
  return std::binary_search(layers.begin(), layers.end(), layer);
}

std::string O1Config::DebugString() const {
  if (!Enabled()) return "o1: off";
  return absl::StrCat("o1: layers=[", absl::StrJoin(layers, ","), "] m=", m, " w=", w,
                      " sink=", sink, " rect=", O1RectName(rect));
}

absl::Status CheckO1Minimums(std::optional<size_t> m, std::optional<size_t> w,
                             std::string_view m_field, std::string_view w_field) {
  auto below = [](std::string_view field, size_t v, size_t minimum) {
    return absl::InvalidArgumentError(
        absl::StrCat(Absl(field), ": ", v, " is below the minimum ", minimum));
  };
  if (m && *m < kO1MinLandmarks) return below(m_field, *m, kO1MinLandmarks);
  if (w && *w < kO1MinWindow) return below(w_field, *w, kO1MinWindow);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<size_t>> ParseLayerSpec(std::string_view spec, size_t num_layers) {
  CORTIQ_ASSIGN_OR_RETURN(LayerSpec parsed, ParseLayerSyntax(spec));
  std::vector<size_t> layers;
  switch (parsed.kind) {
    case LayerSpec::Kind::kOff:
      break;
    case LayerSpec::Kind::kAll:
      for (size_t i = 0; i < num_layers; ++i) layers.push_back(i);
      break;
    case LayerSpec::Kind::kDeep:
      if (parsed.deep > num_layers) {
        return SpecError(spec, absl::StrCat("the model has only ", num_layers, " layers"));
      }
      for (size_t i = num_layers - parsed.deep; i < num_layers; ++i) layers.push_back(i);
      break;
    case LayerSpec::Kind::kList:
      for (size_t i : parsed.list) {
        if (i >= num_layers) {
          return SpecError(spec, absl::StrCat("layer ", i, " is out of range (the model has ",
                                              num_layers, " layers)"));
        }
      }
      layers = parsed.list;
      std::sort(layers.begin(), layers.end());
      layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
      break;
  }
  return layers;
}

absl::StatusOr<O1Rect> ParseO1Rect(std::string_view spec) {
  const std::string s = TrimLower(spec);
  if (s == "agg" || s == "aggregate") return O1Rect::kAggregate;
  if (s == "fm") return O1Rect::kFm;
  return absl::InvalidArgumentError(
      absl::StrCat("o1 rectifier '", Absl(spec), "': expected agg | aggregate | fm"));
}

absl::StatusOr<O1Overrides> EnvOverrides(absl::FunctionRef<const char*(const char*)> getenv) {
  O1Overrides o;
  if (const char* v = getenv("CMF_O1")) {
    std::string spec = v;
    // Set-but-empty is the escape hatch, as in the seed: off.
    if (Trim(spec).empty()) spec = "off";
    absl::StatusOr<LayerSpec> parsed = ParseLayerSyntax(spec);
    if (!parsed.ok()) return WithSource(parsed.status(), "CMF_O1");
    o.layers = std::move(spec);
  }
  struct Count {
    const char* name;
    std::optional<size_t>* field;
  };
  for (const Count& c :
       {Count{"CMF_O1_M", &o.m}, Count{"CMF_O1_WINDOW", &o.w}, Count{"CMF_O1_SINK", &o.sink}}) {
    const char* v = getenv(c.name);
    if (v == nullptr) continue;
    std::optional<size_t> n = ParseCount(Trim(v));
    if (!n) {
      return absl::InvalidArgumentError(
          absl::StrCat(c.name, ": '", v, "' is not a non-negative integer"));
    }
    *c.field = *n;
  }
  if (const char* v = getenv("CMF_O1_RECT")) {
    absl::StatusOr<O1Rect> rect = ParseO1Rect(v);
    if (!rect.ok()) return WithSource(rect.status(), "CMF_O1_RECT");
    o.rect = *rect;
  }
  return o;
}

absl::StatusOr<O1Overrides> EnvOverrides() {
  return EnvOverrides([](const char* name) -> const char* { return std::getenv(name); });
}

absl::StatusOr<O1Overrides> O1HintFromModelConfig(const nlohmann::json& config) {
  O1Overrides o;
  if (!config.is_object()) return o;
  auto it = config.find("o1_attn");
  if (it == config.end() || it->is_null()) return o;
  const nlohmann::json& h = *it;
  auto err = [](std::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("config.json o1_attn: ", Absl(why)));
  };
  if (!h.is_object()) return err("must be an object");
  if (auto l = h.find("layers"); l != h.end()) {
    if (l->is_string()) {
      const std::string spec = l->get<std::string>();
      absl::StatusOr<LayerSpec> parsed = ParseLayerSyntax(spec);
      if (!parsed.ok()) return WithSource(parsed.status(), "config.json o1_attn.layers");
      o.layers = spec;
    } else if (l->is_array()) {
      if (l->empty()) return err("layers is an empty list (write \"off\" to disable)");
      std::vector<size_t> idx;
      for (const nlohmann::json& x : *l) {
        if (!x.is_number_unsigned()) return err("layers must hold non-negative integers");
        idx.push_back(x.get<size_t>());
      }
      std::string spec = absl::StrJoin(idx, ",");
      // A one-element list [0] must not read as the "0" = off keyword.
      if (idx.size() == 1) spec = absl::StrCat(spec, ",", spec);
      o.layers = std::move(spec);
    } else {
      return err("layers must be a string spec or a list of indices");
    }
  }
  struct Count {
    const char* key;
    std::optional<size_t>* field;
  };
  for (const Count& c : {Count{"m", &o.m}, Count{"w", &o.w}, Count{"sink", &o.sink}}) {
    auto v = h.find(c.key);
    if (v == h.end()) continue;
    if (!v->is_number_unsigned()) {
      return err(absl::StrCat(c.key, " must be a non-negative integer"));
    }
    *c.field = v->get<size_t>();
  }
  if (h.contains("rect")) {
    spdlog::warn(
        "config.json o1_attn.rect is ignored: the rectifier is a runtime setting "
        "(flag, request or CMF_O1_RECT), not a property of the weights");
  }
  return o;
}

absl::StatusOr<O1Config> ResolveO1Config(const O1Overrides& request, const O1Overrides& flags,
                                         const O1Overrides& env, const O1Overrides& hint,
                                         size_t num_layers) {
  O1Config cfg;
  struct Source {
    const char* name;
    const O1Overrides* o;
    const char* m_field;  // how the source spells its m and w
    const char* w_field;
  };
  const Source sources[] = {
      {"request", &request, "request o1.m", "request o1.window"},
      {"server flag", &flags, "--o1-m", "--o1-window"},
      {"CMF_O1", &env, "CMF_O1_M", "CMF_O1_WINDOW"},
      {"config.json o1_attn", &hint, "config.json o1_attn.m", "config.json o1_attn.w"}};
  for (const Source& s : sources) {
    CORTIQ_RETURN_IF_ERROR(CheckO1Minimums(s.o->m, s.o->w, s.m_field, s.w_field));
  }
  for (const Source& s : sources) {
    if (!s.o->layers.has_value()) continue;
    absl::StatusOr<std::vector<size_t>> layers = ParseLayerSpec(*s.o->layers, num_layers);
    if (!layers.ok()) return WithSource(layers.status(), s.name);
    cfg.layers = *std::move(layers);
    break;
  }
  // Checked above: the seed clamped m to ≥ 4 and w to ≥ 1 here, so a typo
  // in an operator's setting changed the kernel unnoticed.
  cfg.m = First<size_t>({&request.m, &flags.m, &env.m, &hint.m}).value_or(kO1DefaultM);
  cfg.w = First<size_t>({&request.w, &flags.w, &env.w, &hint.w}).value_or(kO1DefaultW);
  cfg.sink =
      First<size_t>({&request.sink, &flags.sink, &env.sink, &hint.sink}).value_or(kO1DefaultSink);
  // hint.rect deliberately absent: the file cannot pin the rectifier.
  cfg.rect = First<O1Rect>({&request.rect, &flags.rect, &env.rect}).value_or(kO1DefaultRect);
  return cfg;
}

}  // namespace cortiq::kv
