// O1Override (see the header for the contract).
//
// Seal, per KV group g: regroup the trace into the group's per-head [t × d]
// query blocks, NystromState::NewGroup + PrefillGroup over the group's stored
// K/V. Only when EVERY group is built does the override take the states and
// free the trace, so a failure part-way changes nothing.
#include "core/kv/o1_override.h"

#include "core/kv/o1_config.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/kv/kv_check.h"
#include "core/kv/kv_rows.h"

namespace cortiq::kv {
namespace {

absl::Status SealRefused(const std::string& why) {
  return absl::FailedPreconditionError(
      absl::StrCat("o1 seal refused (the layer stays exact): ", why));
}

}  // namespace

absl::StatusOr<O1Override> O1Override::Collect(size_t head_dim, size_t m, size_t w, size_t sink,
                                               O1Rect rect) {
  CORTIQ_KV_CHECK(head_dim > 0);
  if (m < kO1MinLandmarks) {
    return absl::InvalidArgumentError(absl::StrCat("O1Begin: m = ", m, " < ", kO1MinLandmarks));
  }
  if (w < kO1MinWindow) {
    return absl::InvalidArgumentError(absl::StrCat("O1Begin: w must be at least ", kO1MinWindow));
  }
  if (rect != O1Rect::kAggregate && rect != O1Rect::kFm) {
    return absl::InvalidArgumentError("O1Begin: unknown rectifier");
  }
  O1Override o;
  o.settings_ = {.head_dim = head_dim, .m = m, .w = w, .sink = sink, .rect = rect};
  return o;
}

absl::StatusOr<O1Override> O1Override::FromStates(std::vector<NystromState> states,
                                                  size_t num_kv_heads, size_t head_dim,
                                                  size_t positions) {
  const size_t H = num_kv_heads, D = head_dim;
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
    if (absorbed != positions) {
      return bad(absl::StrCat("absorbed ", absorbed,
                              " positions (sink + window + far), seq_len is ", positions));
    }
  }
  O1Override o;
  o.settings_ = {.head_dim = D,
                 .m = g0.m,
                 .w = g0.w,
                 .sink = g0.sink,
                 .rect = states[0].heads().empty() ? kO1DefaultRect : states[0].heads()[0].rect};
  o.sealed_ = true;
  o.num_heads_ = hpk * H;
  o.positions_ = positions;
  o.states_ = std::move(states);
  return o;
}

O1Override O1Override::Copy() const {
  O1Override o;
  o.settings_ = settings_;
  o.sealed_ = sealed_;
  o.trace_.reserve(trace_.capacity());  // same bytes, same growth
  o.trace_.assign(trace_.begin(), trace_.end());
  o.trace_heads_ = trace_heads_;
  o.trace_rows_ = trace_rows_;
  o.num_heads_ = num_heads_;
  o.positions_ = positions_;
  o.states_.reserve(states_.capacity());
  for (const NystromState& st : states_) o.states_.push_back(st.Copy());
  return o;
}

// ---------------------------------------------------------------------------
// Collecting.

void O1Override::PushQ(std::span<const float> q_all) {
  CORTIQ_KV_CHECK(!sealed_);
  CORTIQ_KV_CHECK(!q_all.empty() && q_all.size() % settings_.head_dim == 0);
  const size_t heads = q_all.size() / settings_.head_dim;
  if (trace_rows_ == 0) trace_heads_ = heads;
  CORTIQ_KV_CHECK(heads == trace_heads_);
  const size_t need = trace_.size() + q_all.size();
  if (trace_.capacity() < need) {
    // Doubling (amortised, never per token): a power of two of rows, as
    // the request plan projects (NextPow2 of the prompt's positions).
    trace_.reserve(std::max(need, 2 * trace_.capacity()));
  }
  trace_.insert(trace_.end(), q_all.begin(), q_all.end());
  ++trace_rows_;
}

void O1Override::TruncateTrace(size_t rows) {
  CORTIQ_KV_CHECK(!sealed_);
  if (trace_rows_ <= rows) return;
  // Trace row p is the queries of position p: drop the rolled-back ones.
  trace_rows_ = rows;
  trace_.resize(rows * trace_heads_ * settings_.head_dim);  // keeps capacity
}

absl::Status O1Override::Seal(size_t num_heads, const KvRows& rows) {
  CORTIQ_KV_CHECK(!sealed_ && rows.head_dim() == settings_.head_dim);
  const size_t H = rows.num_kv_heads(), D = settings_.head_dim, t = rows.seq_len();
  if (rows.mode() != KvMode::kF32) {
    return SealRefused(
        absl::StrCat("the KV rows are ", KvModeName(rows.mode()), "; the seal needs f32 rows"));
  }
  if (num_heads == 0 || num_heads % H != 0) {
    return SealRefused(absl::StrCat("a GQA fan-out that does not divide: ", num_heads,
                                    " query heads over ", H, " KV heads"));
  }
  if (t == 0) return SealRefused("the prompt is empty");
  if (trace_rows_ != t) {
    return SealRefused(
        absl::StrCat("the query trace holds ", trace_rows_, " of the ", t, " stored positions"));
  }
  if (trace_heads_ != num_heads) {
    return SealRefused(absl::StrCat("the query trace has ", trace_heads_,
                                    " heads per position, the layer ", num_heads));
  }
  for (size_t g = 0; g < H; ++g) {
    if (rows.HeadLen(g) != t) {
      return SealRefused(
          absl::StrCat("KV head ", g, " stored ", rows.HeadLen(g), " of ", t,
                       " positions (a dead head; the seal needs every group dense)"));
    }
  }

  // Build every group's state first; keep nothing until all succeeded.
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
        std::memcpy(dst + r * D, trace_.data() + (r * num_heads + head) * D, D * sizeof(float));
      }
      qs[j] = {dst, t * D};
    }
    NystromState st = NystromState::NewGroup(settings_.m, settings_.w, settings_.sink, hpk)
                          .WithRect(settings_.rect);
    const HeadRowsView kv = rows.Head(g);
    absl::Status s = st.PrefillGroup(qs, kv.keys, kv.values, t, D, D);
    if (!s.ok()) return SealRefused(absl::StrCat("group ", g, ": ", s.message()));
    states.push_back(std::move(st));
  }

  trace_ = std::vector<float>();  // frees the trace's capacity
  trace_rows_ = 0;
  trace_heads_ = 0;
  num_heads_ = num_heads;
  positions_ = t;
  states_ = std::move(states);
  sealed_ = true;
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Sealed.

void O1Override::Step(std::span<const float> q_all, std::span<const float> k_new,
                      std::span<const float> v_new, size_t num_heads, std::span<float> out) {
  CORTIQ_KV_CHECK(sealed_);
  const size_t H = states_.size(), D = settings_.head_dim;
  CORTIQ_KV_CHECK(num_heads == num_heads_);
  CORTIQ_KV_CHECK(q_all.size() == num_heads * D && out.size() == num_heads * D);
  CORTIQ_KV_CHECK(k_new.size() == H * D && v_new.size() == H * D);
  const size_t hpk = num_heads / H;
  for (size_t g = 0; g < H; ++g) {
    const absl::Status s =
        states_[g].StepGroup(q_all.subspan(g * hpk * D, hpk * D), k_new.subspan(g * D, D),
                             v_new.subspan(g * D, D), out.subspan(g * hpk * D, hpk * D));
    CORTIQ_KV_CHECK(s.ok());  // sizes were checked above; anything else is a bug
  }
  ++positions_;
}

std::optional<std::vector<O1DeviceView>> O1Override::Views() const {
  CORTIQ_KV_CHECK(sealed_);
  std::vector<O1DeviceView> views;
  views.reserve(states_.size());
  for (const NystromState& st : states_) {
    if (st.ExactOnly()) return std::nullopt;
    views.push_back(st.DeviceView());
  }
  return views;
}

size_t O1Override::MemoryBytes() const {
  size_t bytes = trace_.capacity() * sizeof(float);
  bytes += states_.capacity() * sizeof(NystromState);
  for (const NystromState& st : states_) bytes += st.MemoryBytes();
  return bytes;
}

}  // namespace cortiq::kv
