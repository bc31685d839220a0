// LayerKvCache: the O(1) Nyström override of seeds 001/002 (see the header
// for the contract; the exact cache lives in layer_kv_cache.cc).
//
// Life of an override:
//   O1Begin      o1_ = {settings, collecting}
//   O1PushQ      trace += one row of rotated queries [num_heads × head_dim]
//   O1Seal       per KV group g: regroup the trace into the group's per-head
//                [t × d] query blocks, NystromState::NewGroup + PrefillGroup
//                over the group's stored K/V; only when EVERY group is built
//                are the exact rows and the trace freed (a failure part-way
//                leaves the layer exact, K/V untouched)
//   O1Step       StepGroup per group, ++seq_len_
//
// Ownership: the states live in o1_ (one per KV group, [num_kv_heads]); the
// trace is freed at the seal. Threading: as the rest of LayerKvCache — the
// mutating calls need exclusive access; O1Views / O1States / O1MemoryBytes
// are const and touch no member state.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/kv/layer_kv_cache.h"

namespace cortiq::kv {
namespace {

// Programmer-invariant check, always on (as in layer_kv_cache.cc): a wrong
// span size here would read or write past a caller's buffer.
[[noreturn]] void O1CheckFailed(const char* cond, const char* file, int line) {
  std::fprintf(stderr, "%s:%d: LayerKvCache check failed: %s\n", file, line, cond);
  std::abort();
}
#define CORTIQ_O1_CHECK(cond)                              \
  do {                                                     \
    if (!(cond)) O1CheckFailed(#cond, __FILE__, __LINE__); \
  } while (0)

absl::Status SealRefused(const std::string& why) {
  return absl::FailedPreconditionError(
      absl::StrCat("o1 seal refused (the layer stays exact): ", why));
}

}  // namespace

absl::Status LayerKvCache::O1Begin(size_t m, size_t w, size_t sink, O1Rect rect) {
  if (O1Sealed()) return absl::FailedPreconditionError("O1Begin: the layer is already sealed");
  if (seq_len_ != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("O1Begin: the cache already holds ", seq_len_,
                     " positions; query collection starts on a cleared cache"));
  }
  if (m < 4) return absl::InvalidArgumentError(absl::StrCat("O1Begin: m = ", m, " < 4"));
  if (w < 1) return absl::InvalidArgumentError("O1Begin: w must be at least 1");
  if (rect != O1Rect::kAggregate && rect != O1Rect::kFm) {
    return absl::InvalidArgumentError("O1Begin: unknown rectifier");
  }
  internal::LayerO1State& o = o1_.emplace();
  o.m = m;
  o.w = w;
  o.sink = sink;
  o.rect = rect;
  return absl::OkStatus();
}

void LayerKvCache::O1PushQ(std::span<const float> q_all) {
  if (!O1Collecting()) return;
  internal::LayerO1State& o = *o1_;
  CORTIQ_O1_CHECK(!q_all.empty() && q_all.size() % head_dim_ == 0);
  const size_t heads = q_all.size() / head_dim_;
  if (o.trace_rows == 0) o.trace_heads = heads;
  CORTIQ_O1_CHECK(heads == o.trace_heads);
  const size_t need = o.trace.size() + q_all.size();
  if (o.trace.capacity() < need) {
    // Follow the exact cache: the caller reserved capacity_ positions for
    // this prompt; past that, double (amortised, never per token).
    o.trace.reserve(std::max({need, capacity_ * q_all.size(), 2 * o.trace.capacity()}));
  }
  o.trace.insert(o.trace.end(), q_all.begin(), q_all.end());
  ++o.trace_rows;
}

absl::Status LayerKvCache::O1Seal(size_t num_heads) {
  if (O1Sealed()) return absl::FailedPreconditionError("o1 seal: the layer is already sealed");
  if (!o1_.has_value()) {
    return SealRefused("no query trace (O1Begin was not called on this prompt pass)");
  }
  // Every refusal below drops the trace: a layer that cannot seal now never
  // will for this prompt, and a trace left collecting would grow forever.
  auto refuse = [this](const std::string& why) {
    o1_.reset();
    return SealRefused(why);
  };
  const internal::LayerO1State& o = *o1_;
  const size_t H = num_kv_heads_, D = head_dim_, t = seq_len_;
  if (mode_ != KvMode::kF32) {
    return refuse(absl::StrCat("the KV rows are ", KvModeName(mode_), "; the seal needs f32 rows"));
  }
  if (num_heads == 0 || num_heads % H != 0) {
    return refuse(absl::StrCat("a GQA fan-out that does not divide: ", num_heads,
                               " query heads over ", H, " KV heads"));
  }
  if (t == 0) return refuse("the prompt is empty");
  if (o.trace_rows != t) {
    return refuse(
        absl::StrCat("the query trace holds ", o.trace_rows, " of the ", t, " stored positions"));
  }
  if (o.trace_heads != num_heads) {
    return refuse(absl::StrCat("the query trace has ", o.trace_heads, " heads per position, the ",
                               "layer ", num_heads));
  }
  for (size_t g = 0; g < H; ++g) {
    if (HeadLen(g) != t) {
      return refuse(absl::StrCat("KV head ", g, " stored ", HeadLen(g), " of ", t,
                                 " positions (a dead head; the seal needs every group dense)"));
    }
  }

  // Build every group's state first; free nothing until all succeeded.
  const size_t hpk = num_heads / H;
  std::vector<NystromState> states;
  states.reserve(H);
  std::vector<float> qbuf(hpk * t * D);  // [hpk][t][D]: this group's query blocks
  std::vector<std::span<const float>> qs(hpk);
  for (size_t g = 0; g < H; ++g) {
    for (size_t j = 0; j < hpk; ++j) {
      const size_t head = g * hpk + j;
      float* dst = qbuf.data() + j * t * D;
      for (size_t r = 0; r < t; ++r) {
        std::memcpy(dst + r * D, o.trace.data() + (r * num_heads + head) * D, D * sizeof(float));
      }
      qs[j] = {dst, t * D};
    }
    NystromState st = NystromState::NewGroup(o.m, o.w, o.sink, hpk).WithRect(o.rect);
    absl::Status s = st.PrefillGroup(qs, HeadKeys(g), HeadValues(g), t, D, D);
    if (!s.ok()) return refuse(absl::StrCat("group ", g, ": ", s.message()));
    states.push_back(std::move(st));
  }

  FreeExactStorage();
  internal::LayerO1State& ov = *o1_;
  ov.trace = std::vector<float>();  // frees the trace's capacity
  ov.trace_rows = 0;
  ov.trace_heads = 0;
  ov.num_heads = num_heads;
  ov.states = std::move(states);
  ov.sealed = true;
  return absl::OkStatus();
}

void LayerKvCache::O1Step(std::span<const float> q_all, std::span<const float> k_new,
                          std::span<const float> v_new, size_t num_heads, std::span<float> out) {
  CORTIQ_O1_CHECK(O1Sealed());
  internal::LayerO1State& o = *o1_;
  const size_t H = num_kv_heads_, D = head_dim_;
  CORTIQ_O1_CHECK(num_heads == o.num_heads);
  CORTIQ_O1_CHECK(q_all.size() == num_heads * D && out.size() == num_heads * D);
  CORTIQ_O1_CHECK(k_new.size() == H * D && v_new.size() == H * D);
  const size_t hpk = num_heads / H;
  for (size_t g = 0; g < H; ++g) {
    const absl::Status s =
        o.states[g].StepGroup(q_all.subspan(g * hpk * D, hpk * D), k_new.subspan(g * D, D),
                              v_new.subspan(g * D, D), out.subspan(g * hpk * D, hpk * D));
    CORTIQ_O1_CHECK(s.ok());  // sizes were checked above; anything else is a bug
  }
  ++seq_len_;
}

std::optional<std::vector<O1DeviceView>> LayerKvCache::O1Views() const {
  if (!O1Sealed()) return std::nullopt;
  std::vector<O1DeviceView> views;
  views.reserve(o1_->states.size());
  for (const NystromState& st : o1_->states) {
    if (st.ExactOnly()) return std::nullopt;
    views.push_back(st.DeviceView());
  }
  return views;
}

size_t LayerKvCache::O1MemoryBytes() const {
  if (!o1_.has_value()) return 0;
  size_t bytes = o1_->trace.capacity() * sizeof(float);
  bytes += o1_->states.capacity() * sizeof(NystromState);
  for (const NystromState& st : o1_->states) bytes += st.MemoryBytes();
  return bytes;
}

std::span<const NystromState> LayerKvCache::O1States() const {
  if (!O1Sealed()) return {};
  return o1_->states;
}

absl::Status LayerKvCache::O1Install(std::vector<NystromState> states, size_t seq_len) {
  if (o1_.has_value() || seq_len_ != 0) {
    return absl::FailedPreconditionError(
        "O1Install: the layer must be empty (no positions, no O(1) override)");
  }
  if (mode_ != KvMode::kF32) {
    return absl::FailedPreconditionError(absl::StrCat(
        "O1Install: the layer stores ", KvModeName(mode_),
        " rows; only an f32 layer can be sealed, so only an f32 layer takes sealed states"));
  }
  const size_t H = num_kv_heads_, D = head_dim_;
  if (states.size() != H) {
    return absl::InvalidArgumentError(
        absl::StrCat("O1Install: ", states.size(), " group states for ", H, " KV heads"));
  }
  const NystromGroup& g0 = states[0].group();
  const size_t hpk = states[0].NumQHeads();
  for (size_t g = 0; g < H; ++g) {
    const NystromState& st = states[g];
    const NystromGroup& gr = st.group();
    auto bad = [g](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat("O1Install: group ", g, ": ", why));
    };
    if (!st.Prefilled()) return bad("not prefilled");
    if (gr.d != D || gr.dv != D) {
      return bad(absl::StrCat("d = ", gr.d, ", dv = ", gr.dv, "; the layer's head_dim is ", D));
    }
    if (st.NumQHeads() != hpk) {
      return bad(absl::StrCat(st.NumQHeads(), " query heads, group 0 has ", hpk));
    }
    if (gr.m != g0.m || gr.w != g0.w || gr.sink != g0.sink || gr.exact_only != g0.exact_only) {
      return bad("m, w, sink or the exact-only mode differs from group 0");
    }
    const size_t absorbed = gr.sink_len + gr.win_len + (st.NumQHeads() ? st.FarLen(0) : 0);
    if (absorbed != seq_len) {
      return bad(absl::StrCat("absorbed ", absorbed,
                              " positions (sink + window + far), seq_len is ", seq_len));
    }
  }
  FreeExactStorage();
  internal::LayerO1State& o = o1_.emplace();
  o.m = g0.m;
  o.w = g0.w;
  o.sink = g0.sink;
  o.rect = states[0].heads().empty() ? kO1DefaultRect : states[0].heads()[0].rect;
  o.num_heads = hpk * H;
  o.states = std::move(states);
  o.sealed = true;
  seq_len_ = seq_len;
  return absl::OkStatus();
}

}  // namespace cortiq::kv
