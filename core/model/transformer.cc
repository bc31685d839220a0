#include "core/model/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/attention/qsa_attention.h"
#include "core/qsa/indexer_weights.h"
#include "core/util/status_macros.h"
#include "spdlog/spdlog.h"

namespace cortiq::model {
namespace {

using math::WeightView;

absl::StatusOr<WeightView> BindMatrix(const Checkpoint& ckpt, const std::string& name, int64_t rows,
                                      int64_t cols) {
  const int64_t shape[2] = {rows, cols};
  CORTIQ_ASSIGN_OR_RETURN(TensorView t, ckpt.Get(name, std::span<const int64_t>(shape)));
  WeightView w;
  w.data = t.data;
  w.dtype = t.dtype;
  w.rows = static_cast<size_t>(rows);
  w.cols = static_cast<size_t>(cols);
  return w;
}

absl::StatusOr<std::vector<float>> BindVector(const Checkpoint& ckpt, const std::string& name,
                                              int64_t n) {
  const int64_t shape[1] = {n};
  CORTIQ_ASSIGN_OR_RETURN(TensorView t, ckpt.Get(name, std::span<const int64_t>(shape)));
  std::vector<float> out(static_cast<size_t>(n));
  math::ConvertToF32(t.data, t.dtype, out.size(), out.data());
  return out;
}

void Grow(util::AlignedBuffer<float>& b, size_t n) {
  if (b.size() < n) b.Resize(n);
}

// The Checkpoint as the QSA weight loader's tensor source.
class CkptSource : public qsa::TensorSource {
 public:
  explicit CkptSource(const Checkpoint& c) : c_(c) {}
  bool Has(std::string_view n) const override { return c_.Has(n); }
  absl::StatusOr<qsa::HostTensor> Get(std::string_view n) const override {
    CORTIQ_ASSIGN_OR_RETURN(TensorView t, c_.GetAnyShape(n));
    return qsa::HostTensor{t.data, t.dtype, std::vector<int64_t>(t.shape.begin(), t.shape.end())};
  }

 private:
  const Checkpoint& c_;
};

}  // namespace

// --------------------------------------------------------------- Transformer

absl::StatusOr<std::unique_ptr<Transformer>> Transformer::Load(const std::string& model_dir,
                                                               util::ThreadPool* pool) {
  LoadOptions options;
  options.pool = pool;
  return Load(model_dir, options);
}

absl::StatusOr<std::unique_ptr<Transformer>> Transformer::Load(const std::string& model_dir,
                                                               const LoadOptions& options) {
  std::unique_ptr<Transformer> t(new Transformer());
  CORTIQ_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::Open(model_dir));
  t->checkpoint_.emplace(std::move(ckpt));
  t->config_ = t->checkpoint_->config();
  t->pool_ = options.pool != nullptr ? options.pool : &util::ThreadPool::Default();
  CORTIQ_RETURN_IF_ERROR(t->Bind());
  t->geometry_ = GeometryOf(t->config_);
  {
    const ModelConfig& c = t->config_;
    attention::QsaModelInfo info;
    info.num_layers = static_cast<size_t>(c.num_hidden_layers);
    info.geometry = t->geometry_;
    info.rope_theta = c.rope_theta;
    info.rms_norm_eps = static_cast<float>(c.rms_norm_eps);
    // One code path: checkpoint indexer tensors when present, else derived
    // from the layer's q/k projections (core/qsa/indexer_weights.h). The
    // checkpoint lives as long as the Transformer, which owns the runtime.
    const Checkpoint* ckpt = &*t->checkpoint_;
    const attention::AttentionGeometry& g = t->geometry_;
    const qsa::AttentionGeometry dims{g.hidden, g.num_q_heads, g.num_kv_heads, g.head_dim};
    info.load_weights = [ckpt, dims](size_t layer) -> absl::StatusOr<qsa::IndexerWeights> {
      return qsa::LoadIndexerWeights(CkptSource(*ckpt), layer, dims);
    };
    t->qsa_ = std::make_shared<QsaRuntime>(t->pool_, std::move(info));
  }
  // The flag means something for bf16 weights only; elsewhere it stays off so
  // bf16_activations() reports what the products do.
  auto mark = [&](WeightView& w) {
    w.bf16_activations = options.bf16_activations && w.dtype == math::DType::kBF16;
  };
  mark(t->lm_head_);
  for (LayerWeights& w : t->layers_) {
    for (WeightView* v : w.Projections()) mark(*v);
  }
  // int8: a Q8_0 copy of every matrix, the embedding included (tied: one
  // copy), every source page handed back. AMX: a tile-order copy of every
  // bf16-activation projection (lm_head included); the embedding's pages
  // stay (Embed reads its rows).
  const bool int8 = options.weights == LoadOptions::Weights::kInt8;
  std::vector<WeightView*> views = {&t->lm_head_};
  if (int8) views.push_back(&t->embed_);
  for (LayerWeights& w : t->layers_) {
    for (WeightView* v : w.Projections()) views.push_back(v);
  }
  std::vector<const void*> keep;
  if (int8) {
    // Q8_0 blocks tile rows of 32: a matrix whose input size is not a
    // multiple of 32 stays in the checkpoint's dtype (as llama.cpp falls back
    // for such tensors), said once in the log.
    size_t kept = 0;
    std::vector<WeightView*> quantizable;
    for (WeightView* v : views) {
      if (v->cols % math::kQ8Block == 0) {
        quantizable.push_back(v);
      } else {
        kept += v->rows * math::RowBytes(v->dtype, v->cols);
        keep.push_back(v->data);
      }
    }
    if (quantizable.size() < views.size()) {
      spdlog::warn(
          "--weights int8: {} of {} weight matrices have an input size that is not a multiple of "
          "32 and stay {} ({} bytes)",
          views.size() - quantizable.size(), views.size(), math::DTypeName(t->embed_.dtype), kept);
    }
    views = std::move(quantizable);
  } else {
    keep.push_back(t->embed_.data);
  }
  // A GGUF tensor converted or un-permuted at Open lives in memory the
  // checkpoint owns, not in the file mapping: handing its pages back would
  // zero it (and QSA derives its indexer from q/k later). Kept resident.
  for (const WeightView* v : views) {
    if (t->checkpoint_->OwnsData(v->data)) keep.push_back(v->data);
  }
  math::PackOptions pack;
  pack.int8 = int8;
  pack.rows_only = &t->embed_;
  CORTIQ_ASSIGN_OR_RETURN(t->packed_, math::PackedWeights::Pack(views, keep, t->pool_, pack));
  return t;
}

const char* WeightsName(LoadOptions::Weights w) {
  return w == LoadOptions::Weights::kInt8 ? "int8" : "checkpoint";
}

std::optional<LoadOptions::Weights> ParseWeights(std::string_view name) {
  if (name == "checkpoint") return LoadOptions::Weights::kCheckpoint;
  if (name == "int8") return LoadOptions::Weights::kInt8;
  return std::nullopt;
}

LoadOptions::Weights Transformer::weights() const {
  bool int8 = lm_head_.dtype == math::DType::kQ8_0;
  for (const LayerWeights& w : layers_) {
    for (const WeightView* v : w.Projections()) int8 = int8 || v->dtype == math::DType::kQ8_0;
  }
  return int8 ? LoadOptions::Weights::kInt8 : LoadOptions::Weights::kCheckpoint;
}

size_t Transformer::CheckpointWeightBytesInUse() const {
  // A view still reads the checkpoint when its data is not inside a copy.
  auto in_place = [&](const WeightView& w) {
    return w.amx_tiles == nullptr && w.q8_lanes == nullptr && !packed_.Owns(w.data);
  };
  auto bytes = [](const WeightView& w) { return w.rows * math::RowBytes(w.dtype, w.cols); };
  size_t total = in_place(embed_) ? bytes(embed_) : 0;
  if (lm_head_.data != embed_.data && in_place(lm_head_)) total += bytes(lm_head_);
  for (const LayerWeights& w : layers_) {
    for (const WeightView* v : w.Projections()) total += in_place(*v) ? bytes(*v) : 0;
  }
  return total;
}

absl::Status Transformer::Bind() {
  const ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size, hd = c.head_dim, nq = c.num_attention_heads,
                nkv = c.num_key_value_heads, inter = c.intermediate_size, vocab = c.vocab_size;
  CORTIQ_ASSIGN_OR_RETURN(embed_,
                          BindMatrix(*checkpoint_, "model.embed_tokens.weight", vocab, hidden));
  if (c.tie_word_embeddings && !checkpoint_->Has("lm_head.weight")) {
    lm_head_ = embed_;
  } else {
    CORTIQ_ASSIGN_OR_RETURN(lm_head_, BindMatrix(*checkpoint_, "lm_head.weight", vocab, hidden));
  }
  CORTIQ_ASSIGN_OR_RETURN(final_norm_, BindVector(*checkpoint_, "model.norm.weight", hidden));

  layers_.resize(c.num_hidden_layers);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    LayerWeights& w = layers_[l];
    const std::string p = absl::StrCat("model.layers.", l, ".");
    CORTIQ_ASSIGN_OR_RETURN(
        w.q_proj, BindMatrix(*checkpoint_, p + "self_attn.q_proj.weight", nq * hd, hidden));
    CORTIQ_ASSIGN_OR_RETURN(
        w.k_proj, BindMatrix(*checkpoint_, p + "self_attn.k_proj.weight", nkv * hd, hidden));
    CORTIQ_ASSIGN_OR_RETURN(
        w.v_proj, BindMatrix(*checkpoint_, p + "self_attn.v_proj.weight", nkv * hd, hidden));
    CORTIQ_ASSIGN_OR_RETURN(
        w.o_proj, BindMatrix(*checkpoint_, p + "self_attn.o_proj.weight", hidden, nq * hd));
    CORTIQ_ASSIGN_OR_RETURN(w.gate_proj,
                            BindMatrix(*checkpoint_, p + "mlp.gate_proj.weight", inter, hidden));
    CORTIQ_ASSIGN_OR_RETURN(w.up_proj,
                            BindMatrix(*checkpoint_, p + "mlp.up_proj.weight", inter, hidden));
    CORTIQ_ASSIGN_OR_RETURN(w.down_proj,
                            BindMatrix(*checkpoint_, p + "mlp.down_proj.weight", hidden, inter));
    CORTIQ_ASSIGN_OR_RETURN(w.input_norm,
                            BindVector(*checkpoint_, p + "input_layernorm.weight", hidden));
    CORTIQ_ASSIGN_OR_RETURN(
        w.post_attn_norm, BindVector(*checkpoint_, p + "post_attention_layernorm.weight", hidden));
    if (c.attention_bias) {
      CORTIQ_ASSIGN_OR_RETURN(w.q_bias,
                              BindVector(*checkpoint_, p + "self_attn.q_proj.bias", nq * hd));
      CORTIQ_ASSIGN_OR_RETURN(w.k_bias,
                              BindVector(*checkpoint_, p + "self_attn.k_proj.bias", nkv * hd));
      CORTIQ_ASSIGN_OR_RETURN(w.v_bias,
                              BindVector(*checkpoint_, p + "self_attn.v_proj.bias", nkv * hd));
    }
    if (c.o_proj_bias) {
      CORTIQ_ASSIGN_OR_RETURN(w.o_bias,
                              BindVector(*checkpoint_, p + "self_attn.o_proj.bias", hidden));
    }
    if (c.qk_norm) {
      CORTIQ_ASSIGN_OR_RETURN(w.q_norm,
                              BindVector(*checkpoint_, p + "self_attn.q_norm.weight", hd));
      CORTIQ_ASSIGN_OR_RETURN(w.k_norm,
                              BindVector(*checkpoint_, p + "self_attn.k_norm.weight", hd));
    }
  }
  // inv_freq[i] = theta^(-2i/hd), computed in f64 (angles are formed in f64
  // too, so long positions keep full precision).
  inv_freq_.resize(hd / 2);
  for (int64_t i = 0; i < hd / 2; ++i) {
    inv_freq_[i] = static_cast<float>(std::pow(c.rope_theta, -2.0 * double(i) / double(hd)));
  }
  return absl::OkStatus();
}

size_t Transformer::WeightBytesPerStep() const {
  auto bytes = [](const WeightView& w) {
    return w.q8_lanes != nullptr ? math::Q8LaneBytes(w.rows, w.cols)
                                 : w.rows * math::RowBytes(w.dtype, w.cols);
  };
  size_t total = bytes(lm_head_);
  for (const LayerWeights& w : layers_) {
    for (const WeightView* v : w.Projections()) total += bytes(*v);
  }
  return total;
}

absl::Status Transformer::CheckTokens(std::span<const int32_t> tokens) const {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("tokens[", i, "] = ", tokens[i],
                                                     " is outside the vocabulary [0, ",
                                                     config_.vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

void Transformer::EnsureScratch(ForwardScratch& s, size_t rows) const {
  const ModelConfig& c = config_;
  const size_t hidden = c.hidden_size, hd = c.head_dim;
  if (s.rows < rows) {
    Grow(s.x, rows * hidden);
    Grow(s.xn, rows * hidden);
    Grow(s.q, rows * c.num_attention_heads * hd);
    Grow(s.k, rows * c.num_key_value_heads * hd);
    Grow(s.v, rows * c.num_key_value_heads * hd);
    Grow(s.att, rows * c.num_attention_heads * hd);
    Grow(s.gate, rows * c.intermediate_size);
    Grow(s.up, rows * c.intermediate_size);
    Grow(s.rope, rows * hd);
    s.rows = rows;
  }
  if (s.positions.size() < rows) s.positions.resize(rows);
}

void Transformer::RopeTables(ForwardScratch& s, size_t rows) const {
  const size_t half = config_.head_dim / 2;
  for (size_t i = 0; i < rows; ++i) {
    float* cs = s.rope.data() + i * 2 * half;
    for (size_t j = 0; j < half; ++j) {
      const double angle = double(s.positions[i]) * double(inv_freq_[j]);
      cs[j] = static_cast<float>(std::cos(angle));
      cs[half + j] = static_cast<float>(std::sin(angle));
    }
  }
}

void Transformer::Embed(std::span<const int32_t> tokens, float* x) const {
  const size_t hidden = config_.hidden_size;
  if (embed_.q8_lanes != nullptr) {  // tied to a lane-order lm_head: its rows
    for (size_t i = 0; i < tokens.size(); ++i) {
      math::Q8LaneRowToF32(embed_.q8_lanes, hidden, size_t(tokens[i]), x + i * hidden);
    }
    return;
  }
  const size_t row_bytes = math::RowBytes(embed_.dtype, hidden);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto* row = static_cast<const uint8_t*>(embed_.data) + size_t(tokens[i]) * row_bytes;
    math::ConvertToF32(row, embed_.dtype, hidden, x + i * hidden);
  }
}

void Transformer::Logits(const float* xn, size_t rows, float* out) const {
  math::MatMul(xn, rows, lm_head_, out, pool_);
}

attention::AttentionRows Transformer::RowsOf(ForwardScratch& s, size_t l, size_t first_row,
                                             size_t count, size_t start) const {
  const attention::AttentionGeometry& g = geometry_;
  attention::AttentionRows r;
  r.layer = l;
  r.start = start;
  r.count = count;
  r.batch_row = first_row;
  r.xn = s.xn.data() + first_row * g.hidden;
  r.q = s.q.data() + first_row * g.q_width();
  r.k = s.k.data() + first_row * g.kv_width();
  r.v = s.v.data() + first_row * g.kv_width();
  r.out = s.att.data() + first_row * g.q_width();
  return r;
}

template <typename Attend>
absl::Status Transformer::RunLayers(ForwardScratch& s, size_t rows, size_t gemv_rows,
                                       Attend&& attend) const {
  const ModelConfig& c = config_;
  const size_t hidden = c.hidden_size, hd = c.head_dim, nq = c.num_attention_heads,
               nkv = c.num_key_value_heads, inter = c.intermediate_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const size_t half = hd / 2;

  // Row-wise elementwise work (norms, RoPE, SwiGLU, residual adds): rows are
  // independent, so a prefill block spreads them over the pool (same bits
  // either way); a decode batch is too small to pay for the hand-off.
  auto for_rows = [&](auto&& fn) {
    if (rows < 16) {
      for (size_t i = 0; i < rows; ++i) fn(i);
      return;
    }
    pool_->ParallelFor(rows, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) fn(i);
    });
  };
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerWeights& w = layers_[l];
    // --- attention block
    for_rows([&](size_t i) {
      math::RmsNorm(s.x.data() + i * hidden, w.input_norm.data(), eps, hidden,
                    s.xn.data() + i * hidden);
    });
    math::MatMulSplit(s.xn.data(), rows, gemv_rows, w.q_proj, s.q.data(), pool_);
    math::MatMulSplit(s.xn.data(), rows, gemv_rows, w.k_proj, s.k.data(), pool_);
    math::MatMulSplit(s.xn.data(), rows, gemv_rows, w.v_proj, s.v.data(), pool_);
    // Per row: bias, q/k norm, RoPE (independent rows: parallel for a block).
    for_rows([&](size_t i) {
      float* q = s.q.data() + i * nq * hd;
      float* k = s.k.data() + i * nkv * hd;
      float* v = s.v.data() + i * nkv * hd;
      if (!w.q_bias.empty()) {
        for (size_t j = 0; j < nq * hd; ++j) q[j] += w.q_bias[j];
        for (size_t j = 0; j < nkv * hd; ++j) k[j] += w.k_bias[j];
        for (size_t j = 0; j < nkv * hd; ++j) v[j] += w.v_bias[j];
      }
      const float* cs = s.rope.data() + i * 2 * half;
      for (size_t h = 0; h < nq; ++h) {
        if (!w.q_norm.empty()) math::RmsNorm(q + h * hd, w.q_norm.data(), eps, hd, q + h * hd);
        math::RopeRotateHalf(q + h * hd, hd, cs, cs + half);
      }
      for (size_t h = 0; h < nkv; ++h) {
        if (!w.k_norm.empty()) math::RmsNorm(k + h * hd, w.k_norm.data(), eps, hd, k + h * hd);
        math::RopeRotateHalf(k + h * hd, hd, cs, cs + half);
      }
    });
    // The layer's attention state absorbs k, v and writes s.att (it reads
    // s.xn too, before o_proj overwrites it).
    CORTIQ_RETURN_IF_ERROR(attend(l));
    math::MatMulSplit(s.att.data(), rows, gemv_rows, w.o_proj, s.xn.data(), pool_);
    for_rows([&](size_t i) {
      float* x = s.x.data() + i * hidden;
      const float* o = s.xn.data() + i * hidden;
      for (size_t j = 0; j < hidden; ++j) x[j] += o[j];
      if (!w.o_bias.empty()) {
        for (size_t j = 0; j < hidden; ++j) x[j] += w.o_bias[j];
      }
    });

    // --- MLP block
    for_rows([&](size_t i) {
      math::RmsNorm(s.x.data() + i * hidden, w.post_attn_norm.data(), eps, hidden,
                    s.xn.data() + i * hidden);
    });
    math::MatMulSplit(s.xn.data(), rows, gemv_rows, w.gate_proj, s.gate.data(), pool_);
    math::MatMulSplit(s.xn.data(), rows, gemv_rows, w.up_proj, s.up.data(), pool_);
    for_rows([&](size_t i) {
      float* g = s.gate.data() + i * inter;
      math::SwiGlu(g, s.up.data() + i * inter, inter, g);
    });
    math::MatMulSplit(s.gate.data(), rows, gemv_rows, w.down_proj, s.xn.data(), pool_);
    for_rows([&](size_t i) {
      float* x = s.x.data() + i * hidden;
      const float* d = s.xn.data() + i * hidden;
      for (size_t j = 0; j < hidden; ++j) x[j] += d[j];
    });
  }
  return absl::OkStatus();
}

absl::Status Transformer::DecodeAttention(ForwardScratch& s, size_t l,
                                          std::span<SequenceKv* const> kvs) const {
  attention::AttentionContext ctx{geometry_, pool_, s.attention};
  // Serial: every row is absorbed by its state, which says how many
  // independent tasks its attention has. Tasks are numbered across the
  // batch: row b's tasks are [first[b], first[b + 1]).
  const size_t rows = kvs.size();
  size_t tasks = 0;
  for (size_t b = 0; b < rows; ++b) {
    s.task_first[b] = tasks;
    CORTIQ_ASSIGN_OR_RETURN(const size_t n,
                            kvs[b]->layer(l).BeginDecode(RowsOf(s, l, b, 1, s.positions[b]), ctx));
    tasks += n;
  }
  s.task_first[rows] = tasks;
  // Parallel: every task of every row in one region.
  s.attention.ParallelFor(pool_, tasks, [&](size_t begin, size_t end, attention::ScratchSlot& sl) {
    size_t b = std::upper_bound(s.task_first.begin(), s.task_first.begin() + rows + 1, begin) -
               s.task_first.begin() - 1;
    for (size_t t = begin; t < end; ++t) {
      while (t >= s.task_first[b + 1]) ++b;
      kvs[b]->layer(l).DecodeTask(RowsOf(s, l, b, 1, s.positions[b]), t - s.task_first[b], sl);
    }
  });
  // Serial: what follows the tasks (QSA's sparse rows).
  for (size_t b = 0; b < rows; ++b) {
    CORTIQ_RETURN_IF_ERROR(kvs[b]->layer(l).EndDecode(RowsOf(s, l, b, 1, s.positions[b]), ctx));
  }
  return absl::OkStatus();
}

absl::Status Transformer::QsaIngestRows(SequenceKv& kv, size_t layer, const float* normed,
                                        size_t rows) const {
  CORTIQ_RETURN_IF_ERROR(BindQsa(kv));
  auto* q =
      layer < kv.num_layers() ? dynamic_cast<attention::QsaAttention*>(&kv.layer(layer)) : nullptr;
  if (q == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("qsa: layer ", layer, " is not a QSA layer of this sequence"));
  }
  return q->IngestRows(normed, rows);
}

absl::Status Transformer::Prefill(std::span<const int32_t> tokens, SequenceKv& kv,
                                  ForwardScratch& s, float* last_logits, float* all_logits) const {
  if (tokens.empty()) return absl::InvalidArgumentError("prefill: no tokens");
  // A step of this one chunk (rows 0 .. n of the scratch).
  const bool last_only = all_logits == nullptr && last_logits != nullptr;
  CORTIQ_RETURN_IF_ERROR(RunStep(
      1, [&](size_t) { return StepSegment{&kv, tokens, false, last_only}; }, s, last_logits));
  if (all_logits == nullptr) return absl::OkStatus();
  const size_t rows = tokens.size(), hidden = config_.hidden_size, vocab = config_.vocab_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  for (size_t i = 0; i < rows; ++i) {
    math::RmsNorm(s.x.data() + i * hidden, final_norm_.data(), eps, hidden,
                  s.xn.data() + i * hidden);
  }
  Logits(s.xn.data(), rows, all_logits);
  if (last_logits != nullptr) {
    std::memcpy(last_logits, all_logits + (rows - 1) * vocab, vocab * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status Transformer::DecodeBatch(std::span<const int32_t> tokens,
                                      std::span<SequenceKv* const> kvs, ForwardScratch& s,
                                      float* logits) const {
  if (tokens.empty() || tokens.size() != kvs.size()) {
    return absl::InvalidArgumentError("decode: tokens and sequences must pair up, one each");
  }
  return RunStep(
      tokens.size(),
      [&](size_t b) { return StepSegment{kvs[b], tokens.subspan(b, 1), true, true}; }, s, logits);
}

absl::Status Transformer::Step(std::span<const StepSegment> segments, ForwardScratch& s,
                               float* logits) const {
  return RunStep(segments.size(), [&](size_t i) { return segments[i]; }, s, logits);
}

template <typename SegmentAt>
absl::Status Transformer::RunStep(size_t count, SegmentAt&& at, ForwardScratch& s,
                                  float* logits) const {
  if (count == 0) return absl::InvalidArgumentError("step: no rows");
  // Check everything before changing anything (the scratch aside).
  if (s.segment_start.size() < count) {
    s.segment_start.resize(count);
    s.segment_row.resize(count);
  }
  size_t rows = 0, decode = 0, small = 0;
  bool chunk_seen = false;
  // Chunks of fewer rows go with the decode rows (math::ChunkGemmMinRows).
  const size_t gemm_min =
      layers_.empty() ? math::kMatMulGemmMinBatch : math::ChunkGemmMinRows(layers_.front().q_proj);
  for (size_t i = 0; i < count; ++i) {
    const StepSegment g = at(i);
    const char* what = g.decode ? "decode" : "prefill";
    if (g.kv == nullptr || g.tokens.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("step: segment ", i, " has no sequence or no tokens"));
    }
    CORTIQ_RETURN_IF_ERROR(CheckTokens(g.tokens));
    if (g.kv->num_layers() != layers_.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": a sequence state belongs to another geometry"));
    }
    if (g.decode && (chunk_seen || g.tokens.size() != 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step: segment ", i, ": a decode row holds one token and comes before every chunk"));
    }
    chunk_seen = chunk_seen || !g.decode;
    // A sequence's earlier segment in this step: only the chunk right before,
    // which this one continues.
    for (size_t j = i; j-- > 0;) {
      const StepSegment p = at(j);
      if (p.kv != g.kv) continue;
      if (g.decode || p.decode || j + 1 != i) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": a sequence appears twice in one step (segments ", j, " and ", i, ")"));
      }
      break;
    }
    const StepSegment p = i > 0 ? at(i - 1) : StepSegment{};
    const size_t start =
        p.kv == g.kv ? s.segment_start[i - 1] + p.tokens.size() : g.kv->position();
    if (start + g.tokens.size() > size_t(config_.max_position_embeddings)) {
      return g.decode ? absl::InvalidArgumentError(absl::StrCat(
                            "decode: sequence ", i, " is at position ", start,
                            ", the model's context is ", config_.max_position_embeddings))
                      : absl::InvalidArgumentError(absl::StrCat(
                            "prefill: position ", start, " + ", g.tokens.size(),
                            " tokens exceeds the model's context of ",
                            config_.max_position_embeddings));
    }
    s.segment_start[i] = start;
    rows += g.tokens.size();
    if (g.decode) {
      ++decode;
    } else if (g.tokens.size() < gemm_min) {
      small += g.tokens.size();
    }
  }

  // Rows: the decode rows first (DecodeAttention's rows 0 .. decode), then
  // the chunks under gemm_min rows (with them on the decode kernels), then
  // the longer chunks (on the GEMM), each chunk contiguous.
  size_t next[3] = {0, decode, decode + small};
  for (size_t i = 0; i < count; ++i) {
    const StepSegment g = at(i);
    const int cls = g.decode ? 0 : g.tokens.size() < gemm_min ? 1 : 2;
    s.segment_row[i] = next[cls];
    next[cls] += g.tokens.size();
  }
  EnsureScratch(s, rows);
  if (s.task_first.size() < decode + 1) s.task_first.resize(decode + 1);
  if (s.tokens.size() < rows) s.tokens.resize(rows);
  if (s.decode_kvs.size() < decode) s.decode_kvs.resize(decode);

  // From here the sequences change.
  for (size_t i = 0; i < count; ++i) {
    const StepSegment g = at(i);
    // A sequence decodes once its prompt is complete (O(1) seals).
    if (g.decode && g.kv->AwaitsPromptEnd()) SealO1(*g.kv);
    CORTIQ_RETURN_IF_ERROR(BindQsa(*g.kv));
    if (!g.decode) g.kv->Reserve(s.segment_start[i] + g.tokens.size());
    const size_t first = s.segment_row[i];
    if (g.decode) s.decode_kvs[first] = g.kv;
    for (size_t r = 0; r < g.tokens.size(); ++r) {
      s.positions[first + r] = s.segment_start[i] + r;
      s.tokens[first + r] = g.tokens[r];
    }
  }
  RopeTables(s, rows);
  Embed(std::span<const int32_t>(s.tokens.data(), rows), s.x.data());
  attention::AttentionContext ctx{geometry_, pool_, s.attention};
  const std::span<SequenceKv* const> decode_kvs(s.decode_kvs.data(), decode);
  CORTIQ_RETURN_IF_ERROR(RunLayers(s, rows, decode + small, [&](size_t l) -> absl::Status {
    if (decode > 0) CORTIQ_RETURN_IF_ERROR(DecodeAttention(s, l, decode_kvs));
    for (size_t i = decode; i < count; ++i) {
      const StepSegment g = at(i);
      CORTIQ_RETURN_IF_ERROR(g.kv->layer(l).Prefill(
          RowsOf(s, l, s.segment_row[i], g.tokens.size(), s.segment_start[i]), ctx));
    }
    return absl::OkStatus();
  }));

  // Logits of the rows that want them, each as a batch-1 call computes it.
  const size_t hidden = config_.hidden_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  size_t out = 0;
  for (size_t i = 0; i < count; ++i) {
    const StepSegment g = at(i);
    if (!g.logits) continue;
    const size_t last = s.segment_row[i] + g.tokens.size() - 1;
    math::RmsNorm(s.x.data() + last * hidden, final_norm_.data(), eps, hidden,
                  s.xn.data() + out * hidden);
    ++out;
  }
  if (out > 0 && logits != nullptr) {
    math::MatMulSplit(s.xn.data(), out, out, lm_head_, logits, pool_);
  }
  return absl::OkStatus();
}

size_t Transformer::SealO1(SequenceKv& kv) const {
  return kv.CompletePrompt(static_cast<size_t>(config_.num_attention_heads));
}

}  // namespace cortiq::model
