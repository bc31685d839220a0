// LoadIndexerWeights (see the header).
#include "core/qsa/indexer_weights.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/util/status_macros.h"

namespace cortiq::qsa {
namespace {

size_t RoundUp64(size_t bytes) { return (bytes + 63) / 64 * 64; }

std::string Shape(const std::vector<int64_t>& s) { return "[" + absl::StrJoin(s, ", ") + "]"; }

absl::Status CheckShape(const std::string& name, const HostTensor& t,
                        std::initializer_list<int64_t> want) {
  if (t.shape != std::vector<int64_t>(want)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': shape ", Shape(t.shape),
                                                   " expected ",
                                                   Shape(std::vector<int64_t>(want))));
  }
  return absl::OkStatus();
}

std::vector<float> ToF32(const HostTensor& t, size_t offset_elems, size_t n) {
  std::vector<float> out(n);
  const auto* base = static_cast<const uint8_t*>(t.data) + offset_elems * math::DTypeSize(t.dtype);
  math::ConvertToF32(base, t.dtype, n, out.data());
  return out;
}

// Appends `rows` rows of `cols` elements, starting at row 0 of `t`, to `dst`
// in `dtype` (a byte copy when the dtypes agree).
void AppendRows(const HostTensor& t, size_t rows, size_t cols, math::DType dtype,
                std::vector<uint8_t>& dst) {
  const size_t n = rows * cols;
  const size_t old = dst.size();
  dst.resize(old + n * math::DTypeSize(dtype));
  if (t.dtype == dtype) {
    std::memcpy(dst.data() + old, t.data, n * math::DTypeSize(dtype));
  } else {  // dtype is f32 here (the mixed case converts both)
    math::ConvertToF32(t.data, t.dtype, n, reinterpret_cast<float*>(dst.data() + old));
  }
}

absl::StatusOr<IndexerWeights> FromCheckpoint(const TensorSource& src, size_t layer,
                                              const AttentionGeometry& g) {
  const std::string n_w = IndexerTensorName(layer, "qk_proj.weight");
  const std::string n_qn = IndexerTensorName(layer, "q_norm.weight");
  const std::string n_kn = IndexerTensorName(layer, "k_norm.weight");
  const std::string n_b = IndexerTensorName(layer, "qk_proj.bias");
  for (const std::string* n : {&n_w, &n_qn, &n_kn}) {
    if (!src.Has(*n)) {
      return absl::NotFoundError(absl::StrCat("layer ", layer, " has indexer tensors but not '", *n,
                                              "' (a partial indexer is refused)"));
    }
  }
  CORTIQ_ASSIGN_OR_RETURN(HostTensor qn, src.Get(n_qn));
  if (qn.shape.size() != 1 || qn.shape[0] <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", n_qn, "': shape ", Shape(qn.shape), " expected [hd]"));
  }
  const int64_t hd = qn.shape[0];
  CORTIQ_ASSIGN_OR_RETURN(HostTensor kn, src.Get(n_kn));
  CORTIQ_RETURN_IF_ERROR(CheckShape(n_kn, kn, {hd}));
  CORTIQ_ASSIGN_OR_RETURN(HostTensor w, src.Get(n_w));
  const int64_t hidden = static_cast<int64_t>(g.hidden);
  if (w.shape.size() != 2 || w.shape[1] != hidden || w.shape[0] % hd != 0 || w.shape[0] / hd < 2) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", n_w, "': shape ", Shape(w.shape),
                                                   " expected [(n_heads + 1) · ", hd, ", ", hidden,
                                                   "] with n_heads >= 1"));
  }
  IndexerWeights out;
  out.origin = IndexerOrigin::kCheckpoint;
  out.hd = static_cast<size_t>(hd);
  out.n_heads = static_cast<size_t>(w.shape[0] / hd - 1);
  out.hidden = g.hidden;
  out.dtype = w.dtype;
  AppendRows(w, static_cast<size_t>(w.shape[0]), g.hidden, w.dtype, out.qk_proj);
  out.q_norm = ToF32(qn, 0, out.hd);
  out.k_norm = ToF32(kn, 0, out.hd);
  if (src.Has(n_b)) {
    CORTIQ_ASSIGN_OR_RETURN(HostTensor b, src.Get(n_b));
    CORTIQ_RETURN_IF_ERROR(CheckShape(n_b, b, {w.shape[0]}));
    out.qk_bias = ToF32(b, 0, static_cast<size_t>(w.shape[0]));
  }
  return out;
}

absl::StatusOr<IndexerWeights> Derive(const TensorSource& src, size_t layer,
                                      const AttentionGeometry& g) {
  const std::string p = absl::StrCat("model.layers.", layer, ".self_attn.");
  const int64_t hidden = g.hidden, hd = g.head_dim, nq = g.num_q_heads, nkv = g.num_kv_heads;
  const size_t hpk = g.num_q_heads / g.num_kv_heads;
  CORTIQ_ASSIGN_OR_RETURN(HostTensor wq, src.Get(p + "q_proj.weight"));
  CORTIQ_RETURN_IF_ERROR(CheckShape(p + "q_proj.weight", wq, {nq * hd, hidden}));
  CORTIQ_ASSIGN_OR_RETURN(HostTensor wk, src.Get(p + "k_proj.weight"));
  CORTIQ_RETURN_IF_ERROR(CheckShape(p + "k_proj.weight", wk, {nkv * hd, hidden}));

  IndexerWeights out;
  out.origin = IndexerOrigin::kDerived;
  out.n_heads = hpk;
  out.hd = g.head_dim;
  out.hidden = g.hidden;
  // Q8_0 (GGUF int8 blocks) widens to f32: the indexer's kernels take
  // element types.
  out.dtype = wq.dtype == wk.dtype && wq.dtype != math::DType::kQ8_0 ? wq.dtype : math::DType::kF32;
  AppendRows(wq, hpk * g.head_dim, g.hidden, out.dtype, out.qk_proj);
  AppendRows(wk, g.head_dim, g.hidden, out.dtype, out.qk_proj);

  const bool has_qb = src.Has(p + "q_proj.bias"), has_kb = src.Has(p + "k_proj.bias");
  if (has_qb != has_kb) {
    return absl::NotFoundError(absl::StrCat("layer ", layer, ": '", p,
                                            has_qb ? "k_proj.bias" : "q_proj.bias",
                                            "' is missing while its pair is present"));
  }
  if (has_qb) {
    CORTIQ_ASSIGN_OR_RETURN(HostTensor bq, src.Get(p + "q_proj.bias"));
    CORTIQ_RETURN_IF_ERROR(CheckShape(p + "q_proj.bias", bq, {nq * hd}));
    CORTIQ_ASSIGN_OR_RETURN(HostTensor bk, src.Get(p + "k_proj.bias"));
    CORTIQ_RETURN_IF_ERROR(CheckShape(p + "k_proj.bias", bk, {nkv * hd}));
    out.qk_bias = ToF32(bq, 0, hpk * g.head_dim);
    const std::vector<float> kb = ToF32(bk, 0, g.head_dim);
    out.qk_bias.insert(out.qk_bias.end(), kb.begin(), kb.end());
  }
  const bool has_qn = src.Has(p + "q_norm.weight"), has_kn = src.Has(p + "k_norm.weight");
  if (has_qn != has_kn) {
    return absl::NotFoundError(absl::StrCat("layer ", layer, ": '", p,
                                            has_qn ? "k_norm.weight" : "q_norm.weight",
                                            "' is missing while its pair is present"));
  }
  if (has_qn) {
    CORTIQ_ASSIGN_OR_RETURN(HostTensor qn, src.Get(p + "q_norm.weight"));
    CORTIQ_RETURN_IF_ERROR(CheckShape(p + "q_norm.weight", qn, {hd}));
    CORTIQ_ASSIGN_OR_RETURN(HostTensor kn, src.Get(p + "k_norm.weight"));
    CORTIQ_RETURN_IF_ERROR(CheckShape(p + "k_norm.weight", kn, {hd}));
    out.q_norm = ToF32(qn, 0, g.head_dim);
    out.k_norm = ToF32(kn, 0, g.head_dim);
  }
  return out;
}

}  // namespace

size_t IndexerWeights::Bytes() const {
  return RoundUp64(qk_proj.size()) + RoundUp64(qk_bias.size() * sizeof(float)) +
         RoundUp64(q_norm.size() * sizeof(float)) + RoundUp64(k_norm.size() * sizeof(float));
}

std::string IndexerTensorName(size_t layer, std::string_view what) {
  return absl::StrCat("model.layers.", layer, ".self_attn.indexer.",
                      absl::string_view(what.data(), what.size()));
}

absl::StatusOr<IndexerWeights> LoadIndexerWeights(const TensorSource& source, size_t layer,
                                                  const AttentionGeometry& geometry) {
  const AttentionGeometry& g = geometry;
  if (g.hidden == 0 || g.head_dim == 0 || g.num_q_heads == 0 || g.num_kv_heads == 0 ||
      g.num_q_heads % g.num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("indexer weights: bad attention geometry (hidden ", g.hidden, ", heads ",
                     g.num_q_heads, ", kv heads ", g.num_kv_heads, ", head_dim ", g.head_dim, ")"));
  }
  for (const char* what : {"qk_proj.weight", "q_norm.weight", "k_norm.weight", "qk_proj.bias"}) {
    if (source.Has(IndexerTensorName(layer, what))) return FromCheckpoint(source, layer, g);
  }
  return Derive(source, layer, g);
}

}  // namespace cortiq::qsa
