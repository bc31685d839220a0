#include "core/attention/exact_attention.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/math/kernels.h"
#include "core/util/status_macros.h"

namespace cortiq::attention {
namespace {

// Causal attention of a long prefill block as tiled matrix products: per KV
// group and tile of query rows, scores = Q·Kᵀ and out = P·V through
// math::MatMul instead of one Dot/Axpy pass per row. int8 rows are widened
// to f32 per tile (exact) and their scales applied where the row kernels
// apply them: logit = (scale_k · q·k) · scale, and each probability times
// scale_v before P·V (AxpyI8's alpha).
void AttendCausalTiled(const kv::LayerKvCache& cache, const AttentionRows& rows,
                       AttentionContext& ctx) {
  const AttentionGeometry& geo = ctx.geometry;
  const size_t hd = geo.head_dim, nq = geo.num_q_heads, nkv = geo.num_kv_heads,
               hpk = geo.heads_per_kv();
  const size_t count = rows.count;
  const size_t start = cache.seq_len() - count;  // the block's rows are the last `count`
  const float scale = geo.scale;
  const bool i8 = cache.mode() == kv::KvMode::kInt8;
  const size_t tile = kTiledAttentionTile;
  const size_t n_tiles = (count + tile - 1) / tile;
  // Tiles cost in proportion to their last position: interleave cheap and
  // dear ones (0, n-1, 1, n-2, ...) so the pool's contiguous ranges balance.
  ctx.scratch.ParallelFor(ctx.pool, n_tiles * nkv, [&](size_t begin, size_t end, ScratchSlot& sl) {
    for (size_t task = begin; task < end; ++task) {
      const size_t k = task / nkv, g = task % nkv;
      const size_t ti = (k % 2 == 0) ? k / 2 : n_tiles - 1 - k / 2;
      const size_t i0 = ti * tile, i1 = std::min(count, i0 + tile);
      const size_t m = (i1 - i0) * hpk;  // query vectors in the tile
      const size_t n = start + i1;       // keys visible to the tile's last row
      float* qbuf = ScratchSlot::Grow(sl.q, m * hd);
      float* sbuf = ScratchSlot::Grow(sl.s, m * n);
      float* vtbuf = ScratchSlot::Grow(sl.vt, hd * n);
      float* obuf = ScratchSlot::Grow(sl.o, m * hd);
      // Q tile, contiguous: row (i, j) = query head g·hpk + j of block row i.
      for (size_t i = i0; i < i1; ++i) {
        std::memcpy(qbuf + (i - i0) * hpk * hd, rows.q + (i * nq + g * hpk) * hd,
                    hpk * hd * sizeof(float));
      }
      // Scores [m × n] = Q · Kᵀ (K rows are the nn.Linear layout [n × hd]).
      const kv::HeadRowsView head = cache.HeadRows(g);
      const float* keys = head.keys.data();
      if (i8) {  // widened into Vᵀ's buffer, free until P · V
        const int8_t* k8 = head.keys_i8.data();
        for (size_t e = 0; e < n * hd; ++e) vtbuf[e] = float(k8[e]);
        keys = vtbuf;
      }
      const math::WeightView kw{keys, math::DType::kF32, n, hd};
      math::MatMul(qbuf, m, kw, sbuf, nullptr);
      // Causal softmax per query vector: row i sees keys [0, start + i].
      for (size_t r = 0; r < m; ++r) {
        const size_t i = i0 + r / hpk;
        float* sr = sbuf + r * n;
        const size_t vis = start + i + 1;
        if (i8) {
          const float* sk = head.key_scales.data();
          for (size_t t = 0; t < vis; ++t) sr[t] = (sk[t] * sr[t]) * scale;
        } else {
          for (size_t t = 0; t < vis; ++t) sr[t] *= scale;
        }
        math::Softmax(sr, vis);
        if (i8) {
          const float* sv = head.value_scales.data();
          for (size_t t = 0; t < vis; ++t) sr[t] *= sv[t];
        }
        std::fill(sr + vis, sr + n, 0.0f);
      }
      // Out [m × hd] = P · V, V transposed once per tile ([hd × n]).
      if (i8) {
        const int8_t* v = head.values_i8.data();
        for (size_t t = 0; t < n; ++t) {
          for (size_t e = 0; e < hd; ++e) vtbuf[e * n + t] = float(v[t * hd + e]);
        }
      } else {
        const float* v = head.values.data();
        for (size_t t = 0; t < n; ++t) {
          for (size_t e = 0; e < hd; ++e) vtbuf[e * n + t] = v[t * hd + e];
        }
      }
      const math::WeightView vw{vtbuf, math::DType::kF32, hd, n};
      math::MatMul(sbuf, m, vw, obuf, nullptr);
      for (size_t i = i0; i < i1; ++i) {
        std::memcpy(rows.out + (i * nq + g * hpk) * hd, obuf + (i - i0) * hpk * hd,
                    hpk * hd * sizeof(float));
      }
    }
  });
}

}  // namespace

void AppendRows(kv::LayerKvCache& cache, const AttentionRows& rows, const AttentionGeometry& g) {
  const size_t w = g.kv_width();
  for (size_t r = 0; r < rows.count; ++r) cache.Append({rows.k + r * w, w}, {rows.v + r * w, w});
}

void AttendGroupTask(const kv::LayerKvCache& cache, const AttentionRows& rows, size_t r, size_t g,
                     size_t hidden_after, const AttentionGeometry& geometry, ScratchSlot& slot) {
  const size_t hd = geometry.head_dim, nq = geometry.num_q_heads, hpk = geometry.heads_per_kv();
  const size_t visible = cache.HeadLen(g) - hidden_after;
  kv::AttendOptions opt;
  opt.scale = geometry.scale;
  opt.end = visible;
  float* probs = ScratchSlot::Grow(slot.scores, cache.GroupProbsSize(hpk));
  cache.AttendGroup({rows.q + (r * nq + g * hpk) * hd, hpk * hd}, g, hpk,
                    {rows.out + (r * nq + g * hpk) * hd, hpk * hd}, {probs, hpk * visible},
                    /*imp_acc=*/{}, opt);
}

void AttendCausal(const kv::LayerKvCache& cache, const AttentionRows& rows, AttentionContext& ctx) {
  if (rows.count >= kTiledAttentionMinRows && !cache.O1Sealed() && !cache.HasDeadHeads()) {
    AttendCausalTiled(cache, rows, ctx);
    return;
  }
  // One task per (row, KV group). Rows cost in proportion to their
  // position and the pool hands out contiguous ranges: task order
  // interleaves the cheapest and the dearest rows (0, n-1, 1, n-2, ...) so
  // each thread gets an equal share of the work.
  const size_t count = rows.count, nkv = ctx.geometry.num_kv_heads;
  ctx.scratch.ParallelFor(ctx.pool, count * nkv, [&](size_t begin, size_t end, ScratchSlot& sl) {
    for (size_t t = begin; t < end; ++t) {
      const size_t k = t / nkv, g = t % nkv;
      const size_t r = (k % 2 == 0) ? k / 2 : count - 1 - k / 2;
      AttendGroupTask(cache, rows, r, g, /*hidden_after=*/count - 1 - r, ctx.geometry, sl);
    }
  });
}

// ------------------------------------------------------------ CacheAttention

CacheAttention::CacheAttention(const AttentionGeometry& geometry, kv::KvMode mode, size_t layer,
                               bool accepts_sealed)
    : geometry_(geometry),
      layer_(layer),
      cache_(geometry.num_kv_heads, geometry.head_dim, mode),
      accepts_sealed_(accepts_sealed) {}

absl::Status CacheAttention::CanTruncate(size_t n) const {
  if (n > cache_.seq_len()) {
    return absl::InvalidArgumentError(
        absl::StrCat("truncate: ", n, " positions requested, the layer holds ", cache_.seq_len()));
  }
  if (cache_.O1Sealed()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "truncate: layer ", layer_, " runs the sealed O(1) kernel, which cannot roll back"));
  }
  return absl::OkStatus();
}

void CacheAttention::TruncateLast(size_t n) {
  const absl::Status st = cache_.TruncateLast(n);
  (void)st;  // CanTruncate checked the one refusal (sealed)
}

absl::Status CacheAttention::InstallCache(kv::LayerKvCache cache, size_t positions) {
  if (cache.seq_len() != positions) {
    return absl::InvalidArgumentError(
        absl::StrCat(cache.seq_len(), " positions, the session ", positions));
  }
  if (cache.O1Sealed() && !accepts_sealed_) {
    return absl::InvalidArgumentError(
        absl::StrCat("sealed O(1) state on a layer the session runs ", std::string(name())));
  }
  cache_ = std::move(cache);
  return absl::OkStatus();
}

// ------------------------------------------------------------ ExactAttention

ExactAttention::ExactAttention(const AttentionGeometry& geometry, kv::KvMode mode, size_t layer)
    : CacheAttention(geometry, mode, layer, /*accepts_sealed=*/false) {}

std::string_view ExactAttention::name() const {
  return cache_.mode() == kv::KvMode::kInt8 ? "exact_int8" : "exact_f32";
}

absl::Status ExactAttention::Prefill(const AttentionRows& rows, AttentionContext& ctx) {
  AppendRows(cache_, rows, geometry_);
  AttendCausal(cache_, rows, ctx);
  return absl::OkStatus();
}

absl::StatusOr<size_t> ExactAttention::BeginDecode(const AttentionRows& row, AttentionContext&) {
  AppendRows(cache_, row, geometry_);
  return geometry_.num_kv_heads;
}

void ExactAttention::DecodeTask(const AttentionRows& row, size_t task, ScratchSlot& slot) {
  AttendGroupTask(cache_, row, 0, task, 0, geometry_, slot);
}

MemoryByKind ExactAttention::Memory() const {
  MemoryByKind m;
  m[RowsKind(cache_.mode())] = cache_.MemoryBytes();
  return m;
}

std::unique_ptr<LayerAttentionState> ExactAttention::Copy() const {
  auto out = std::make_unique<ExactAttention>(geometry_, cache_.mode(), layer_);
  out->cache_ = cache_.Copy();
  return out;
}

}  // namespace cortiq::attention
