#include "core/model/transformer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

// Prefill chunks of at least this many rows of one exact f32 sequence run
// their attention as tiled matrix products, `kTiledAttentionTile` query rows
// per tile.
constexpr size_t kTiledAttentionMinRows = 64;
constexpr size_t kTiledAttentionTile = 32;

// Per-thread attention scratch: grows to the longest context seen by this
// thread, then is reused (no allocation per decode step once warm).
float* ThreadScores(size_t n) {
  thread_local util::AlignedBuffer<float> buf;
  if (buf.size() < n) buf.Resize(std::max(n, buf.size() * 2));
  return buf.data();
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

qsa::DevicePtr P(const void* p) { return qsa::DevicePtr::FromHost(p); }

}  // namespace

// ----------------------------------------------------------------- QsaConfig

bool QsaConfig::IsQsaLayer(size_t layer) const {
  return std::binary_search(layers.begin(), layers.end(), layer);
}

std::string QsaConfig::DebugString() const {
  if (!Enabled()) return "qsa: off";
  return absl::StrCat("qsa: layers=[", absl::StrJoin(layers, ","), "] ratio=", ratio,
                      " budget=", budget);
}

absl::StatusOr<QsaConfig> MakeQsaConfig(std::string_view layer_spec, size_t ratio, size_t budget,
                                        size_t num_layers) {
  QsaConfig c;
  CORTIQ_ASSIGN_OR_RETURN(c.layers, kv::ParseLayerSpec(layer_spec, num_layers));
  if (ratio < 1) return absl::InvalidArgumentError("qsa.ratio must be at least 1");
  if (budget < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("qsa.budget = ", budget, " < 2 (the sink and current blocks)"));
  }
  c.ratio = ratio;
  c.budget = budget;
  return c;
}

// -------------------------------------------------------------- QsaSeqStates

QsaSeqStates::QsaSeqStates(QsaSeqStates&& o) noexcept
    : runtime_(std::move(o.runtime_)),
      indexer_(std::move(o.indexer_)),
      state_(std::move(o.state_)) {
  o.indexer_.clear();
  o.state_.clear();
}

QsaSeqStates& QsaSeqStates::operator=(QsaSeqStates&& o) noexcept {
  if (this != &o) {
    Release();
    runtime_ = std::move(o.runtime_);
    indexer_ = std::move(o.indexer_);
    state_ = std::move(o.state_);
    o.indexer_.clear();
    o.state_.clear();
  }
  return *this;
}

QsaSeqStates::~QsaSeqStates() { Release(); }

void QsaSeqStates::Release() {
  for (size_t l = 0; l < state_.size(); ++l) {
    if (indexer_[l] == nullptr) continue;
    // Idempotent: a released state holds null pointers. A failed Free is the
    // backend's to account for (CpuBackend only fails on a bad pointer).
    const absl::Status st = indexer_[l]->ReleaseSeqState(state_[l]);
    if (!st.ok()) spdlog::warn("qsa: releasing layer {}: {}", l, std::string(st.message()));
  }
}

size_t QsaSeqStates::MemoryBytes() const {
  size_t total = 0;
  for (const auto& st : state_) total += st.MemoryBytes();
  return total;
}

// ---------------------------------------------------------------- SequenceKv

SequenceKv::SequenceKv(const ModelConfig& config, kv::KvMode mode) : mode_(mode) {
  layers_.reserve(config.num_hidden_layers);
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    layers_.emplace_back(config.num_key_value_heads, config.head_dim, mode);
  }
}

void SequenceKv::Reserve(size_t positions) {
  for (auto& l : layers_) l.Reserve(positions);
  for (size_t l = 0; l < qsa_.state_.size(); ++l) {
    if (qsa_.indexer_[l] == nullptr) continue;
    const absl::Status st = qsa_.indexer_[l]->Reserve(qsa_.state_[l], positions);
    // Reserve is advisory (the state grows on demand); only allocation fails.
    if (!st.ok()) spdlog::warn("qsa: reserve layer {}: {}", l, std::string(st.message()));
  }
}

absl::Status SequenceKv::TruncateLast(size_t n) {
  if (n > position()) {
    return absl::InvalidArgumentError(
        absl::StrCat("truncate: ", n, " positions requested, the sequence holds ", position()));
  }
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (layers_[l].O1Sealed()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "truncate: layer ", l, " runs the sealed O(1) kernel, which cannot roll back"));
    }
  }
  const size_t keep = position() - n;
  for (size_t l = 0; l < qsa_.state_.size(); ++l) {
    if (qsa_.indexer_[l] != nullptr && qsa_.state_[l].ingested() < keep) {
      return absl::FailedPreconditionError(
          absl::StrCat("truncate: layer ", l, "'s QSA state ingested ", qsa_.state_[l].ingested(),
                       " positions, fewer than the ", keep, " kept"));
    }
  }
  for (auto& l : layers_) CORTIQ_RETURN_IF_ERROR(l.TruncateLast(n));  // cannot fail now
  for (size_t l = 0; l < qsa_.state_.size(); ++l) {
    if (qsa_.indexer_[l] == nullptr) continue;
    CORTIQ_RETURN_IF_ERROR(qsa_.indexer_[l]->Truncate(qsa_.state_[l], keep));  // checked above
  }
  return absl::OkStatus();
}

void SequenceKv::Release() {
  for (auto& l : layers_) l.Release();
  qsa_.Release();
}

size_t SequenceKv::MemoryBytes() const {
  size_t total = 0;
  for (const auto& l : layers_) total += l.MemoryBytes();
  return total + qsa_.MemoryBytes();
}

size_t SequenceKv::QsaMemoryBytes() const { return qsa_.MemoryBytes(); }

const qsa::QsaSeqState* SequenceKv::qsa_state(size_t layer) const {
  if (layer >= qsa_.state_.size() || qsa_.indexer_[layer] == nullptr) return nullptr;
  return &qsa_.state_[layer];
}

absl::StatusOr<std::vector<uint8_t>> SequenceKv::QsaSnapshotAux(size_t layer) const {
  const qsa::QsaSeqState* st = qsa_state(layer);
  if (st == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("qsa: layer ", layer, " is not a bound QSA layer of this sequence"));
  }
  return qsa_.indexer_[layer]->SnapshotAux(*st);
}

size_t SequenceKv::O1MemoryBytes() const {
  size_t total = 0;
  for (const auto& l : layers_) total += l.O1MemoryBytes();
  return total;
}

SequenceKv SequenceKv::Copy() const {
  SequenceKv out;
  out.mode_ = mode_;
  out.o1_config_ = o1_config_;
  out.layers_.reserve(layers_.size());
  for (const auto& l : layers_) out.layers_.push_back(l.Copy());
  out.qsa_config_ = qsa_config_;
  if (qsa_.bound()) {
    // Deep copy through the aux blob: it IS the state (docs/QSA.md).
    out.qsa_.runtime_ = qsa_.runtime_;
    out.qsa_.indexer_ = qsa_.indexer_;
    out.qsa_.state_.resize(qsa_.state_.size());
    for (size_t l = 0; l < qsa_.state_.size(); ++l) {
      const qsa::QsaIndexer* ix = qsa_.indexer_[l];
      if (ix == nullptr) continue;
      absl::StatusOr<qsa::QsaSeqState> st = ix->NewSeqState(qsa_.state_[l].capacity());
      absl::StatusOr<std::vector<uint8_t>> blob = ix->SnapshotAux(qsa_.state_[l]);
      absl::Status restored = st.ok() && blob.ok() ? ix->RestoreAux(*st, *blob) : absl::OkStatus();
      if (!st.ok() || !blob.ok() || !restored.ok()) {
        const absl::Status why = !st.ok() ? st.status() : (!blob.ok() ? blob.status() : restored);
        spdlog::critical("qsa: copying layer {}'s state failed: {}", l, std::string(why.message()));
        std::abort();  // backend out of memory: treated like std::bad_alloc
      }
      out.qsa_.state_[l] = std::move(*st);
    }
  }
  return out;
}

absl::Status SequenceKv::EnableO1(const kv::O1Config& config) {
  if (position() != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("o1: the sequence already holds ", position(),
                     " positions; O(1) attention is chosen before the first prefill"));
  }
  for (size_t l : config.layers) {
    if (l >= layers_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "o1.layers: layer ", l, " is out of range; the model has ", layers_.size(), " layers"));
    }
  }
  if (config.m < 4) return absl::InvalidArgumentError(absl::StrCat("o1.m = ", config.m, " < 4"));
  if (config.w < 1) return absl::InvalidArgumentError("o1.w must be at least 1");
  if (config.Enabled() && qsa_config_.has_value()) {
    return absl::InvalidArgumentError(
        "o1: QSA is enabled on this sequence; O(1) and QSA attention do not compose");
  }
  if (!config.Enabled()) {
    o1_config_.reset();
    return absl::OkStatus();
  }
  o1_config_ = config;
  return absl::OkStatus();
}

absl::Status SequenceKv::EnableQsa(const QsaConfig& config) {
  if (position() != 0 || qsa_.bound()) {
    return absl::FailedPreconditionError(
        absl::StrCat("qsa: the sequence already holds ", position(),
                     " positions; QSA attention is chosen before the first prefill"));
  }
  for (size_t l : config.layers) {
    if (l >= layers_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "qsa.layers: layer ", l, " is out of range; the model has ", layers_.size(), " layers"));
    }
  }
  if (config.ratio < 1) return absl::InvalidArgumentError("qsa.ratio must be at least 1");
  if (config.budget < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("qsa.budget = ", config.budget, " < 2 (the sink and current blocks)"));
  }
  if (config.Enabled() && o1_config_.has_value()) {
    return absl::InvalidArgumentError(
        "qsa: O(1) attention is enabled on this sequence; O(1) and QSA attention do not compose "
        "(a sealed O(1) layer keeps no K/V rows for QSA to read)");
  }
  if (!config.Enabled()) {
    qsa_config_.reset();
    return absl::OkStatus();
  }
  qsa_config_ = config;
  std::sort(qsa_config_->layers.begin(), qsa_config_->layers.end());
  qsa_config_->layers.erase(std::unique(qsa_config_->layers.begin(), qsa_config_->layers.end()),
                            qsa_config_->layers.end());
  return absl::OkStatus();
}

bool SequenceKv::O1Collecting() const {
  return std::any_of(layers_.begin(), layers_.end(),
                     [](const kv::LayerKvCache& l) { return l.O1Collecting(); });
}

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
  t->qsa_ = std::make_shared<QsaRuntime>(t->pool_);
  CORTIQ_RETURN_IF_ERROR(t->Bind());
  // The flag means something for bf16 weights only; elsewhere it stays off so
  // bf16_activations() reports what the products do.
  auto mark = [&](WeightView& w) {
    w.bf16_activations = options.bf16_activations && w.dtype == math::DType::kBF16;
  };
  mark(t->lm_head_);
  for (LayerWeights& w : t->layers_) {
    for (WeightView* v : w.Projections()) mark(*v);
  }
  if (math::AmxTilesUsed()) t->PackAmxTiles();
  return t;
}

void Transformer::PackAmxTiles() {
  std::vector<WeightView*> views;
  if (lm_head_.bf16_activations) views.push_back(&lm_head_);
  for (LayerWeights& w : layers_) {
    for (WeightView* v : w.Projections()) {
      if (v->bf16_activations) views.push_back(v);
    }
  }
  // One mapping for all of them (huge pages: the decode step streams it end
  // to end), each matrix at a 4 KiB-aligned offset.
  std::vector<size_t> offset;
  size_t total = 0;
  for (const WeightView* v : views) {
    offset.push_back(total);
    total += (math::AmxTileElements(v->rows, v->cols) + 2047) / 2048 * 2048;
  }
  try {
    amx_tiles_ = util::HugeBuffer<uint16_t>(total);
  } catch (const std::bad_alloc&) {
    // Not fatal: the AMX decode kernel reads the checkpoint in place.
    spdlog::warn(
        "model: the AMX tile copy of the weights ({} bytes) could not be mapped; "
        "reading them from the checkpoint in place",
        total * sizeof(uint16_t));
    return;
  }
  const long page = sysconf(_SC_PAGESIZE);
  for (size_t i = 0; i < views.size(); ++i) {
    WeightView* v = views[i];
    uint16_t* tiles = amx_tiles_.data() + offset[i];
    const auto* src = static_cast<const uint16_t*>(v->data);
    pool_->ParallelFor(
        v->rows,
        [&](size_t begin, size_t end) {
          math::PackAmxTiles(src, v->rows, v->cols, tiles, begin, end);
        },
        16);
    v->amx_tiles = tiles;
    // From now on the products read the tiles only: hand the source pages of
    // the (read-only, file-backed) mapping back, so resident memory counts
    // the weights once. They fault in again from the file if anything reads
    // them (QSA deriving its indexer from q/k). The embedding stays: Embed
    // reads its rows.
    if (v->data == embed_.data || page <= 0) continue;
    const uintptr_t b = (reinterpret_cast<uintptr_t>(src) + page - 1) / page * page;
    const uintptr_t e = (reinterpret_cast<uintptr_t>(src) + v->rows * v->cols * 2) / page * page;
    if (e > b) madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
  }
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
  auto bytes = [](const WeightView& w) { return w.rows * w.cols * math::DTypeSize(w.dtype); };
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

void Transformer::EnsureScratch(ForwardScratch& s, size_t rows, size_t max_len) const {
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
  s.score_len = std::max(s.score_len, max_len);
}

void Transformer::RopeTables(ForwardScratch& s, std::span<const size_t> positions) const {
  const size_t half = config_.head_dim / 2;
  for (size_t i = 0; i < positions.size(); ++i) {
    float* cs = s.rope.data() + i * 2 * half;
    for (size_t j = 0; j < half; ++j) {
      const double angle = double(positions[i]) * double(inv_freq_[j]);
      cs[j] = static_cast<float>(std::cos(angle));
      cs[half + j] = static_cast<float>(std::sin(angle));
    }
  }
}

void Transformer::Embed(std::span<const int32_t> tokens, float* x) const {
  const size_t hidden = config_.hidden_size;
  const size_t row_bytes = hidden * math::DTypeSize(embed_.dtype);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto* row = static_cast<const uint8_t*>(embed_.data) + size_t(tokens[i]) * row_bytes;
    math::ConvertToF32(row, embed_.dtype, hidden, x + i * hidden);
  }
}

void Transformer::Logits(const float* xn, size_t rows, float* out) const {
  math::MatMul(xn, rows, lm_head_, out, pool_);
}

// Runs every layer over `rows` tokens whose embeddings are in s.x. Row i
// belongs to sequence seq_of_row[i]; rows of one sequence are consecutive
// positions in order (a prefill chunk), or each row is its own sequence (a
// decode batch). On return s.x holds the final hidden states (pre-norm).
absl::Status Transformer::RunLayers(ForwardScratch& s, size_t rows,
                                    std::span<SequenceKv* const> seq_of_row,
                                    bool causal_chunk) const {
  const ModelConfig& c = config_;
  const size_t hidden = c.hidden_size, hd = c.head_dim, nq = c.num_attention_heads,
               nkv = c.num_key_value_heads, inter = c.intermediate_size;
  const size_t hpk = nq / nkv;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const size_t half = hd / 2;
  // The QSA indexer of layer l for a sequence (null: dense attention).
  auto qsa_of = [](const SequenceKv* seq, size_t l) -> const qsa::QsaIndexer* {
    const auto& ix = seq->qsa_.indexer_;
    return l < ix.size() ? ix[l] : nullptr;
  };

  // Row-wise elementwise work (norms, RoPE, SwiGLU, residual adds): rows are
  // independent, so a prefill chunk spreads them over the pool (same bits
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
    math::MatMul(s.xn.data(), rows, w.q_proj, s.q.data(), pool_);
    math::MatMul(s.xn.data(), rows, w.k_proj, s.k.data(), pool_);
    math::MatMul(s.xn.data(), rows, w.v_proj, s.v.data(), pool_);
    // Per row: bias, q/k norm, RoPE (independent rows: parallel for a chunk).
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
    for (size_t i = 0; i < rows; ++i) {
      const float* q = s.q.data() + i * nq * hd;
      const float* k = s.k.data() + i * nkv * hd;
      const float* v = s.v.data() + i * nkv * hd;
      // Append in row order: a prefill chunk's rows land at consecutive
      // positions; row i then attends over exactly the rows before it.
      // A sealed O(1) layer keeps no rows: O1Step inserts (k, v) below.
      kv::LayerKvCache& cache = seq_of_row[i]->layers()[l];
      if (cache.O1Sealed()) continue;
      cache.Append({k, nkv * hd}, {v, nkv * hd});
      // The O(1) query trace (no-op unless this layer is collecting its
      // prompt): every prefill flavour passes here, in position order.
      cache.O1PushQ({q, nq * hd});
    }
    // QSA decode rows: ingest the row's key and select its blocks now, so a
    // row past the inert bound skips dense attention below (sel.active).
    // One row per sequence in a decode batch; the selection buffers are
    // reused, so a warm step does not allocate.
    bool any_qsa_decode = false;
    if (!causal_chunk) {
      for (size_t i = 0; i < rows; ++i) {
        qsa::QsaSelection& sel = s.qsa_sel[i];
        sel.active = false;
        SequenceKv* const seq = seq_of_row[i];
        const qsa::QsaIndexer* ix = qsa_of(seq, l);
        if (ix == nullptr) continue;
        const size_t pos = seq->layers()[l].seq_len() - 1;
        CORTIQ_RETURN_IF_ERROR(ix->DecodeSelect(seq->qsa_.state_[l], P(s.xn.data() + i * hidden),
                                                pos, QsaScratchOf(s), &sel));
        any_qsa_decode = any_qsa_decode || sel.active;
      }
    }
    // Attention: one task per (row, KV group); row i of a chunk sees the
    // positions up to its own (causal), recorded as `visible`. A sealed O(1)
    // layer is stepped by the (first row, group 0) task of each run of rows
    // of its sequence, rows in position order (causal by construction; one
    // row per sequence in a decode batch, so sequences run in parallel).
    // Rows of a causal chunk cost in proportion to their position, and the
    // pool hands out contiguous ranges: task order interleaves the cheapest
    // and the dearest rows (0, n-1, 1, n-2, ...) so each thread gets an equal
    // share of the work.
    const size_t tasks = rows * nkv;
    // later[i]: rows of the same sequence after row i, appended above and
    // hidden from it (causal mask). The workers read it through the pointer.
    thread_local std::vector<uint32_t> later_buf;
    if (later_buf.size() < rows) later_buf.resize(std::max<size_t>(rows, 2 * later_buf.size()));
    uint32_t* const later = later_buf.data();
    for (size_t i = rows; i-- > 0;) {
      const bool last_of_seq = i + 1 == rows || seq_of_row[i + 1] != seq_of_row[i];
      later[i] = last_of_seq ? 0u : later[i + 1] + 1;
    }
    // A long prefill chunk of one exact f32 sequence: tiled attention.
    const kv::LayerKvCache& cache0 = seq_of_row[0]->layers()[l];
    const bool tiled = causal_chunk && rows >= kTiledAttentionMinRows &&
                       cache0.mode() == kv::KvMode::kF32 && !cache0.O1Sealed() &&
                       !cache0.HasDeadHeads() && seq_of_row[rows - 1] == seq_of_row[0];
    if (tiled) PrefillAttentionTiled(s, cache0, rows);
    pool_->ParallelFor(tiled ? 0 : tasks, [&](size_t begin, size_t end) {
      for (size_t t = begin; t < end; ++t) {
        const size_t k = t / nkv, g = t % nkv;
        const size_t i = (k % 2 == 0) ? k / 2 : rows - 1 - k / 2;
        SequenceKv* const seq = seq_of_row[i];
        if (seq->layers()[l].O1Sealed()) {
          if (g != 0 || (i > 0 && seq_of_row[i - 1] == seq)) continue;
          kv::LayerKvCache& o1 = seq->layers()[l];
          for (size_t r = i; r < rows && seq_of_row[r] == seq; ++r) {
            o1.O1Step({s.q.data() + r * nq * hd, nq * hd}, {s.k.data() + r * nkv * hd, nkv * hd},
                      {s.v.data() + r * nkv * hd, nkv * hd}, nq,
                      {s.att.data() + r * nq * hd, nq * hd});
          }
          continue;
        }
        if (any_qsa_decode && s.qsa_sel[i].active) continue;  // sparse, below
        const kv::LayerKvCache& cache = seq->layers()[l];
        const size_t visible = cache.HeadLen(g) - later[i];
        kv::AttendOptions opt;
        opt.scale = scale;
        opt.end = visible;
        cache.AttendGroup({s.q.data() + (i * nq + g * hpk) * hd, hpk * hd}, g, hpk,
                          {s.att.data() + (i * nq + g * hpk) * hd, hpk * hd},
                          {ThreadScores(cache.GroupProbsSize(hpk)), hpk * visible}, /*imp_acc=*/{},
                          opt);
      }
    });
    // QSA: replace the context of rows past the inert bound with attention
    // over their selected blocks. Before o_proj, which overwrites s.xn.
    if (causal_chunk) {
      for (size_t i = 0; i < rows;) {
        size_t n = 1;
        while (i + n < rows && seq_of_row[i + n] == seq_of_row[i]) ++n;
        if (qsa_of(seq_of_row[i], l) != nullptr) {
          CORTIQ_RETURN_IF_ERROR(QsaPrefillLayer(s, l, *seq_of_row[i], i, n));
        }
        i += n;
      }
    } else if (any_qsa_decode) {
      for (size_t i = 0; i < rows; ++i) {
        const qsa::QsaSelection& sel = s.qsa_sel[i];
        if (!sel.active) continue;
        const qsa::QsaIndexer* ix = qsa_of(seq_of_row[i], l);
        CORTIQ_RETURN_IF_ERROR(s.qsa_pool.Bind(seq_of_row[i]->layers()[l], ix->geometry().ratio));
        CORTIQ_RETURN_IF_ERROR(ix->AttendSelection(sel, P(s.q.data() + i * nq * hd),
                                                   P(s.att.data() + i * nq * hd), s.qsa_pool.pool(),
                                                   s.qsa_pool.table(), nq, scale, QsaScratchOf(s)));
      }
    }
    math::MatMul(s.att.data(), rows, w.o_proj, s.xn.data(), pool_);
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
    math::MatMul(s.xn.data(), rows, w.gate_proj, s.gate.data(), pool_);
    math::MatMul(s.xn.data(), rows, w.up_proj, s.up.data(), pool_);
    for_rows([&](size_t i) {
      float* g = s.gate.data() + i * inter;
      math::SwiGlu(g, s.up.data() + i * inter, inter, g);
    });
    math::MatMul(s.gate.data(), rows, w.down_proj, s.xn.data(), pool_);
    for_rows([&](size_t i) {
      float* x = s.x.data() + i * hidden;
      const float* d = s.xn.data() + i * hidden;
      for (size_t j = 0; j < hidden; ++j) x[j] += d[j];
    });
  }
  return absl::OkStatus();
}

void Transformer::PrefillAttentionTiled(ForwardScratch& s, const kv::LayerKvCache& cache,
                                        size_t rows) const {
  const size_t hd = config_.head_dim, nq = config_.num_attention_heads,
               nkv = config_.num_key_value_heads, hpk = nq / nkv;
  const size_t len = cache.seq_len();  // the chunk's rows are the last `rows`
  const size_t start = len - rows;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const size_t tile = kTiledAttentionTile;
  const size_t n_tiles = (rows + tile - 1) / tile;
  // Tiles cost in proportion to their last position: interleave cheap and
  // dear ones (0, n-1, 1, n-2, ...) so the pool's contiguous ranges balance.
  pool_->ParallelFor(n_tiles * nkv, [&](size_t begin, size_t end) {
    for (size_t task = begin; task < end; ++task) {
      const size_t k = task / nkv, g = task % nkv;
      const size_t ti = (k % 2 == 0) ? k / 2 : n_tiles - 1 - k / 2;
      const size_t i0 = ti * tile, i1 = std::min(rows, i0 + tile);
      const size_t m = (i1 - i0) * hpk;  // query vectors in the tile
      const size_t n = start + i1;       // keys visible to the tile's last row
      // Per-thread buffers, grown geometrically (no allocation once warm).
      thread_local util::AlignedBuffer<float> qbuf, sbuf, vtbuf, obuf;
      auto grow = [](util::AlignedBuffer<float>& b, size_t want) {
        if (b.size() < want) b.Resize(std::max(want, 2 * b.size()));
      };
      grow(qbuf, m * hd);
      grow(sbuf, m * n);
      grow(vtbuf, hd * n);
      grow(obuf, m * hd);
      // Q tile, contiguous: row (i, j) = query head g·hpk + j of chunk row i.
      for (size_t i = i0; i < i1; ++i) {
        std::memcpy(qbuf.data() + (i - i0) * hpk * hd, s.q.data() + (i * nq + g * hpk) * hd,
                    hpk * hd * sizeof(float));
      }
      // Scores [m × n] = Q · Kᵀ (K rows are the nn.Linear layout [n × hd]).
      const math::WeightView kw{cache.HeadKeys(g).data(), math::DType::kF32, n, hd};
      math::MatMul(qbuf.data(), m, kw, sbuf.data(), nullptr);
      // Causal softmax per query vector: row i sees keys [0, start + i].
      for (size_t r = 0; r < m; ++r) {
        const size_t i = i0 + r / hpk;
        float* sr = sbuf.data() + r * n;
        const size_t vis = start + i + 1;
        for (size_t t = 0; t < vis; ++t) sr[t] *= scale;
        math::Softmax(sr, vis);
        std::fill(sr + vis, sr + n, 0.0f);
      }
      // Out [m × hd] = P · V, V transposed once per tile ([hd × n]).
      const float* v = cache.HeadValues(g).data();
      for (size_t t = 0; t < n; ++t) {
        for (size_t e = 0; e < hd; ++e) vtbuf[e * n + t] = v[t * hd + e];
      }
      const math::WeightView vw{vtbuf.data(), math::DType::kF32, hd, n};
      math::MatMul(sbuf.data(), m, vw, obuf.data(), nullptr);
      for (size_t i = i0; i < i1; ++i) {
        std::memcpy(s.att.data() + (i * nq + g * hpk) * hd, obuf.data() + (i - i0) * hpk * hd,
                    hpk * hd * sizeof(float));
      }
    }
  });
}

absl::Status Transformer::QsaPrefillLayer(ForwardScratch& s, size_t l, SequenceKv& kv, size_t i0,
                                          size_t n) const {
  const size_t hidden = config_.hidden_size, nq = config_.num_attention_heads,
               hd = config_.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const qsa::QsaIndexer& ix = *kv.qsa_.indexer_[l];
  qsa::QsaSeqState& st = kv.qsa_.state_[l];
  const kv::LayerKvCache& cache = kv.layers()[l];
  const size_t start = cache.seq_len() - n;  // the run's rows were appended above
  qsa::QsaScratch& scratch = QsaScratchOf(s);
  const float* xn = s.xn.data() + i0 * hidden;
  CORTIQ_RETURN_IF_ERROR(ix.PrefillIngest(st, P(xn), n, start, scratch));
  if (start + n <= ix.InertBound()) return absl::OkStatus();  // every row stays dense
  CORTIQ_RETURN_IF_ERROR(s.qsa_pool.Bind(cache, ix.geometry().ratio));
  return ix.PrefillSelect(st, P(xn), P(s.q.data() + i0 * nq * hd), P(s.att.data() + i0 * nq * hd),
                          s.qsa_pool.pool(), s.qsa_pool.table(), start, n, nq, scale, scratch);
}

qsa::QsaScratch& Transformer::QsaScratchOf(ForwardScratch& s) const {
  if (s.qsa_runtime != qsa_ || s.qsa_scratch == nullptr) {
    s.qsa_scratch.reset();  // frees through the old runtime, still held
    s.qsa_runtime = qsa_;
    s.qsa_scratch = std::make_unique<qsa::QsaScratch>(&qsa_->backend);
  }
  return *s.qsa_scratch;
}

absl::StatusOr<const qsa::QsaIndexer*> Transformer::QsaIndexerFor(size_t layer, size_t ratio,
                                                                  size_t budget) const {
  std::lock_guard<std::mutex> lock(qsa_->mu);
  auto& per_layer = qsa_->indexers[{ratio, budget}];
  if (per_layer.empty()) per_layer.resize(layers_.size());
  if (per_layer[layer] == nullptr) {
    const ModelConfig& c = config_;
    const size_t hidden = c.hidden_size, nq = c.num_attention_heads, nkv = c.num_key_value_heads,
                 hd = c.head_dim;
    // One code path: checkpoint indexer tensors when present, else derived
    // from the layer's q/k projections (core/qsa/indexer_weights.h).
    CORTIQ_ASSIGN_OR_RETURN(
        qsa::IndexerWeights w,
        qsa::LoadIndexerWeights(CkptSource(*checkpoint_), layer, {hidden, nq, nkv, hd}));
    qsa::QsaGeometry g;
    g.n_heads = w.n_heads;
    g.hd = w.hd;
    g.ratio = ratio;
    g.budget = budget;
    g.rot = w.hd;  // full-width RoPE, as the layer's own heads (derived: exact)
    g.theta = c.rope_theta;
    g.eps = static_cast<float>(c.rms_norm_eps);
    g.hidden = hidden;
    g.nkv_attn = nkv;
    g.hd_attn = hd;
    CORTIQ_ASSIGN_OR_RETURN(per_layer[layer], qsa::QsaIndexer::New(&qsa_->backend, w, g));
  }
  return per_layer[layer].get();
}

size_t Transformer::QsaWeightBytes() const {
  std::lock_guard<std::mutex> lock(qsa_->mu);
  size_t total = 0;
  for (const auto& [key, per_layer] : qsa_->indexers) {
    for (const auto& ix : per_layer) total += ix != nullptr ? ix->WeightBytes() : 0;
  }
  return total;
}

absl::Status Transformer::BindQsa(SequenceKv& kv) const {
  if (!kv.qsa_config_.has_value() || kv.qsa_.bound()) return absl::OkStatus();
  const QsaConfig& cfg = *kv.qsa_config_;
  QsaSeqStates bound;
  bound.runtime_ = qsa_;
  bound.indexer_.assign(layers_.size(), nullptr);
  bound.state_.resize(layers_.size());
  for (size_t l : cfg.layers) {
    // On error `bound` releases what it holds so far.
    CORTIQ_ASSIGN_OR_RETURN(const qsa::QsaIndexer* ix, QsaIndexerFor(l, cfg.ratio, cfg.budget));
    CORTIQ_ASSIGN_OR_RETURN(bound.state_[l], ix->NewSeqState(kv.layers()[l].capacity()));
    bound.indexer_[l] = ix;
  }
  kv.qsa_ = std::move(bound);
  return absl::OkStatus();
}

absl::Status Transformer::QsaIngestRows(SequenceKv& kv, size_t layer, const float* normed,
                                        size_t rows) const {
  CORTIQ_RETURN_IF_ERROR(BindQsa(kv));
  if (layer >= kv.qsa_.indexer_.size() || kv.qsa_.indexer_[layer] == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("qsa: layer ", layer, " is not a QSA layer of this sequence"));
  }
  qsa::QsaSeqState& st = kv.qsa_.state_[layer];
  qsa::QsaScratch scratch(&qsa_->backend);
  return kv.qsa_.indexer_[layer]->PrefillIngest(st, P(normed), rows, st.ingested(), scratch);
}

absl::Status Transformer::QsaRestoreAux(SequenceKv& kv, size_t layer,
                                        std::span<const uint8_t> blob) const {
  CORTIQ_RETURN_IF_ERROR(BindQsa(kv));
  if (layer >= kv.qsa_.indexer_.size() || kv.qsa_.indexer_[layer] == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("qsa: layer ", layer, " is not a QSA layer of this sequence"));
  }
  return kv.qsa_.indexer_[layer]->RestoreAux(kv.qsa_.state_[layer], blob);
}

absl::Status Transformer::Prefill(std::span<const int32_t> tokens, SequenceKv& kv,
                                  ForwardScratch& s, float* last_logits, float* all_logits) const {
  if (tokens.empty()) return absl::InvalidArgumentError("prefill: no tokens");
  CORTIQ_RETURN_IF_ERROR(CheckTokens(tokens));
  const size_t start = kv.position(), rows = tokens.size();
  if (start + rows > size_t(config_.max_position_embeddings)) {
    return absl::InvalidArgumentError(absl::StrCat("prefill: position ", start, " + ", rows,
                                                   " tokens exceeds the model's context of ",
                                                   config_.max_position_embeddings));
  }
  if (kv.layers().size() != layers_.size()) {
    return absl::InvalidArgumentError("prefill: the sequence state belongs to another geometry");
  }
  if (start == 0 && kv.o1_config().has_value()) {
    // First prefill of a fresh sequence: the selected layers record their
    // query trace through this and any following chunk until SealO1.
    const kv::O1Config& o1 = *kv.o1_config();
    for (size_t l : o1.layers) {
      CORTIQ_RETURN_IF_ERROR(kv.layers()[l].O1Begin(o1.m, o1.w, o1.sink, o1.rect));
    }
  }
  CORTIQ_RETURN_IF_ERROR(BindQsa(kv));
  EnsureScratch(s, rows, start + rows);
  kv.Reserve(start + rows);
  // Positions of the chunk, held on the stack-free path of the scratch.
  thread_local std::vector<size_t> positions;
  thread_local std::vector<SequenceKv*> seq_of_row;
  positions.resize(rows);
  seq_of_row.assign(rows, &kv);
  for (size_t i = 0; i < rows; ++i) positions[i] = start + i;
  RopeTables(s, positions);
  Embed(tokens, s.x.data());
  CORTIQ_RETURN_IF_ERROR(RunLayers(s, rows, seq_of_row, /*causal_chunk=*/true));

  const size_t hidden = config_.hidden_size, vocab = config_.vocab_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  if (all_logits != nullptr) {
    for (size_t i = 0; i < rows; ++i) {
      math::RmsNorm(s.x.data() + i * hidden, final_norm_.data(), eps, hidden,
                    s.xn.data() + i * hidden);
    }
    Logits(s.xn.data(), rows, all_logits);
    if (last_logits != nullptr) {
      std::memcpy(last_logits, all_logits + (rows - 1) * vocab, vocab * sizeof(float));
    }
  } else if (last_logits != nullptr) {
    math::RmsNorm(s.x.data() + (rows - 1) * hidden, final_norm_.data(), eps, hidden, s.xn.data());
    Logits(s.xn.data(), 1, last_logits);
  }
  return absl::OkStatus();
}

absl::Status Transformer::DecodeBatch(std::span<const int32_t> tokens,
                                      std::span<SequenceKv* const> kvs, ForwardScratch& s,
                                      float* logits) const {
  if (tokens.empty() || tokens.size() != kvs.size()) {
    return absl::InvalidArgumentError("decode: tokens and sequences must pair up, one each");
  }
  CORTIQ_RETURN_IF_ERROR(CheckTokens(tokens));
  const size_t rows = tokens.size();
  size_t max_len = 0;
  for (size_t b = 0; b < rows; ++b) {
    const size_t pos = kvs[b]->position();
    if (pos + 1 > size_t(config_.max_position_embeddings)) {
      return absl::InvalidArgumentError(absl::StrCat("decode: sequence ", b, " is at position ",
                                                     pos, ", the model's context is ",
                                                     config_.max_position_embeddings));
    }
    for (size_t j = 0; j < b; ++j) {
      if (kvs[j] == kvs[b]) {
        return absl::InvalidArgumentError("decode: a sequence appears twice in one batch");
      }
    }
    max_len = std::max(max_len, pos + 1);
  }
  for (SequenceKv* kv : kvs) {
    // A sequence decodes once its prompt is complete: seal what is armed.
    if (kv->O1Collecting()) SealO1(*kv);
    CORTIQ_RETURN_IF_ERROR(BindQsa(*kv));
  }
  EnsureScratch(s, rows, max_len);
  if (s.qsa_sel.size() < rows) s.qsa_sel.resize(rows);
  // QSA launch scratch grows with the visible length; size it for the
  // reserved capacity so warm steps within it never allocate.
  for (SequenceKv* kv : kvs) {
    const auto& ix = kv->qsa_.indexer_;
    for (size_t l = 0; l < ix.size(); ++l) {
      if (ix[l] == nullptr) continue;
      const size_t visible = std::max(kv->layers()[l].capacity(), kv->position() + 1);
      CORTIQ_RETURN_IF_ERROR(QsaScratchOf(s).Reserve(ix[l]->ScratchBytes(1, visible)));
    }
  }
  thread_local std::vector<size_t> positions;
  positions.resize(rows);
  for (size_t b = 0; b < rows; ++b) positions[b] = kvs[b]->position();
  RopeTables(s, positions);
  Embed(tokens, s.x.data());
  CORTIQ_RETURN_IF_ERROR(RunLayers(s, rows, kvs, /*causal_chunk=*/false));
  const size_t hidden = config_.hidden_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  for (size_t b = 0; b < rows; ++b) {
    math::RmsNorm(s.x.data() + b * hidden, final_norm_.data(), eps, hidden,
                  s.xn.data() + b * hidden);
  }
  Logits(s.xn.data(), rows, logits);
  return absl::OkStatus();
}

size_t Transformer::SealO1(SequenceKv& kv) const {
  // One warning per process: a config that cannot seal (e.g. O(1) asked for
  // on int8 sessions) would otherwise log on every request.
  static std::atomic<bool> warned{false};
  size_t sealed = 0;
  for (size_t l = 0; l < kv.layers().size(); ++l) {
    kv::LayerKvCache& layer = kv.layers()[l];
    if (!layer.O1Collecting()) continue;
    const absl::Status st = layer.O1Seal(static_cast<size_t>(config_.num_attention_heads));
    if (st.ok()) {
      ++sealed;
      continue;
    }
    const std::string why(st.message());
    if (!warned.exchange(true, std::memory_order_relaxed)) {
      spdlog::warn("o1: layer {} keeps exact attention: {} (further refusals log at debug level)",
                   l, why);
    } else {
      spdlog::debug("o1: layer {} keeps exact attention: {}", l, why);
    }
  }
  return sealed;
}

}  // namespace cortiq::model
