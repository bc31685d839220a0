#include "core/session/session_journal.h"

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/kv/layer_kv_cache.h"
#include "core/kv/wire_refusal.h"
#include "core/session/session_wire.h"
#include "core/util/bytes.h"
#include "core/util/crc32c.h"
#include "core/util/status_macros.h"
#include "core/util/strings.h"

namespace cortiq::session {

namespace {

using util::ByteReader;
using util::ByteWriter;

constexpr char kMagic[4] = {'C', 'Q', 'S', 'J'};
constexpr uint32_t kRecordSession = 1;
constexpr uint32_t kRecordTurn = 2;
constexpr size_t kFrameBytes = 16 + 4;  // type, reserved, length; CRC
constexpr uint8_t kLayerRows = 0;
constexpr uint8_t kLayerWhole = 1;
constexpr uint64_t kAuxHeaderBytes = 16;  // the QSA aux blob's [ingested][pooled]

absl::Status Corrupt(std::string_view what) {
  return absl::DataLossError(absl::StrCat("session journal: ", util::Sv(what)));
}

// Bytes one position of `cache`'s rows takes in a record, per KV head:
// f32 K and V rows, or int8 K and V rows with their f32 scales.
size_t RowBytesPerHead(kv::KvMode mode, size_t head_dim) {
  return mode == kv::KvMode::kF32 ? 2 * head_dim * sizeof(float) : 2 * (head_dim + sizeof(float));
}

// The frame check: CRC32C of a record's type and length. A flipped bit in
// a length is then corruption, never mistaken for a record cut short by a
// crash (which keeps its header whole).
uint32_t FrameCrc(uint32_t type, uint64_t len) {
  char b[12];
  std::memcpy(b, &type, 4);
  std::memcpy(b + 4, &len, 8);
  return util::Crc32c(std::string_view(b, 12));
}

// Appends a framed record: type, frame check, length, payload, CRC32C of
// them all.
void PutRecord(ByteWriter& w, uint32_t type, std::string_view payload) {
  const size_t start = w.size();
  w.U32(type);
  w.U32(FrameCrc(type, payload.size()));
  w.U64(payload.size());
  w.Bytes(payload);
  w.U32(util::Crc32c(std::string_view(w.str()).substr(start)));
}

std::string FileHeader(uint64_t fingerprint) {
  ByteWriter w;
  w.Raw(kMagic, 4);
  w.U32(kJournalVersion);
  w.U32(0);  // flags
  w.U32(0);  // reserved
  w.U64(fingerprint);
  return w.Take();
}

// One layer's part of a turn record, decided before any byte is written so
// the record is sized once.
struct LayerPart {
  const kv::LayerKvCache* rows = nullptr;  // appendable rows, or
  std::string whole;                       // the whole state's CQKV blob
  size_t aux_row = 0;                      // aux bytes per position (0: none)
};

// The turn record (framed, after `prefix`) of what lies past keep_tokens /
// keep_cached, written into `out`.
absl::Status TurnRecord(const Session& session, size_t keep_tokens, size_t keep_cached,
                        uint64_t* live_bytes, std::string_view prefix, ByteWriter& w) {
  const model::SequenceKv& kv = session.kv();
  const size_t cached = kv.position();
  const std::vector<int32_t>& tokens = session.tokens();
  if (keep_tokens > tokens.size() || keep_cached > cached) {
    return absl::InternalError("session journal: the mark is past the session's state");
  }
  const size_t count = cached - keep_cached;
  const size_t H = kv.geometry().num_kv_heads, D = kv.geometry().head_dim;
  std::vector<LayerPart> parts(kv.num_layers());
  size_t body = 0, live = 0;
  for (size_t l = 0; l < kv.num_layers(); ++l) {
    const attention::LayerAttentionState& state = kv.layer(l);
    LayerPart& p = parts[l];
    if (state.AwaitsPromptEnd()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "layer ", l, ": an O(1) trace being collected (a call ended inside its prompt)"));
    }
    p.rows = state.journal_rows();
    if (p.rows != nullptr) {
      if (p.rows->HasDeadHeads() || p.rows->HasImportance()) {
        return absl::FailedPreconditionError(
            absl::StrCat("layer ", l, ": dead heads or importance, which no record describes"));
      }
      const size_t per = H * RowBytesPerHead(p.rows->mode(), D);
      body += 1 + 8 + count * per;
      live += 1 + 8 + cached * per;
    } else {
      const kv::LayerKvCache* cache = state.cache();
      absl::StatusOr<std::string> blob;
      if (cache != nullptr) {
        blob = cache->ExportWire({});
      } else {
        CORTIQ_ASSIGN_OR_RETURN(kv::LayerKvCache held, state.ExportRows());
        blob = held.ExportWire({});
      }
      if (!blob.ok()) return kv::PrefixStatus(absl::StrCat("layer ", l, ": "), blob.status());
      p.whole = *std::move(blob);
      body += 1 + 8 + p.whole.size();
      live += 1 + 8 + p.whole.size();
    }
    p.aux_row = state.HasAux() ? state.AuxRowBytes() : 0;
    if (p.aux_row != 0 && state.AuxPositions() != cached) {
      return absl::FailedPreconditionError(absl::StrCat("layer ", l, ": the QSA indexer holds ",
                                                        state.AuxPositions(), " of ", cached,
                                                        " positions"));
    }
    body += 4 + (p.aux_row != 0 ? 8 + count * p.aux_row : 0);
    live += 4 + (p.aux_row != 0 ? 8 + cached * p.aux_row : 0);
  }
  std::string sampler;
  if (session.sampler().has_value()) sampler = session.sampler()->SerializeState();
  const size_t fixed =
      8 + 8 + 8 + 8 + 4 + session.detok_pending().size() + 1 + 4 + sampler.size() + 4;
  const size_t payload_bytes = fixed + (tokens.size() - keep_tokens) * 4 + body;
  w.Reserve(prefix.size() + 16 + payload_bytes + 4);
  w.Bytes(prefix);
  const size_t start = w.size();
  w.U32(kRecordTurn);
  w.U32(FrameCrc(kRecordTurn, payload_bytes));
  w.U64(payload_bytes);
  w.U64(keep_tokens);
  w.U64(keep_cached);
  w.U64(tokens.size() - keep_tokens);
  w.Raw(tokens.data() + keep_tokens, (tokens.size() - keep_tokens) * sizeof(int32_t));
  w.U64(cached);
  w.U32(static_cast<uint32_t>(session.detok_pending().size()));
  w.Bytes(session.detok_pending());
  w.U8(session.sampler().has_value() ? 1 : 0);
  w.U32(static_cast<uint32_t>(sampler.size()));
  w.Bytes(sampler);
  w.U32(static_cast<uint32_t>(kv.num_layers()));
  std::vector<uint8_t> aux;
  for (size_t l = 0; l < kv.num_layers(); ++l) {
    const LayerPart& p = parts[l];
    if (p.rows != nullptr) {
      w.U8(kLayerRows);
      w.U64(count);
      for (size_t h = 0; h < H; ++h) {
        const kv::HeadRowsView v = p.rows->HeadRows(h);
        const size_t from = keep_cached * D, n = count * D;
        if (p.rows->mode() == kv::KvMode::kF32) {
          w.Raw(v.keys.data() + from, n * sizeof(float));
          w.Raw(v.values.data() + from, n * sizeof(float));
        } else {
          w.Raw(v.keys_i8.data() + from, n);
          w.Raw(v.key_scales.data() + keep_cached, count * sizeof(float));
          w.Raw(v.values_i8.data() + from, n);
          w.Raw(v.value_scales.data() + keep_cached, count * sizeof(float));
        }
      }
    } else {
      w.U8(kLayerWhole);
      w.U64(p.whole.size());
      w.Bytes(p.whole);
    }
    w.U32(static_cast<uint32_t>(p.aux_row));
    if (p.aux_row != 0) {
      w.U64(count);
      aux.resize(count * p.aux_row);
      CORTIQ_RETURN_IF_ERROR(kv.layer(l).AuxRows(keep_cached, count, aux.data()));
      w.Raw(aux.data(), aux.size());
    }
  }
  if (w.size() - start - 16 != payload_bytes) {
    return absl::InternalError("session journal: a turn record's size was miscounted");
  }
  w.U32(util::Crc32c(std::string_view(w.str()).substr(start)));
  *live_bytes = kJournalHeaderBytes + fixed + tokens.size() * 4 + live;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<JournalRecord> BuildJournalRecord(const Session& session,
                                                 const model::ModelConfig& model,
                                                 uint64_t fingerprint, bool rewrite,
                                                 std::string buffer) {
  const Session::JournalMark& mark = session.journal_mark();
  rewrite = rewrite || !mark.written;
  JournalRecord out;
  const std::string header = EncodeSessionHeader(model, session);
  if (!rewrite) {
    uint64_t live = 0;
    ByteWriter w(std::move(buffer));
    CORTIQ_RETURN_IF_ERROR(TurnRecord(session, mark.tokens, mark.cached, &live, {}, w));
    live += kFrameBytes + header.size() + kFrameBytes;
    const uint64_t after = mark.file_bytes + w.size();
    // Compaction: a file whose dead bytes would pass its live bytes is
    // written anew instead (amortised: the file never exceeds twice the
    // state, and a rewrite happens after at least `live` dead bytes).
    if (after <= 2 * live) {
      out.bytes = w.Take();
      out.live_bytes = live;
      out.mark = {true, session.tokens().size(), session.kv().position(), after};
      return out;
    }
    buffer = w.Take();
  }
  uint64_t live = 0;
  ByteWriter prefix;
  prefix.Bytes(FileHeader(fingerprint));
  PutRecord(prefix, kRecordSession, header);
  ByteWriter w(std::move(buffer));
  CORTIQ_RETURN_IF_ERROR(TurnRecord(session, 0, 0, &live, prefix.str(), w));
  out.bytes = w.Take();
  out.rewrite = true;
  out.live_bytes = out.bytes.size();
  out.mark = {true, session.tokens().size(), session.kv().position(), out.bytes.size()};
  return out;
}

// Session's friend: the restore rebuilds the attention state of a session
// it owns and nobody else sees (as the wire import does through its named
// operations; a journal's rows go straight into the caches).
class JournalRestore {
 public:
  static model::SequenceKv& Sequence(Session& session) { return session.kv_; }
};

namespace {

struct Record {
  uint32_t type;
  std::string_view payload;
  uint64_t offset;
};

// A read of the file that failed: an I/O error (EIO) or a file shorter
// than its mapping. The file's bytes cannot be had, so the file is treated
// as corrupt (DATA_LOSS: quarantined) rather than read through the mapping,
// where the same error is a SIGBUS.
absl::Status ReadFailed(uint64_t offset, size_t n, int err) {
  return Corrupt(absl::StrCat("reading ", n, " bytes at byte ", offset, ": ",
                              err != 0 ? std::strerror(err) : "the file ends before them"));
}

// Reads exactly `n` bytes at `offset`.
absl::Status PreadAll(int fd, void* dst, size_t n, uint64_t offset) {
  char* out = static_cast<char*>(dst);
  const uint64_t start = offset;
  const size_t total = n;
  while (n > 0) {
    const ssize_t got = ::pread(fd, out, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return ReadFailed(start, total, got < 0 ? errno : 0);
    out += got;
    n -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return absl::OkStatus();
}

// Reads exactly the bytes `iov` names, in order, from `offset`: one
// preadv for a layer's rows (every head's keys and values, contiguous in
// the file) instead of one pread per head. Consumes `iov`.
absl::Status PreadvAll(int fd, std::vector<iovec>& iov, uint64_t offset) {
  size_t total = 0;
  for (const iovec& v : iov) total += v.iov_len;
  const uint64_t start = offset;
  size_t i = 0;
  while (i < iov.size()) {
    if (iov[i].iov_len == 0) {
      ++i;
      continue;
    }
    const int k = static_cast<int>(std::min<size_t>(iov.size() - i, IOV_MAX));
    const ssize_t got = ::preadv(fd, iov.data() + i, k, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return ReadFailed(start, total, got < 0 ? errno : 0);
    offset += static_cast<uint64_t>(got);
    for (size_t left = static_cast<size_t>(got); left > 0;) {
      const size_t step = std::min(left, iov[i].iov_len);
      iov[i].iov_base = static_cast<char*>(iov[i].iov_base) + step;
      iov[i].iov_len -= step;
      left -= step;
      if (iov[i].iov_len == 0) ++i;
    }
  }
  return absl::OkStatus();
}

// `n` bytes of the file at `offset` into `dst`: with pread when fd is open
// (an I/O error is then a status, not a SIGBUS), else from the mapping.
absl::Status ReadAt(std::string_view file, int fd, uint64_t offset, size_t n, void* dst) {
  if (fd >= 0) return PreadAll(fd, dst, n, offset);
  std::memcpy(dst, file.data() + offset, n);
  return absl::OkStatus();
}

// CRC-32C of file[offset, offset + n): read with pread into `buf` (reused
// across calls) when fd is open, else from the mapping.
absl::StatusOr<uint32_t> FileCrc32c(std::string_view file, int fd, uint64_t offset, size_t n,
                                    std::vector<char>& buf) {
  if (fd < 0) return util::Crc32c(file.substr(offset, n));
  constexpr size_t kChunk = size_t{4} << 20;
  if (buf.size() < std::min(kChunk, n)) buf.resize(std::min(kChunk, n));
  uint32_t crc = 0;  // Crc32c(A) == Crc32cExtend(0, A)
  for (size_t at = 0; at < n;) {
    const size_t k = std::min(kChunk, n - at);
    CORTIQ_RETURN_IF_ERROR(PreadAll(fd, buf.data(), k, offset + at));
    crc = util::Crc32cExtend(crc, buf.data(), k);
    at += k;
  }
  return crc;
}

// The restore of one file: the session being rebuilt and what the turn
// records said so far.
struct Restorer {
  const model::Transformer& model;
  std::unique_ptr<Session> session;
  std::vector<int32_t> history;
  size_t cached = 0;
  std::string pending;
  std::optional<model::Sampler> sampler;
  std::vector<std::vector<uint8_t>> aux;  // per layer: the QSA aux blob being rebuilt
  size_t reserve = 0;                     // positions every rows layer reserves up front
  const char* file_base = nullptr;        // the file's first byte (the mapping)
  int fd = -1;                            // the same file, for pread (-1: none)

  // Applies one turn record. A superseded record (one before a later
  // record that keeps no position) only moves the history, the held-back
  // bytes and the sampler: its rows would be released unread.
  absl::Status ApplyTurn(std::string_view payload, model::SequenceKv& kv, bool superseded);
  absl::Status Finish(model::SequenceKv& kv);
};

// Moves past one layer of a turn record (after its kind byte) without
// reading its rows: `count` positions of H heads of `per` bytes each.
absl::Status SkipLayer(ByteReader& r, size_t l, uint8_t kind, uint64_t count, size_t H,
                       size_t per) {
  uint64_t rows, len;
  uint32_t aux_row;
  std::string_view skipped;
  const bool ok = kind == kLayerRows
                      ? r.U64(&rows) && rows == count && count <= r.remaining() / (H * per) &&
                            r.Bytes(count * H * per, &skipped)
                      : r.U64(&len) && r.Bytes(len, &skipped);
  if (!ok) return Corrupt(absl::StrCat("layer ", l, ": rows or blob"));
  if (!r.U32(&aux_row)) return Corrupt(absl::StrCat("layer ", l, ": aux"));
  if (aux_row != 0 && (!r.U64(&rows) || rows != count || rows > r.remaining() / aux_row ||
                       !r.Bytes(rows * aux_row, &skipped))) {
    return Corrupt(absl::StrCat("layer ", l, ": aux rows disagree with the positions"));
  }
  return absl::OkStatus();
}

// The start of a turn record, as far as the restore's planning reads it:
// the positions it keeps and those it reaches. Leaves `r` after them (at
// the held-back bytes). False when the record is too short to say.
bool ReadTurnPositions(ByteReader& r, uint64_t* keep_cached, uint64_t* new_cached) {
  uint64_t keep_tokens, n;
  std::string_view tokens;
  return r.U64(&keep_tokens) && r.U64(keep_cached) && r.U64(&n) && n <= r.remaining() / 4 &&
         r.Bytes(n * 4, &tokens) && r.U64(new_cached);
}

// Reads a turn record's layer headers and nothing else (a cold file: the
// restore reads these scattered small pieces before it streams the file in
// from the start, so they do not queue behind its large reads).
void WalkTurn(std::string_view payload, size_t layers, size_t H, size_t per) {
  ByteReader r(payload);
  uint64_t kc, c;
  uint32_t p, sampler_len, count_layers;
  uint8_t has_sampler, kind;
  std::string_view skipped;
  if (!ReadTurnPositions(r, &kc, &c) || c < kc || !r.U32(&p) || !r.Bytes(p, &skipped) ||
      !r.U8(&has_sampler) || !r.U32(&sampler_len) || !r.Bytes(sampler_len, &skipped) ||
      !r.U32(&count_layers) || count_layers != layers) {
    return;
  }
  for (size_t l = 0; l < layers; ++l) {
    if (!r.U8(&kind) || !SkipLayer(r, l, kind, c - kc, H, per).ok()) return;
  }
}

absl::Status Restorer::ApplyTurn(std::string_view payload, model::SequenceKv& kv, bool superseded) {
  ByteReader r(payload);
  uint64_t keep_tokens, keep_cached, n, new_cached;
  if (!r.U64(&keep_tokens) || !r.U64(&keep_cached) || !r.U64(&n)) return Corrupt("truncated turn");
  if (keep_tokens > history.size() || keep_cached > cached) {
    return Corrupt(absl::StrCat("keeps ", keep_tokens, " tokens and ", keep_cached,
                                " positions of a state of ", history.size(), " and ", cached));
  }
  if (n > r.remaining() / sizeof(int32_t)) return Corrupt("bad token count");
  history.resize(keep_tokens + n);
  if (!r.Raw(history.data() + keep_tokens, n * sizeof(int32_t))) return Corrupt("truncated tokens");
  uint32_t p, sampler_len;
  uint8_t has_sampler;
  std::string_view pend, blob;
  if (!r.U64(&new_cached) || new_cached < keep_cached || new_cached > history.size() ||
      !r.U32(&p) || p > 3 || !r.Bytes(p, &pend) || !r.U8(&has_sampler) || has_sampler > 1 ||
      !r.U32(&sampler_len) || !r.Bytes(sampler_len, &blob)) {
    return Corrupt("malformed turn header");
  }
  pending.assign(pend);
  if (has_sampler == 1) {
    absl::StatusOr<model::Sampler> s = model::Sampler::Deserialize(blob);
    if (!s.ok()) return Corrupt(absl::StrCat("sampler: ", s.status().message()));
    sampler = *std::move(s);
  }
  uint32_t layers;
  if (!r.U32(&layers) || layers != kv.num_layers()) return Corrupt("layer count");
  const size_t count = new_cached - keep_cached;
  const model::ModelConfig& m = model.config();
  const size_t H = kv.geometry().num_kv_heads, D = kv.geometry().head_dim;
  // The rows layers' copies, made once the record has parsed (below).
  struct Copy {
    kv::LayerKvCache* cache;
    std::string_view rows;  // per head: K, (K scales), V, (V scales)
  };
  std::vector<Copy> copies;
  copies.reserve(layers);
  for (size_t l = 0; l < layers; ++l) {
    attention::LayerAttentionState& state = kv.layer(l);
    uint8_t kind;
    if (!r.U8(&kind) || kind > kLayerWhole) return Corrupt(absl::StrCat("layer ", l, ": kind"));
    if (superseded) {
      CORTIQ_RETURN_IF_ERROR(
          SkipLayer(r, l, kind, count, H, RowBytesPerHead(session->config().kv_mode, D)));
      continue;
    }
    if (kind == kLayerRows) {
      uint64_t rows;
      // A state kept from nothing starts empty (a sealed O(1) layer that a
      // start over emptied is appendable rows again).
      if (keep_cached == 0) state.Release();
      kv::LayerKvCache* cache = state.journal_rows();
      if (cache == nullptr) {
        return Corrupt(
            absl::StrCat("layer ", l, ": rows for a ", util::Sv(state.name()), " layer"));
      }
      if (!r.U64(&rows) || rows != count || cache->seq_len() < keep_cached) {
        return Corrupt(absl::StrCat("layer ", l, ": rows disagree with the positions"));
      }
      if (cache->seq_len() > keep_cached) state.TruncateLast(cache->seq_len() - keep_cached);
      const size_t per = RowBytesPerHead(cache->mode(), D);
      std::string_view rows_bytes;
      if (count > r.remaining() / (H * per) || !r.Bytes(count * H * per, &rows_bytes)) {
        return Corrupt(absl::StrCat("layer ", l, ": rows"));
      }
      copies.push_back({cache, rows_bytes});
    } else {
      uint64_t len;
      std::string_view wire;
      if (!r.U64(&len) || !r.Bytes(len, &wire)) return Corrupt(absl::StrCat("layer ", l, ": blob"));
      kv::LayerKvCache cache(H, D, session->config().kv_mode);
      const kv::WireImportExpect expect{static_cast<size_t>(m.num_attention_heads),
                                        static_cast<size_t>(m.max_position_embeddings)};
      absl::Status st = cache.ImportWire(wire, expect);
      if (st.ok()) st = state.InstallCache(std::move(cache), new_cached);
      if (!st.ok()) return Corrupt(absl::StrCat("layer ", l, ": ", st.message()));
    }
    uint32_t aux_row;
    if (!r.U32(&aux_row)) return Corrupt(absl::StrCat("layer ", l, ": aux"));
    if (aux_row != 0) {
      uint64_t rows;
      std::string_view keys;
      std::vector<uint8_t>& a = aux[l];
      const uint64_t kept = kAuxHeaderBytes + keep_cached * uint64_t{aux_row};
      if (!r.U64(&rows) || rows != count || (a.empty() ? keep_cached != 0 : a.size() < kept) ||
          rows > r.remaining() / aux_row || !r.Bytes(rows * aux_row, &keys)) {
        return Corrupt(absl::StrCat("layer ", l, ": aux rows disagree with the positions"));
      }
      a.resize(kept);
      a.insert(a.end(), keys.begin(), keys.end());
    } else {
      aux[l].clear();
    }
  }
  if (!r.done()) return Corrupt("trailing bytes in a turn");
  // The copies, layer by layer in file order: each reserves its layer's rows
  // (faulting its pages in) and copies the record's rows into them. With a
  // descriptor every row is read with pread, never through the mapping: a
  // failed read is DATA_LOSS, where the mapping would raise SIGBUS.
  const size_t reserve_to = std::max(reserve, new_cached);
  auto copy_layer = [&](const Copy& c, std::vector<iovec>& iov) -> absl::Status {
    kv::LayerKvCache& cache = *c.cache;
    cache.Reserve(reserve_to);
    iov.clear();
    auto take = [&](void* dst, size_t bytes) { iov.push_back({dst, bytes}); };
    for (size_t h = 0; h < H; ++h) {
      const kv::HeadRowsFill f = cache.FillNext(h, count);
      if (cache.mode() == kv::KvMode::kF32) {
        take(f.keys.data(), f.keys.size_bytes());
        take(f.values.data(), f.values.size_bytes());
      } else {
        take(f.keys_i8.data(), f.keys_i8.size_bytes());
        take(f.key_scales.data(), f.key_scales.size_bytes());
        take(f.values_i8.data(), f.values_i8.size_bytes());
        take(f.value_scales.data(), f.value_scales.size_bytes());
      }
    }
    if (fd >= 0) {
      CORTIQ_RETURN_IF_ERROR(PreadvAll(fd, iov, static_cast<uint64_t>(c.rows.data() - file_base)));
    } else {
      const char* src = c.rows.data();
      for (const iovec& v : iov) {
        std::memcpy(v.iov_base, src, v.iov_len);
        src += v.iov_len;
      }
    }
    cache.AppendDenseRows(count);
    return absl::OkStatus();
  };
  // Parallel when the copies, or the rows the layers reserve now (the first
  // record reserves every turn's positions), are large.
  size_t total = 0;
  for (const Copy& c : copies) {
    total += c.rows.size();
    if (c.cache->capacity() < reserve_to) {
      total += (reserve_to - c.cache->capacity()) * H * RowBytesPerHead(c.cache->mode(), D);
    }
  }
  std::vector<iovec> iov;
  iov.reserve(4 * H);
  if (total < internal::restore_parallel_bytes.load() || copies.size() < 2) {
    for (const Copy& c : copies) CORTIQ_RETURN_IF_ERROR(copy_layer(c, iov));
  } else {
    // A large record: a second thread reserves the layers ahead of the
    // copies. Faulting fresh pages in is the kernel's page allocator, about
    // as slow as the disk (a 500 MB session: ~0.2 s on one core, no faster
    // on two, which contend for its locks); copying is a quarter of that.
    // One thread allocating while this one copies behind it, as the file's
    // pages arrive, overlaps the two with the read.
    std::mutex mu;
    std::condition_variable cv;
    size_t reserved = 0;
    std::thread reserver([&] {
      for (size_t i = 0; i < copies.size(); ++i) {
        copies[i].cache->Reserve(reserve_to);
        std::lock_guard lock(mu);
        reserved = i + 1;
        cv.notify_one();
      }
    });
    absl::Status copied;
    for (size_t i = 0; i < copies.size() && copied.ok(); ++i) {
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return reserved > i; });
      }
      copied = copy_layer(copies[i], iov);
    }
    reserver.join();
    CORTIQ_RETURN_IF_ERROR(copied);
  }
  cached = new_cached;
  return absl::OkStatus();
}

absl::Status Restorer::Finish(model::SequenceKv& kv) {
  for (size_t l = 0; l < kv.num_layers(); ++l) {
    if (kv.layer(l).position() != cached) {
      return Corrupt(absl::StrCat("layer ", l, " holds ", kv.layer(l).position(), " of ", cached,
                                  " positions"));
    }
    std::vector<uint8_t>& a = aux[l];
    if (a.empty()) continue;
    const uint64_t row = (a.size() - kAuxHeaderBytes) / std::max<uint64_t>(1, cached);
    const uint64_t ratio = std::max<size_t>(1, session->config().qsa.ratio);
    const uint64_t ingested = cached, pooled = ingested / ratio;
    if (cached == 0 || a.size() != kAuxHeaderBytes + cached * row) {
      return Corrupt(absl::StrCat("layer ", l, ": aux rows disagree with the positions"));
    }
    std::memcpy(a.data(), &ingested, 8);
    std::memcpy(a.data() + 8, &pooled, 8);
    absl::Status st = session->RestoreLayerAux(l, model.qsa_runtime(), a);
    if (!st.ok()) return Corrupt(absl::StrCat("layer ", l, ": ", st.message()));
    std::vector<uint8_t>().swap(a);
  }
  const size_t positions = cached;
  absl::Status st = session->RestoreHistory(std::move(history), positions, pending);
  if (!st.ok()) return Corrupt(std::string(st.message()));
  if (sampler.has_value()) session->RestoreSampler(*std::move(sampler));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RestoredJournal> RestoreJournal(std::string_view file,
                                               const model::Transformer& model,
                                               uint64_t fingerprint,
                                               const std::function<void()>& start_reading, int fd) {
  // With a descriptor, the file header and the records' frames are read
  // with pread like the rows and checksums (an I/O error a status, not a
  // SIGBUS). The records' payloads other than rows (the session header, a
  // turn's tokens, sampler and layer headers, whole-layer blobs, QSA keys)
  // are parsed in place, through the mapping: reading them with pread would
  // copy each into a buffer first, for bytes that are a small part of a
  // session next to its rows.
  char head[kJournalHeaderBytes];
  if (file.size() < kJournalHeaderBytes) return Corrupt("bad magic (not a Cortiq session journal)");
  CORTIQ_RETURN_IF_ERROR(ReadAt(file, fd, 0, sizeof(head), head));
  if (std::memcmp(head, kMagic, 4) != 0) {
    return Corrupt("bad magic (not a Cortiq session journal)");
  }
  ByteReader hr(std::string_view(head + 4, kJournalHeaderBytes - 4));
  uint32_t version, flags, reserved;
  uint64_t fp;
  hr.U32(&version);
  hr.U32(&flags);
  hr.U32(&reserved);
  hr.U64(&fp);
  if (version != kJournalVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("session journal: version ", version, ": this build reads ", kJournalVersion));
  }
  if (flags != 0 || reserved != 0) return Corrupt("header: unknown flags");
  if (fp != fingerprint) {
    return absl::FailedPreconditionError(
        "session journal: written for another model (fingerprint mismatch)");
  }
  // The records' frames. The torn last write of a crash is dropped: a record
  // whose whole frame is past the end, a header that fails its frame check
  // with nothing but zeros after it, a record (its frame check passing) cut
  // by the end of the file, or (below) one whose checksum fails with
  // nothing after it. Any other failure is corruption.
  std::vector<Record> records;
  uint64_t pos = kJournalHeaderBytes;
  RestoredJournal out;
  // Whether file[from, end) is all zeros (a torn tail).
  auto zeros_from = [&](uint64_t from) -> absl::StatusOr<bool> {
    if (fd < 0) return file.substr(from).find_first_not_of('\0') == std::string_view::npos;
    char buf[64 << 10];
    for (uint64_t at = from; at < file.size();) {
      const size_t k = std::min<uint64_t>(sizeof(buf), file.size() - at);
      CORTIQ_RETURN_IF_ERROR(PreadAll(fd, buf, k, at));
      if (std::string_view(buf, k).find_first_not_of('\0') != std::string_view::npos) {
        return false;
      }
      at += k;
    }
    return true;
  };
  while (pos < file.size()) {
    const uint64_t left = file.size() - pos;
    if (left < kFrameBytes) break;
    uint32_t type, frame;
    uint64_t len;
    char fr[16];
    CORTIQ_RETURN_IF_ERROR(ReadAt(file, fd, pos, sizeof(fr), fr));
    std::memcpy(&type, fr, 4);
    std::memcpy(&frame, fr + 4, 4);
    std::memcpy(&len, fr + 8, 8);
    if (frame != FrameCrc(type, len)) {
      CORTIQ_ASSIGN_OR_RETURN(const bool zeros, zeros_from(pos));
      if (zeros) break;
      return Corrupt(
          absl::StrCat("record ", records.size(), " at byte ", pos, ": its frame check fails"));
    }
    if (len > left - kFrameBytes) break;
    const uint64_t end = pos + 16 + len + 4;
    if ((type != kRecordSession && type != kRecordTurn) ||
        (type == kRecordSession) != records.empty()) {
      return Corrupt(absl::StrCat("record ", records.size(), " at byte ", pos, ": type ", type));
    }
    records.push_back({type, file.substr(pos + 16, len), pos});
    pos = end;
  }
  if (records.size() < 2) return Corrupt("no complete turn");
  // The state starts at the last record that keeps no position (a start
  // over, or the whole state of a rewritten file); the ones before it only
  // carry the history. From there every rows layer reserves the most
  // positions any turn reaches, once: a restore never reallocates its rows
  // turn after turn.
  size_t base = 1, reserve = 0;
  auto find_base = [&](size_t end) {
    base = 1;
    reserve = 0;
    for (size_t i = 1; i < end; ++i) {
      ByteReader r(records[i].payload);
      uint64_t kc, c;
      if (ReadTurnPositions(r, &kc, &c)) {
        if (kc == 0) {
          base = i;
          reserve = 0;
        }
        reserve = std::max<size_t>(reserve,
                                   std::min<uint64_t>(c, model.config().max_position_embeddings));
      }
    }
  };
  find_base(records.size());
  // The layout is read before anything streams: the records' frames (above),
  // the session header and the layer headers of the record the state starts
  // at. Then the caller may stream the file in (start_reading), and the
  // reads that follow are the file's bytes in order.
  absl::StatusOr<SessionHeader> header = DecodeSessionHeader(records[0].payload, model.config());
  if (header.ok()) {
    const size_t H = static_cast<size_t>(model.config().num_key_value_heads);
    WalkTurn(records[base].payload, static_cast<size_t>(model.config().num_hidden_layers), H,
             RowBytesPerHead(header->config.kv_mode, static_cast<size_t>(model.config().head_dim)));
  }
  if (start_reading) start_reading();
  // The checksums, on a thread of their own, in file order, while the
  // records are applied on this one: reading a cold file, the two overlap.
  // A record applied before its checksum is known is harmless: the session
  // is returned only once every checksum has matched. The last record is
  // applied only once it has, as a failure there is a torn write (dropped),
  // anywhere else corruption.
  std::mutex verify_mu;
  std::condition_variable verify_cv;
  size_t verified = 0;              // records whose checksum is known
  std::optional<size_t> first_bad;  // the first that failed
  absl::Status unreadable;          // its bytes could not be read (first_bad's)
  std::atomic<bool> verify_stop{false};
  std::thread verifier([&] {
    std::vector<char> buf;
    for (size_t i = 0; i < records.size() && !verify_stop.load(); ++i) {
      const Record& rec = records[i];
      const uint64_t len = rec.payload.size();
      uint32_t crc = 0;
      absl::Status read = ReadAt(file, fd, rec.offset + 16 + len, 4, &crc);
      absl::StatusOr<uint32_t> sum = FileCrc32c(file, fd, rec.offset, 16 + len, buf);
      if (read.ok() && !sum.ok()) read = sum.status();
      const bool ok = read.ok() && *sum == crc;
      std::lock_guard lock(verify_mu);
      if (!read.ok() && !first_bad) unreadable = read;
      if (!ok && !first_bad) first_bad = i;
      verified = i + 1;
      verify_cv.notify_all();
      if (!ok) break;
    }
    std::lock_guard lock(verify_mu);
    verified = records.size();
    verify_cv.notify_all();
  });
  struct JoinVerifier {
    std::thread& t;
    std::atomic<bool>& stop;
    ~JoinVerifier() {
      stop.store(true);
      if (t.joinable()) t.join();
    }
  } join_verifier{verifier, verify_stop};
  // Waits until record i's checksum is known; true when it (and every one
  // before it) matched.
  auto verified_ok = [&](size_t i) {
    std::unique_lock lock(verify_mu);
    verify_cv.wait(lock, [&] { return verified > i; });
    return !first_bad || *first_bad > i;
  };
  // A record that could not be read is never a torn tail: the failure
  // names the read. (verified_ok has returned, so the verifier has set it.)
  auto corrupt_at = [&](size_t i) {
    if (!unreadable.ok()) return unreadable;
    const Record& rec = records[i];
    return Corrupt(absl::StrCat("record ", i, " at byte ", rec.offset, ": checksum mismatch, ",
                                file.size() - (rec.offset + 16 + rec.payload.size() + 4),
                                " bytes after it"));
  };
  if (!verified_ok(0)) return corrupt_at(*first_bad);
  if (!header.ok()) return header.status();
  absl::StatusOr<std::unique_ptr<Session>> made =
      Session::Create(header->id, model, header->config);
  if (!made.ok()) return Corrupt(absl::StrCat("header: ", made.status().message()));
  Restorer rs{model, *std::move(made), {}, 0, {}, std::nullopt, {}, 0};
  rs.session->set_tenant(std::move(header->tenant));
  model::SequenceKv& kv = JournalRestore::Sequence(*rs.session);
  rs.aux.resize(kv.num_layers());
  // A start over in the last record counts once its checksum is known: a
  // torn one is dropped, and the state comes from the records before it.
  if (base > 1 && base + 1 == records.size() && !verified_ok(base)) find_base(base);
  rs.reserve = reserve;
  rs.file_base = file.data();
  rs.fd = fd;
  for (size_t i = 1; i < records.size(); ++i) {
    if (i + 1 == records.size() && !verified_ok(i)) {
      if (*first_bad != i || !unreadable.ok()) return corrupt_at(*first_bad);
      // The last record, torn: dropped.
      if (i == 1) return Corrupt("no complete turn");
      pos = records[i].offset;
      records.pop_back();
      break;
    }
    absl::Status st = rs.ApplyTurn(records[i].payload, kv, i < base);
    if (!st.ok()) {
      // A record that fails its checksum is reported as such.
      if (!verified_ok(i)) return corrupt_at(*first_bad);
      return absl::DataLossError(
          absl::StrCat("record ", i, " at byte ", records[i].offset, ": ", st.message()));
    }
  }
  if (!verified_ok(records.size() - 1)) return corrupt_at(*first_bad);
  out.valid_bytes = pos;
  out.torn_bytes = file.size() - pos;
  CORTIQ_RETURN_IF_ERROR(rs.Finish(kv));
  kv.ReleaseUnused();
  rs.session->PublishMemory();
  out.turns = records.size() - 1;
  rs.session->set_journal_mark(
      {true, rs.session->tokens().size(), rs.session->kv().position(), out.valid_bytes});
  out.session = std::move(rs.session);
  return out;
}

}  // namespace cortiq::session
