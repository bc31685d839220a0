// QsaIndexer / QsaSeqState / QsaScratch (see the header and docs/QSA.md).
//
// Every method validates its arguments and the state's counters first, then
// launches backend work, and updates the counters only once every launch has
// returned OK: a failed call leaves the counters as they were.
#include "core/qsa/qsa_indexer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/util/status_macros.h"
#include "spdlog/spdlog.h"

namespace cortiq::qsa {
namespace {

constexpr size_t kBf16 = 2;
constexpr size_t kHeaderBytes = 2 * sizeof(uint64_t);

size_t RoundUp64(size_t bytes) { return (bytes + 63) / 64 * 64; }

void PutU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

// Keeps the first error; later ones only add to the log.
void Keep(absl::Status& first, const absl::Status& s) {
  if (!s.ok() && first.ok()) first = s;
}

}  // namespace

// ------------------------------------------------------------ QsaSeqState

QsaSeqState::QsaSeqState(QsaSeqState&& o) noexcept
    : owner_(o.owner_),
      raw_keys_(std::exchange(o.raw_keys_, DevicePtr{})),
      block_keys_(std::exchange(o.block_keys_, DevicePtr{})),
      raw_bytes_(std::exchange(o.raw_bytes_, 0)),
      block_bytes_(std::exchange(o.block_bytes_, 0)),
      capacity_(std::exchange(o.capacity_, 0)),
      ingested_(std::exchange(o.ingested_, 0)),
      pooled_(std::exchange(o.pooled_, 0)) {}

QsaSeqState& QsaSeqState::operator=(QsaSeqState&& o) noexcept {
  if (this == &o) return *this;
  if (MemoryBytes() != 0) {
    spdlog::warn("QsaSeqState overwritten while holding {} bytes: they leak (call ReleaseSeqState)",
                 MemoryBytes());
  }
  owner_ = o.owner_;
  raw_keys_ = std::exchange(o.raw_keys_, DevicePtr{});
  block_keys_ = std::exchange(o.block_keys_, DevicePtr{});
  raw_bytes_ = std::exchange(o.raw_bytes_, 0);
  block_bytes_ = std::exchange(o.block_bytes_, 0);
  capacity_ = std::exchange(o.capacity_, 0);
  ingested_ = std::exchange(o.ingested_, 0);
  pooled_ = std::exchange(o.pooled_, 0);
  return *this;
}

QsaSeqState::~QsaSeqState() {
  if (MemoryBytes() != 0) {
    spdlog::warn("QsaSeqState destroyed while holding {} bytes: they leak (call ReleaseSeqState)",
                 MemoryBytes());
  }
}

// ------------------------------------------------------------- QsaScratch

QsaScratch::~QsaScratch() {
  absl::Status s = Release();
  if (!s.ok()) spdlog::warn("QsaScratch: freeing the launch scratch failed: {}", s.ToString());
}

absl::Status QsaScratch::Reserve(size_t bytes) {
  if (bytes <= bytes_) return absl::OkStatus();
  const size_t want = RoundUp64(std::max(bytes, 2 * bytes_));
  CORTIQ_RETURN_IF_ERROR(Release());
  CORTIQ_ASSIGN_OR_RETURN(data_, backend_->Allocate(want));
  bytes_ = want;
  return absl::OkStatus();
}

absl::Status QsaScratch::Release() {
  const DevicePtr p = std::exchange(data_, DevicePtr{});
  bytes_ = 0;
  return backend_->Free(p);
}

// ------------------------------------------------------------- QsaIndexer

absl::StatusOr<std::unique_ptr<QsaIndexer>> QsaIndexer::New(Backend* backend,
                                                            const IndexerWeights& w,
                                                            const QsaGeometry& g) {
  if (backend == nullptr) return absl::InvalidArgumentError("QsaIndexer: backend is null");
  auto bad = [](const char* field, auto value, const std::string& want) {
    return absl::InvalidArgumentError(
        absl::StrCat("QsaIndexer: geometry.", field, " = ", value, ": ", want));
  };
  if (g.n_heads == 0) return bad("n_heads", g.n_heads, "must be >= 1");
  if (g.hd == 0) return bad("hd", g.hd, "must be >= 1");
  if (g.ratio == 0) return bad("ratio", g.ratio, "must be >= 1");
  if (g.budget < 2) return bad("budget", g.budget, "must be >= 2 (sink + current block)");
  if (g.budget > std::numeric_limits<uint32_t>::max() ||
      g.ratio > std::numeric_limits<size_t>::max() / g.budget) {
    return bad("budget", g.budget, "budget · ratio overflows");
  }
  if (g.rot % 2 != 0 || g.rot > g.hd) return bad("rot", g.rot, "must be even and <= hd");
  if (g.rot > 0 && !(g.theta > 0.0)) return bad("theta", g.theta, "must be > 0");
  if (!(g.eps > 0.0f)) return bad("eps", g.eps, "must be > 0");
  if (g.hidden == 0) return bad("hidden", g.hidden, "must be >= 1");
  if (g.nkv_attn == 0) return bad("nkv_attn", g.nkv_attn, "must be >= 1");
  if (g.hd_attn == 0) return bad("hd_attn", g.hd_attn, "must be >= 1");
  if (w.n_heads != g.n_heads) {
    return bad("n_heads", g.n_heads, absl::StrCat("the weights have ", w.n_heads));
  }
  if (w.hd != g.hd) return bad("hd", g.hd, absl::StrCat("the weights have ", w.hd));
  if (w.hidden != g.hidden) {
    return bad("hidden", g.hidden, absl::StrCat("the weights have ", w.hidden));
  }
  const size_t rows = (g.n_heads + 1) * g.hd;
  if (w.qk_proj.size() != rows * g.hidden * math::DTypeSize(w.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("QsaIndexer: weights.qk_proj holds ", w.qk_proj.size(), " bytes, expected [",
                     rows, " × ", g.hidden, "] ", math::DTypeName(w.dtype)));
  }
  if (!w.qk_bias.empty() && w.qk_bias.size() != rows) {
    return absl::InvalidArgumentError(absl::StrCat("QsaIndexer: weights.qk_bias has ",
                                                   w.qk_bias.size(), " floats, expected ", rows));
  }
  if (w.q_norm.empty() != w.k_norm.empty() ||
      (!w.q_norm.empty() && (w.q_norm.size() != g.hd || w.k_norm.size() != g.hd))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "QsaIndexer: weights.q_norm / k_norm must both be empty or both have hd = ", g.hd,
        " floats (have ", w.q_norm.size(), " and ", w.k_norm.size(), ")"));
  }

  std::unique_ptr<QsaIndexer> ix(new QsaIndexer(backend, g));
  ix->w_dtype_ = w.dtype;
  // On an error below, ~QsaIndexer frees whatever was uploaded.
  CORTIQ_RETURN_IF_ERROR(ix->Upload(w.qk_proj.data(), w.qk_proj.size(), &ix->w_));
  if (!w.qk_bias.empty()) {
    CORTIQ_RETURN_IF_ERROR(ix->Upload(w.qk_bias.data(), rows * sizeof(float), &ix->bias_));
  }
  if (!w.q_norm.empty()) {
    CORTIQ_RETURN_IF_ERROR(ix->Upload(w.q_norm.data(), g.hd * sizeof(float), &ix->q_norm_));
    CORTIQ_RETURN_IF_ERROR(ix->Upload(w.k_norm.data(), g.hd * sizeof(float), &ix->k_norm_));
  }
  if (g.rot > 0) {
    // inv_freq[i] = theta^(-2i/rot) in f64, as the transformer forms its own.
    std::vector<float> inv_freq(g.rot / 2);
    for (size_t i = 0; i < inv_freq.size(); ++i) {
      inv_freq[i] = static_cast<float>(
          std::pow(g.theta, -2.0 * static_cast<double>(i) / static_cast<double>(g.rot)));
    }
    CORTIQ_RETURN_IF_ERROR(
        ix->Upload(inv_freq.data(), inv_freq.size() * sizeof(float), &ix->inv_freq_));
  }
  return ix;
}

absl::Status QsaIndexer::Upload(const void* host, size_t bytes, DevicePtr* out) {
  const size_t alloc = RoundUp64(bytes);
  CORTIQ_ASSIGN_OR_RETURN(*out, backend_->Allocate(alloc));
  weight_bytes_ += alloc;
  return backend_->CopyToDevice(*out, host, bytes, kDefaultStream);
}

QsaIndexer::~QsaIndexer() {
  absl::Status first;
  for (DevicePtr* p : {&w_, &bias_, &q_norm_, &k_norm_, &inv_freq_}) {
    Keep(first, backend_->Free(std::exchange(*p, DevicePtr{})));
  }
  if (!first.ok()) spdlog::warn("QsaIndexer: freeing the weights failed: {}", first.ToString());
}

size_t QsaIndexer::StateBytes(size_t capacity_tokens) const {
  if (capacity_tokens == 0) return 0;
  const size_t blocks = capacity_tokens / g_.ratio;
  return RoundUp64(capacity_tokens * g_.hd * kBf16) +
         (blocks == 0 ? 0 : RoundUp64(blocks * g_.hd * kBf16));
}

QsaIndexer::Layout QsaIndexer::ScratchLayout(size_t rows, size_t num_blocks, size_t sel_ld) const {
  Layout l;
  size_t at = 0;
  auto region = [&at](size_t bytes) {
    const size_t off = at;
    at += RoundUp64(bytes);
    return off;
  };
  l.keys = region(rows * g_.hd * sizeof(float));
  l.q = region(rows * g_.n_heads * g_.hd * sizeof(float));
  l.scores = region(rows * num_blocks * sizeof(float));
  l.selected = region(rows * sel_ld * sizeof(uint32_t));
  l.counts = region(rows * sizeof(uint32_t));
  l.total = at;
  return l;
}

size_t QsaIndexer::ScratchBytes(size_t rows, size_t visible) const {
  return ScratchLayout(rows, visible / g_.ratio, g_.budget).total;
}

absl::Status QsaIndexer::CheckOwner(const QsaSeqState& st, const char* what) const {
  if (st.owner_ != this) {
    return absl::InvalidArgumentError(
        absl::StrCat("QsaIndexer::", what, ": the state was not created by this indexer"));
  }
  return absl::OkStatus();
}

absl::Status QsaIndexer::CheckPool(const KvPool& pool, const BlockTable& table, size_t positions,
                                   size_t nq, const char* what) const {
  auto bad = [what](auto... msg) {
    return absl::InvalidArgumentError(absl::StrCat("QsaIndexer::", what, ": ", msg...));
  };
  if (pool.num_kv_heads != g_.nkv_attn || pool.head_dim != g_.hd_attn) {
    return bad("pool geometry [", pool.num_kv_heads, " heads × ", pool.head_dim,
               "] differs from the layer's [", g_.nkv_attn, " × ", g_.hd_attn, "]");
  }
  if (nq == 0 || nq % g_.nkv_attn != 0) {
    return bad("nq = ", nq, " is not a positive multiple of nkv_attn = ", g_.nkv_attn);
  }
  if (pool.k.null() || pool.v.null() || pool.block_size == 0) {
    return bad("pool has no k / v rows or block_size 0");
  }
  if (pool.dtype == KvDType::kInt8 && (pool.k_scale.null() || pool.v_scale.null())) {
    return bad("int8 pool without row scales");
  }
  if (table.ids.null() || table.num_blocks > std::numeric_limits<size_t>::max() / pool.block_size ||
      table.num_blocks * pool.block_size < positions) {
    return bad("block table covers ", table.num_blocks, " blocks of ", pool.block_size,
               " positions; ", positions, " needed");
  }
  return absl::OkStatus();
}

ProjectArgs QsaIndexer::QueryProjection(DevicePtr x, size_t rows, size_t pos0,
                                        DevicePtr out) const {
  ProjectArgs a;
  a.x = x;
  a.rows = rows;
  a.cols = g_.hidden;
  a.w = w_;  // rows [0, n_heads · hd)
  a.w_dtype = w_dtype_;
  a.heads = g_.n_heads;
  a.head_dim = g_.hd;
  a.bias = bias_;
  a.norm = q_norm_;
  a.eps = g_.eps;
  a.inv_freq = inv_freq_;
  a.rot = g_.rot;
  a.pos0 = pos0;
  a.out = out;
  return a;
}

ProjectArgs QsaIndexer::KeyProjection(DevicePtr x, size_t rows, size_t pos0, DevicePtr out) const {
  ProjectArgs a = QueryProjection(x, rows, pos0, out);
  const size_t q_rows = g_.n_heads * g_.hd;
  a.w = w_ + q_rows * g_.hidden * math::DTypeSize(w_dtype_);  // the last hd rows
  a.heads = 1;
  a.bias = bias_ + q_rows * sizeof(float);  // null stays null
  a.norm = k_norm_;
  return a;
}

// ------------------------------------------------------- state lifecycle

absl::StatusOr<QsaSeqState> QsaIndexer::NewSeqState(size_t capacity_tokens) const {
  QsaSeqState st;
  st.owner_ = this;
  CORTIQ_RETURN_IF_ERROR(Reserve(st, capacity_tokens));
  return st;
}

absl::Status QsaIndexer::ReleaseSeqState(QsaSeqState& st) const {
  if (st.owner_ == nullptr && st.MemoryBytes() == 0) return absl::OkStatus();  // never used
  CORTIQ_RETURN_IF_ERROR(CheckOwner(st, "ReleaseSeqState"));
  absl::Status first;
  // Null first, then free: whatever Free does, the state never names the
  // buffer again.
  const DevicePtr raw = std::exchange(st.raw_keys_, DevicePtr{});
  st.raw_bytes_ = 0;
  if (raw) Keep(first, backend_->Free(raw));
  const DevicePtr blocks = std::exchange(st.block_keys_, DevicePtr{});
  st.block_bytes_ = 0;
  if (blocks) Keep(first, backend_->Free(blocks));
  st.capacity_ = st.ingested_ = st.pooled_ = 0;
  return first;
}

absl::Status QsaIndexer::Reserve(QsaSeqState& st, size_t tokens, Stream stream) const {
  CORTIQ_RETURN_IF_ERROR(CheckOwner(st, "Reserve"));
  if (tokens <= st.capacity_) return absl::OkStatus();
  return Resize(st, std::max(tokens, 2 * st.capacity_), stream);
}

absl::Status QsaIndexer::ShrinkToFit(QsaSeqState& st, Stream stream) const {
  if (st.owner_ == nullptr && st.MemoryBytes() == 0) return absl::OkStatus();  // never used
  CORTIQ_RETURN_IF_ERROR(CheckOwner(st, "ShrinkToFit"));
  if (st.capacity_ == st.ingested_) return absl::OkStatus();
  if (st.ingested_ == 0) return ReleaseSeqState(st);  // keeps owner_: usable again
  return Resize(st, st.ingested_, stream);
}

absl::Status QsaIndexer::Resize(QsaSeqState& st, size_t cap, Stream stream) const {
  const size_t blocks = cap / g_.ratio;
  const size_t raw_bytes = RoundUp64(cap * g_.hd * kBf16);
  const size_t block_bytes = blocks == 0 ? 0 : RoundUp64(blocks * g_.hd * kBf16);

  CORTIQ_ASSIGN_OR_RETURN(DevicePtr raw, backend_->Allocate(raw_bytes));
  DevicePtr blk;
  absl::Status s;
  if (block_bytes != 0) {
    absl::StatusOr<DevicePtr> b = backend_->Allocate(block_bytes);
    if (b.ok()) blk = *b;
    s = b.status();
  }
  if (s.ok()) s = backend_->CopyOnDevice(raw, st.raw_keys_, st.ingested_ * g_.hd * kBf16, stream);
  if (s.ok()) s = backend_->CopyOnDevice(blk, st.block_keys_, st.pooled_ * g_.hd * kBf16, stream);
  if (!s.ok()) {  // the state keeps its old buffers
    (void)backend_->Free(raw);
    (void)backend_->Free(blk);
    return s;
  }
  // Swap in the new buffers, then free the old ones (the state is consistent
  // whatever the frees return).
  const DevicePtr old_raw = std::exchange(st.raw_keys_, raw);
  const DevicePtr old_blk = std::exchange(st.block_keys_, blk);
  st.raw_bytes_ = raw_bytes;
  st.block_bytes_ = block_bytes;
  st.capacity_ = cap;
  absl::Status first;
  Keep(first, backend_->Free(old_raw));
  Keep(first, backend_->Free(old_blk));
  return first;
}

absl::Status QsaIndexer::Truncate(QsaSeqState& st, size_t tokens) const {
  CORTIQ_RETURN_IF_ERROR(CheckOwner(st, "Truncate"));
  if (tokens > st.ingested_) {
    return absl::InvalidArgumentError(
        absl::StrCat("QsaIndexer::Truncate: tokens = ", tokens, " > ingested = ", st.ingested_));
  }
  st.ingested_ = tokens;
  st.pooled_ = tokens / g_.ratio;
  return absl::OkStatus();
}

absl::Status QsaIndexer::PoolUpTo(QsaSeqState& st, Stream stream) const {
  const size_t end = st.ingested_ / g_.ratio;
  if (end > st.pooled_) {
    PoolArgs p;
    p.raw = st.raw_keys_;
    p.pooled = st.block_keys_;
    p.hd = g_.hd;
    p.ratio = g_.ratio;
    p.first_block = st.pooled_;
    p.end_block = end;
    CORTIQ_RETURN_IF_ERROR(backend_->PoolBlocks(p, stream));
  }
  st.pooled_ = end;
  return absl::OkStatus();
}

// ------------------------------------------------------------- prefill

absl::Status QsaIndexer::PrefillIngest(QsaSeqState& st, DevicePtr normed, size_t num_tokens,
                                       size_t seq_start, QsaScratch& scratch, Stream stream) const {
  CORTIQ_RETURN_IF_ERROR(CheckOwner(st, "PrefillIngest"));
  if (num_tokens == 0 || normed.null()) {
    return absl::InvalidArgumentError("QsaIndexer::PrefillIngest: num_tokens = 0 or normed null");
  }
  if (seq_start != 0 && seq_start != st.ingested_) {
    return absl::FailedPreconditionError(
        absl::StrCat("QsaIndexer::PrefillIngest: seq_start = ", seq_start,
                     " but the state has ingested ", st.ingested_, " tokens"));
  }
  if (seq_start == 0) st.ingested_ = st.pooled_ = 0;  // reset (single sequence)
  CORTIQ_RETURN_IF_ERROR(Reserve(st, seq_start + num_tokens, stream));
  const Layout l = ScratchLayout(num_tokens, 0, 0);
  CORTIQ_RETURN_IF_ERROR(scratch.Reserve(l.total));
  const DevicePtr keys = scratch.data() + l.keys;
  CORTIQ_RETURN_IF_ERROR(
      backend_->Project(KeyProjection(normed, num_tokens, seq_start, keys), stream));
  CORTIQ_RETURN_IF_ERROR(backend_->StoreBf16(keys, st.raw_keys_ + seq_start * g_.hd * kBf16,
                                             num_tokens * g_.hd, stream));
  st.ingested_ = seq_start + num_tokens;
  return PoolUpTo(st, stream);
}

absl::Status QsaIndexer::ScoreAndSelect(const QsaSeqState& st, DevicePtr base, const Layout& l,
                                        size_t rows, size_t pos0, size_t num_blocks,
                                        Stream stream) const {
  ScoreArgs sc;
  sc.q = base + l.q;
  sc.rows = rows;
  sc.n_heads = g_.n_heads;
  sc.hd = g_.hd;
  sc.pooled = st.block_keys_;
  sc.num_blocks = num_blocks;
  sc.pos0 = pos0;
  sc.ratio = g_.ratio;
  sc.scores = base + l.scores;
  if (num_blocks > 1) CORTIQ_RETURN_IF_ERROR(backend_->ScoreBlocks(sc, stream));
  SelectArgs se;
  se.scores = sc.scores;
  se.rows = rows;
  se.ld = num_blocks;
  se.pos0 = pos0;
  se.ratio = g_.ratio;
  se.budget = g_.budget;
  se.selected = base + l.selected;
  se.counts = base + l.counts;
  return backend_->SelectTopK(se, stream);
}

absl::Status QsaIndexer::PrefillSelect(const QsaSeqState& st, DevicePtr normed, DevicePtr q_roped,
                                       DevicePtr attn_ctx, const KvPool& pool,
                                       const BlockTable& table, size_t seq_start, size_t num_tokens,
                                       size_t nq, float inv_sqrt_d, QsaScratch& scratch,
                                       Stream stream) const {
  CORTIQ_RETURN_IF_ERROR(CheckOwner(st, "PrefillSelect"));
  if (num_tokens == 0 || normed.null() || q_roped.null() || attn_ctx.null()) {
    return absl::InvalidArgumentError(
        "QsaIndexer::PrefillSelect: num_tokens = 0 or a null normed / q_roped / attn_ctx");
  }
  const size_t end = seq_start + num_tokens;
  if (st.ingested_ < end) {
    return absl::FailedPreconditionError(
        absl::StrCat("QsaIndexer::PrefillSelect: chunk [", seq_start, ", ", end, ") but only ",
                     st.ingested_, " tokens ingested (PrefillIngest precedes the select)"));
  }
  CORTIQ_RETURN_IF_ERROR(CheckPool(pool, table, end, nq, "PrefillSelect"));
  const size_t bound = InertBound();
  const size_t first = bound > seq_start ? bound - seq_start : 0;
  if (first >= num_tokens) return absl::OkStatus();  // all rows dense-exact

  const size_t rows = num_tokens - first;
  const size_t pos0 = seq_start + first;
  const size_t num_blocks = (end - 1) / g_.ratio;  // the last row's current block
  const Layout l = ScratchLayout(rows, num_blocks, g_.budget);
  CORTIQ_RETURN_IF_ERROR(scratch.Reserve(l.total));
  const DevicePtr base = scratch.data();
  CORTIQ_RETURN_IF_ERROR(backend_->Project(
      QueryProjection(normed + first * g_.hidden * sizeof(float), rows, pos0, base + l.q), stream));
  CORTIQ_RETURN_IF_ERROR(ScoreAndSelect(st, base, l, rows, pos0, num_blocks, stream));

  AttendArgs at;
  const size_t row_bytes = nq * g_.hd_attn * sizeof(float);
  at.q = q_roped + first * row_bytes;
  at.out = attn_ctx + first * row_bytes;
  at.rows = rows;
  at.nq = nq;
  at.scale = inv_sqrt_d;
  at.pool = pool;
  at.table = table;
  at.selected = base + l.selected;
  at.counts = base + l.counts;
  at.budget = g_.budget;
  at.pos0 = pos0;
  at.ratio = g_.ratio;
  return backend_->AttendSelected(at, stream);
}

// -------------------------------------------------------------- decode

absl::Status QsaIndexer::DecodeSelect(QsaSeqState& st, DevicePtr normed, size_t pos,
                                      QsaScratch& scratch, QsaSelection* out, Stream stream) const {
  CORTIQ_RETURN_IF_ERROR(CheckOwner(st, "DecodeSelect"));
  if (out == nullptr) return absl::InvalidArgumentError("QsaIndexer::DecodeSelect: out is null");
  if (pos != st.ingested_) {
    return absl::FailedPreconditionError(absl::StrCat("QsaIndexer::DecodeSelect: pos = ", pos,
                                                      " but the state has ingested ", st.ingested_,
                                                      " tokens"));
  }
  CORTIQ_RETURN_IF_ERROR(PrefillIngest(st, normed, 1, pos, scratch, stream));
  out->position = pos;
  out->blocks.clear();
  out->active = false;
  if (pos < InertBound()) return absl::OkStatus();

  const size_t num_blocks = pos / g_.ratio;
  const Layout l = ScratchLayout(1, num_blocks, g_.budget);
  CORTIQ_RETURN_IF_ERROR(scratch.Reserve(l.total));
  const DevicePtr base = scratch.data();
  CORTIQ_RETURN_IF_ERROR(backend_->Project(QueryProjection(normed, 1, pos, base + l.q), stream));
  CORTIQ_RETURN_IF_ERROR(ScoreAndSelect(st, base, l, 1, pos, num_blocks, stream));
  uint32_t count = 0;
  CORTIQ_RETURN_IF_ERROR(backend_->CopyToHost(&count, base + l.counts, sizeof(count), stream));
  out->blocks.resize(count);
  CORTIQ_RETURN_IF_ERROR(backend_->CopyToHost(out->blocks.data(), base + l.selected,
                                              count * sizeof(uint32_t), stream));
  out->active = true;
  return absl::OkStatus();
}

absl::Status QsaIndexer::AttendSelection(const QsaSelection& sel, DevicePtr q_roped,
                                         DevicePtr attn_ctx, const KvPool& pool,
                                         const BlockTable& table, size_t nq, float inv_sqrt_d,
                                         QsaScratch& scratch, Stream stream) const {
  if (q_roped.null() || attn_ctx.null()) {
    return absl::InvalidArgumentError("QsaIndexer::AttendSelection: null q_roped / attn_ctx");
  }
  const size_t cur = sel.position / g_.ratio;
  if (sel.blocks.empty()) {
    return absl::InvalidArgumentError(
        "QsaIndexer::AttendSelection: empty selection (an inactive selection attends densely)");
  }
  for (size_t i = 0; i < sel.blocks.size(); ++i) {
    if (sel.blocks[i] > cur || (i > 0 && sel.blocks[i] <= sel.blocks[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "QsaIndexer::AttendSelection: blocks must ascend strictly and be <= position / ratio = ",
          cur, " (blocks[", i, "] = ", sel.blocks[i], ")"));
    }
  }
  CORTIQ_RETURN_IF_ERROR(CheckPool(pool, table, sel.position + 1, nq, "AttendSelection"));
  const size_t n = sel.blocks.size();
  const Layout l = ScratchLayout(1, 0, n);
  CORTIQ_RETURN_IF_ERROR(scratch.Reserve(l.total));
  const DevicePtr base = scratch.data();
  const uint32_t count = static_cast<uint32_t>(n);
  CORTIQ_RETURN_IF_ERROR(
      backend_->CopyToDevice(base + l.selected, sel.blocks.data(), n * sizeof(uint32_t), stream));
  CORTIQ_RETURN_IF_ERROR(backend_->CopyToDevice(base + l.counts, &count, sizeof(count), stream));
  AttendArgs at;
  at.q = q_roped;
  at.out = attn_ctx;
  at.rows = 1;
  at.nq = nq;
  at.scale = inv_sqrt_d;
  at.pool = pool;
  at.table = table;
  at.selected = base + l.selected;
  at.counts = base + l.counts;
  at.budget = n;
  at.pos0 = sel.position;
  at.ratio = g_.ratio;
  return backend_->AttendSelected(at, stream);
}

// ------------------------------------------------------------ aux blob

absl::StatusOr<std::vector<uint8_t>> QsaIndexer::SnapshotAux(const QsaSeqState& st,
                                                             Stream stream) const {
  CORTIQ_RETURN_IF_ERROR(CheckOwner(st, "SnapshotAux"));
  const size_t key_bytes = st.ingested_ * g_.hd * kBf16;
  std::vector<uint8_t> blob(kHeaderBytes + key_bytes);
  PutU64(blob.data(), st.ingested_);
  PutU64(blob.data() + 8, st.pooled_);
  if (key_bytes != 0) {
    CORTIQ_RETURN_IF_ERROR(
        backend_->CopyToHost(blob.data() + kHeaderBytes, st.raw_keys_, key_bytes, stream));
  }
  return blob;
}

absl::Status QsaIndexer::CopyRawKeys(const QsaSeqState& st, size_t from, size_t count,
                                     uint8_t* dst, Stream stream) const {
  CORTIQ_RETURN_IF_ERROR(CheckOwner(st, "CopyRawKeys"));
  if (from > st.ingested_ || count > st.ingested_ - from) {
    return absl::OutOfRangeError(absl::StrCat("qsa raw keys [", from, ", ", from + count,
                                              ") past the ", st.ingested_, " ingested"));
  }
  if (count == 0) return absl::OkStatus();
  const size_t row = g_.hd * kBf16;
  return backend_->CopyToHost(dst, st.raw_keys_ + from * row, count * row, stream);
}

absl::Status QsaIndexer::RestoreAux(QsaSeqState& st, std::span<const uint8_t> blob,
                                    Stream stream) const {
  CORTIQ_RETURN_IF_ERROR(CheckOwner(st, "RestoreAux"));
  if (blob.size() < kHeaderBytes) {
    return absl::DataLossError(
        absl::StrCat("qsa aux blob: ", blob.size(), " bytes, shorter than its 16-byte header"));
  }
  const uint64_t ingested = GetU64(blob.data());
  const uint64_t pooled = GetU64(blob.data() + 8);
  const uint64_t row = g_.hd * kBf16;
  if (ingested > (std::numeric_limits<uint64_t>::max() - kHeaderBytes) / row ||
      blob.size() != kHeaderBytes + ingested * row) {
    return absl::DataLossError(absl::StrCat("qsa aux blob: ", blob.size(), " bytes for ", ingested,
                                            " tokens of hd = ", g_.hd,
                                            " (expected 16 + tokens · hd · 2)"));
  }
  if (pooled != ingested / g_.ratio) {
    return absl::DataLossError(absl::StrCat("qsa aux blob: pooled = ", pooled, " for ", ingested,
                                            " tokens at ratio ", g_.ratio, " (expected ",
                                            ingested / g_.ratio, ")"));
  }
  // The raw keys are bf16: a NaN or an infinity (exponent all ones) would
  // make every block score it touches NaN, so a stream holding one is
  // forged or corrupt.
  for (uint64_t i = 0; i < ingested * g_.hd; ++i) {
    const uint16_t bits =
        static_cast<uint16_t>(blob[kHeaderBytes + 2 * i] | (blob[kHeaderBytes + 2 * i + 1] << 8));
    if ((bits & 0x7F80u) == 0x7F80u) {
      return absl::DataLossError(absl::StrCat("qsa aux blob: non-finite key value at token ",
                                              i / g_.hd, ", element ", i % g_.hd));
    }
  }
  CORTIQ_RETURN_IF_ERROR(Reserve(st, ingested, stream));
  if (ingested != 0) {
    CORTIQ_RETURN_IF_ERROR(
        backend_->CopyToDevice(st.raw_keys_, blob.data() + kHeaderBytes, ingested * row, stream));
  }
  st.ingested_ = ingested;
  st.pooled_ = 0;
  return PoolUpTo(st, stream);
}

// --------------------------------------------------------- diagnostics

absl::StatusOr<std::vector<float>> QsaIndexer::BlockScores(const QsaSeqState& st,
                                                           DevicePtr normed_row, size_t pos,
                                                           QsaScratch& scratch,
                                                           Stream stream) const {
  CORTIQ_RETURN_IF_ERROR(CheckOwner(st, "BlockScores"));
  if (pos >= st.ingested_ || normed_row.null()) {
    return absl::FailedPreconditionError(absl::StrCat("QsaIndexer::BlockScores: pos = ", pos,
                                                      " not ingested (ingested ", st.ingested_,
                                                      ") or normed_row null"));
  }
  const size_t num_blocks = pos / g_.ratio;
  std::vector<float> out(num_blocks, std::numeric_limits<float>::quiet_NaN());
  if (num_blocks <= 1) return out;
  const Layout l = ScratchLayout(1, num_blocks, g_.budget);
  CORTIQ_RETURN_IF_ERROR(scratch.Reserve(l.total));
  const DevicePtr base = scratch.data();
  CORTIQ_RETURN_IF_ERROR(
      backend_->Project(QueryProjection(normed_row, 1, pos, base + l.q), stream));
  ScoreArgs sc;
  sc.q = base + l.q;
  sc.rows = 1;
  sc.n_heads = g_.n_heads;
  sc.hd = g_.hd;
  sc.pooled = st.block_keys_;
  sc.num_blocks = num_blocks;
  sc.pos0 = pos;
  sc.ratio = g_.ratio;
  sc.scores = base + l.scores;
  CORTIQ_RETURN_IF_ERROR(backend_->ScoreBlocks(sc, stream));
  CORTIQ_RETURN_IF_ERROR(backend_->CopyToHost(out.data() + 1, sc.scores + sizeof(float),
                                              (num_blocks - 1) * sizeof(float), stream));
  return out;
}

}  // namespace cortiq::qsa
