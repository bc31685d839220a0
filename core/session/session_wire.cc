#include "core/session/session_wire.h"

#include <algorithm>
#include <cstring>
#include <future>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/kv/layer_kv_cache.h"
#include "core/kv/wire_refusal.h"
#include "core/session/session_store.h"
#include "core/util/bytes.h"
#include "core/util/crc32c.h"
#include "core/util/status_macros.h"
#include "core/util/strings.h"

namespace cortiq::session {

namespace {

using util::ByteReader;
using util::ByteWriter;

constexpr char kMagic[4] = {'C', 'Q', 'S', 'W'};
constexpr uint32_t kFlagF16 = 1u << 0;
constexpr size_t kHeaderBytes = 24;  // magic, version, flags, reserved, fingerprint
// Layer blobs from this size up have the next layer's rows reserved ahead.
constexpr uint64_t kReserveAheadBytes = uint64_t{256} << 10;

enum SectionType : uint32_t {
  kSectionHeader = 1,
  kSectionTokens = 2,
  kSectionSampler = 3,
  kSectionLayer = 4,
  kSectionQsaAux = 5,
  kSectionEnd = 15,
};

std::string_view SectionName(uint32_t type) {
  switch (type) {
    case kSectionHeader:
      return "header";
    case kSectionTokens:
      return "tokens";
    case kSectionSampler:
      return "sampler";
    case kSectionLayer:
      return "layer";
    case kSectionQsaAux:
      return "qsa_aux";
    case kSectionEnd:
      return "end";
  }
  return "unknown";
}

// section := u32 type | u32 reserved (0) | u64 length | payload | u32 crc32c
// (the CRC covers type, reserved, length and payload).
void PutSection(ByteWriter& w, uint32_t type, std::string_view payload) {
  const size_t start = w.size();
  w.U32(type);
  w.U32(0);
  w.U64(payload.size());
  w.Bytes(payload);
  w.U32(util::Crc32c(std::string_view(w.str()).substr(start)));
}

absl::Status Corrupt(std::string_view what) {
  return absl::DataLossError(absl::StrCat("session wire: ", util::Sv(what)));
}

void PutLayerList(ByteWriter& w, const std::vector<size_t>& layers) {
  w.U32(static_cast<uint32_t>(layers.size()));
  for (size_t l : layers) w.U32(static_cast<uint32_t>(l));
}

bool GetLayerList(ByteReader& r, size_t num_layers, std::vector<size_t>* out) {
  uint32_t n;
  if (!r.U32(&n) || n > num_layers) return false;
  out->clear();
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t l;
    if (!r.U32(&l) || l >= num_layers || (!out->empty() && l <= out->back())) return false;
    out->push_back(l);
  }
  return true;
}

// Header payload: geometry (checked against the importer's model), the
// session configuration and (version 4+) the session's identity.
std::string HeaderPayload(const model::ModelConfig& m, const SessionConfig& c, uint32_t version,
                          const std::string& id, const std::string& tenant) {
  ByteWriter w;
  w.U32(static_cast<uint32_t>(m.num_hidden_layers));
  w.U32(static_cast<uint32_t>(m.num_attention_heads));
  w.U32(static_cast<uint32_t>(m.num_key_value_heads));
  w.U32(static_cast<uint32_t>(m.head_dim));
  w.U32(static_cast<uint32_t>(m.vocab_size));
  w.U8(c.kv_mode == kv::KvMode::kInt8 ? 1 : 0);
  w.U8(static_cast<uint8_t>(c.attention));
  w.U32(static_cast<uint32_t>(c.o1.m));
  w.U32(static_cast<uint32_t>(c.o1.w));
  w.U32(static_cast<uint32_t>(c.o1.sink));
  w.U8(c.o1.rect == kv::O1Rect::kFm ? 1 : 0);
  PutLayerList(w, c.attention == AttentionMode::kO1 ? c.o1.layers : std::vector<size_t>{});
  w.U32(static_cast<uint32_t>(c.qsa.ratio));
  w.U32(static_cast<uint32_t>(c.qsa.budget));
  PutLayerList(w, c.attention == AttentionMode::kQsa ? c.qsa.layers : std::vector<size_t>{});
  if (version >= 3) {  // sink + window attention
    w.U32(static_cast<uint32_t>(c.window.sink));
    w.U32(static_cast<uint32_t>(c.window.window));
    PutLayerList(w,
                 c.attention == AttentionMode::kWindow ? c.window.layers : std::vector<size_t>{});
  }
  if (version >= kSessionWireIdentityVersion) {  // the session's id and tenant
    w.U8(static_cast<uint8_t>(id.size()));
    w.Raw(id.data(), id.size());
    w.U8(static_cast<uint8_t>(tenant.size()));
    w.Raw(tenant.data(), tenant.size());
  }
  return w.Take();
}

// What the header section says: the configuration and, from version 4, the
// session's identity (empty id before).
struct ParsedHeader {
  SessionConfig config;
  std::string id, tenant;
};

absl::StatusOr<ParsedHeader> ParseHeader(std::string_view payload, const model::ModelConfig& m,
                                         uint32_t version) {
  ByteReader r(payload);
  uint32_t layers, heads, kv_heads, head_dim, vocab;
  if (!r.U32(&layers) || !r.U32(&heads) || !r.U32(&kv_heads) || !r.U32(&head_dim) ||
      !r.U32(&vocab)) {
    return Corrupt("header: truncated geometry");
  }
  auto mismatch = [](std::string_view field, uint64_t wire, int64_t here) {
    return absl::FailedPreconditionError(
        absl::StrCat("session wire: ", util::Sv(field), " is ", wire, " in the stream but ", here,
                     " in this server's model: the session belongs to another geometry"));
  };
  if (layers != uint64_t(m.num_hidden_layers))
    return mismatch("num_layers", layers, m.num_hidden_layers);
  if (heads != uint64_t(m.num_attention_heads))
    return mismatch("num_attention_heads", heads, m.num_attention_heads);
  if (kv_heads != uint64_t(m.num_key_value_heads))
    return mismatch("num_key_value_heads", kv_heads, m.num_key_value_heads);
  if (head_dim != uint64_t(m.head_dim)) return mismatch("head_dim", head_dim, m.head_dim);
  if (vocab != uint64_t(m.vocab_size)) return mismatch("vocab_size", vocab, m.vocab_size);
  SessionConfig c;
  uint8_t kv_mode, attention, rect;
  uint32_t o1m, o1w, o1sink, ratio, budget;
  // Version 3 adds sink + window attention (mode 3) and its parameters.
  const uint8_t max_attention = version >= 3 ? 3 : 2;
  uint32_t window_sink = 0, window = 0;
  if (!r.U8(&kv_mode) || kv_mode > 1 || !r.U8(&attention) || attention > max_attention ||
      !r.U32(&o1m) || !r.U32(&o1w) || !r.U32(&o1sink) || !r.U8(&rect) || rect > 1 ||
      !GetLayerList(r, layers, &c.o1.layers) || !r.U32(&ratio) || !r.U32(&budget) ||
      !GetLayerList(r, layers, &c.qsa.layers) ||
      (version >= 3 &&
       (!r.U32(&window_sink) || !r.U32(&window) || !GetLayerList(r, layers, &c.window.layers)))) {
    return Corrupt("header: malformed session configuration");
  }
  ParsedHeader out;
  if (version >= kSessionWireIdentityVersion) {
    uint8_t id_len = 0, tenant_len = 0;
    std::string_view id, tenant;
    if (!r.U8(&id_len) || !r.Bytes(id_len, &id) || !SessionStore::IsIdForm(id)) {
      return Corrupt("header: the session id is not 32 lowercase hex digits");
    }
    if (!r.U8(&tenant_len) || !r.Bytes(tenant_len, &tenant) || !IsTenantName(tenant)) {
      return Corrupt(absl::StrCat("header: the tenant is not at most ", kMaxTenantBytes,
                                  " bytes of [A-Za-z0-9._-]"));
    }
    out.id = std::string(id);
    out.tenant = std::string(tenant);
  }
  if (!r.done()) return Corrupt("header: malformed session configuration");
  // The active mode's sizes steer allocations on the first step after the
  // import (the QSA launch scratch is budget × 4 bytes, an O(1) trace and
  // state m, w and sink rows): none may exceed the context this model runs.
  const uint64_t context = static_cast<uint64_t>(m.max_position_embeddings);
  auto beyond_context = [&](std::string_view field, uint64_t v) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session wire: ", util::Sv(field), " is ", v,
        " in the stream, beyond this server's model context of ", context, " positions"));
  };
  if (attention == 1) {
    if (o1m > context) return beyond_context("o1.m", o1m);
    if (o1w > context) return beyond_context("o1.w", o1w);
    if (o1sink > context) return beyond_context("o1.sink", o1sink);
  }
  if (attention == 2) {
    if (ratio > context) return beyond_context("qsa.ratio", ratio);
    if (budget > context) return beyond_context("qsa.budget", budget);
  }
  if (attention == 3) {
    if (window_sink > context) return beyond_context("window.sink", window_sink);
    if (window > context) return beyond_context("window.window", window);
  }
  c.kv_mode = kv_mode == 1 ? kv::KvMode::kInt8 : kv::KvMode::kF32;
  c.attention = static_cast<AttentionMode>(attention);
  c.o1.m = o1m;
  c.o1.w = o1w;
  c.o1.sink = o1sink;
  c.o1.rect = rect == 1 ? kv::O1Rect::kFm : kv::O1Rect::kAggregate;
  c.qsa.ratio = ratio;
  c.qsa.budget = budget;
  c.window.sink = window_sink;
  c.window.window = window;
  out.config = c;
  return out;
}

}  // namespace

uint64_t ModelWireFingerprint(const model::Checkpoint& checkpoint,
                              std::string_view tokenizer_json) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64 offset basis
  auto mix = [&](const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) {
      h ^= b[i];
      h *= 1099511628211ull;
    }
  };
  const uint64_t ck = checkpoint.Fingerprint();
  mix(&ck, sizeof(ck));
  mix(tokenizer_json.data(), tokenizer_json.size());
  return h;
}

std::string EncodeSessionHeader(const model::ModelConfig& model, const Session& session) {
  return HeaderPayload(model, session.config(), kSessionWireMaxVersion, session.id(),
                       session.tenant());
}

absl::StatusOr<SessionHeader> DecodeSessionHeader(std::string_view payload,
                                                  const model::ModelConfig& model) {
  CORTIQ_ASSIGN_OR_RETURN(ParsedHeader parsed, ParseHeader(payload, model, kSessionWireMaxVersion));
  return SessionHeader{parsed.config, std::move(parsed.id), std::move(parsed.tenant)};
}

absl::StatusOr<uint32_t> NegotiateWireVersion(const std::vector<uint32_t>& peer_versions) {
  uint32_t best = 0;
  for (uint32_t v : peer_versions) {
    if (v >= kSessionWireMinVersion && v <= kSessionWireMaxVersion) best = std::max(best, v);
  }
  if (best == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("wire version: the peer speaks none of the versions this server writes (",
                     kSessionWireMinVersion, "..", kSessionWireMaxVersion, ")"));
  }
  return best;
}

// ---------------------------------------------------------------------------
// Export.

absl::StatusOr<SessionWireSource> SessionWireSource::Make(const Session& session,
                                                          uint64_t fingerprint,
                                                          const SessionWireOptions& options) {
  if (options.version < kSessionWireMinVersion || options.version > kSessionWireMaxVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("version: ", options.version, " is not one this server writes (",
                     kSessionWireMinVersion, "..", kSessionWireMaxVersion, ")"));
  }
  const model::SequenceKv& kv = session.kv();
  const size_t num_layers = kv.num_layers();
  SessionWireSource src;
  ByteWriter w;  // the owned bytes of the part being built
  w.Raw(kMagic, 4);
  w.U32(options.version);
  w.U32(options.f16 ? kFlagF16 : 0);
  w.U32(0);
  w.U64(fingerprint);
  const uint32_t header_crc = util::Crc32c(std::string_view(w.str()).substr(0, kHeaderBytes));
  size_t sections = 0;

  // The geometry comes from the caches themselves (the session's model).
  model::ModelConfig geometry;
  geometry.num_hidden_layers = static_cast<int64_t>(num_layers);
  geometry.num_key_value_heads = static_cast<int64_t>(kv.geometry().num_kv_heads);
  geometry.head_dim = static_cast<int64_t>(kv.geometry().head_dim);
  geometry.num_attention_heads = session.num_attention_heads();
  geometry.vocab_size = session.vocab_size();
  PutSection(w, kSectionHeader, HeaderPayload(geometry, session.config(), options.version, session.id(),
                                           session.tenant()));
  ++sections;

  {
    ByteWriter t;
    const auto& tokens = session.tokens();
    t.U64(tokens.size());
    t.Raw(tokens.data(), tokens.size() * sizeof(int32_t));
    t.U64(kv.position());
    const std::string& pending = session.detok_pending();
    t.U32(static_cast<uint32_t>(pending.size()));
    t.Bytes(pending);
    PutSection(w, kSectionTokens, t.str());
    ++sections;
  }
  {
    ByteWriter s;
    const auto& sampler = session.sampler();
    s.U8(sampler.has_value() ? 1 : 0);
    if (sampler.has_value()) s.Bytes(sampler->SerializeState());
    PutSection(w, kSectionSampler, s.str());
    ++sections;
  }
  kv::WireOptions lo;
  // Session versions 2 and 3 carry the same layer blobs (CQKV version 2).
  lo.version = std::min(options.version, kv::kWireVersionMax);
  lo.f16 = options.f16;
  for (size_t l = 0; l < num_layers; ++l) {
    // A state that keeps its rows in another form (sink + window) lends
    // them as a cache built for the stream, owned by its part.
    const kv::LayerKvCache* rows = kv.layer(l).cache();
    std::unique_ptr<kv::LayerKvCache> owned;
    if (rows == nullptr) {
      if (options.version < 3) {
        return kv::WireRefused(
            kv::WireRefusal::kWireVersion,
            absl::StrCat("layer ", l, ": ", std::string(kv.layer(l).name()),
                         " attention needs session wire version 3 (requested ", options.version,
                         ")"));
      }
      CORTIQ_ASSIGN_OR_RETURN(kv::LayerKvCache held, kv.layer(l).ExportRows());
      owned = std::make_unique<kv::LayerKvCache>(std::move(held));
      rows = owned.get();
    }
    absl::StatusOr<kv::LayerWireSource> blob = kv::LayerWireSource::Make(*rows, lo);
    if (!blob.ok()) {
      // The layer's refusal, naming the layer; its typed reason (a payload,
      // kv::WireRefusalOf) travels with it.
      return kv::PrefixStatus(absl::StrCat("layer ", l, ": "), blob.status());
    }
    // The section's type, length and index; its CRC is joined from theirs
    // and the blob's own (Crc32cCombine) when Read reaches it.
    const size_t start = w.size();
    w.U32(kSectionLayer);
    w.U32(0);
    w.U64(sizeof(uint32_t) + blob->size());
    w.U32(static_cast<uint32_t>(l));
    Part part;
    part.prefix_crc = util::Crc32c(std::string_view(w.str()).substr(start));
    part.bytes = w.Take();
    part.layer = *std::move(blob);
    part.owned = std::move(owned);
    src.size_ += part.bytes.size() + part.layer->size() + sizeof(uint32_t);
    src.parts_.push_back(std::move(part));
    w = ByteWriter();
    ++sections;
  }
  if (session.config().attention == AttentionMode::kQsa) {
    for (size_t l : session.config().qsa.layers) {
      if (!kv.layer(l).HasAux()) continue;  // not bound yet: nothing ingested
      CORTIQ_ASSIGN_OR_RETURN(std::vector<uint8_t> aux, kv.layer(l).SnapshotAux());
      ByteWriter p;
      p.U32(static_cast<uint32_t>(l));
      p.Raw(aux.data(), aux.size());
      PutSection(w, kSectionQsaAux, p.str());
      ++sections;
    }
  }
  {
    ByteWriter e;
    e.U64(src.size_ + w.size());
    e.U32(static_cast<uint32_t>(sections));
    e.U32(header_crc);
    PutSection(w, kSectionEnd, e.str());
  }
  src.size_ += w.size();
  src.parts_.push_back({w.Take(), std::nullopt, 0});
  return src;
}

size_t SessionWireSource::Read(char* dst, size_t n) {
  size_t done = 0;
  while (done < n && part_ < parts_.size()) {
    Part& p = parts_[part_];
    const uint64_t owned = p.bytes.size();
    const uint64_t blob = p.layer ? p.layer->size() : 0;
    const uint64_t total = owned + (p.layer ? blob + sizeof(uint32_t) : 0);
    size_t len = 0;
    if (in_part_ < owned) {
      len = static_cast<size_t>(std::min<uint64_t>(n - done, owned - in_part_));
      std::memcpy(dst + done, p.bytes.data() + in_part_, len);
    } else if (in_part_ < owned + blob) {
      len = p.layer->Read(dst + done, n - done);
    } else {
      const uint64_t at = in_part_ - owned - blob;
      if (at == 0) {
        // CRC(type, reserved, length, index, blob): the blob's last four
        // bytes are its own checksum, over everything before them.
        const uint32_t body = p.layer->body_crc();
        char body_le[4];
        std::memcpy(body_le, &body, sizeof(body));
        const uint32_t crc = util::Crc32cExtend(
            util::Crc32cCombine(p.prefix_crc, body, blob - sizeof(body)), body_le, sizeof(body));
        std::memcpy(crc_le_, &crc, sizeof(crc));
      }
      len = static_cast<size_t>(std::min<uint64_t>(n - done, sizeof(uint32_t) - at));
      std::memcpy(dst + done, crc_le_ + at, len);
    }
    done += len;
    pos_ += len;
    in_part_ += len;
    if (in_part_ == total) {
      p = Part();  // the owned bytes are not needed again
      ++part_;
      in_part_ = 0;
    }
  }
  return done;
}

absl::StatusOr<std::string> ExportSessionWire(const Session& session, uint64_t fingerprint,
                                              const SessionWireOptions& options) {
  CORTIQ_ASSIGN_OR_RETURN(SessionWireSource src,
                          SessionWireSource::Make(session, fingerprint, options));
  std::string out(src.size(), '\0');
  src.Read(out.data(), out.size());
  return out;
}

// ---------------------------------------------------------------------------
// Import.
//
// A state machine over the stream: the 24-byte header, then per section its
// 16-byte header, its payload and its 4-byte CRC. Integrity faults (a bad
// magic, length or CRC, a stream that disagrees with its end section) stop
// the stream at once. Everything else ImportSessionWire checks is checked
// as the sections complete, in the same order; the first refusal is kept,
// what follows is only checksummed, and the refusal is returned once the
// whole stream proved intact. Sections 0..2 (header, tokens, sampler) are
// kept until the fourth begins (the order check covers all three before
// the session is made); a layer section's index and blob header are
// gathered, then its blob goes to a LayerWireSink straight into the new
// session's cache; QSA aux sections are kept and restored when complete.

struct SessionWireSink::State {
  enum class Stage { kStreamHeader, kSectionHeader, kPayload, kCrc, kEnded };
  enum class Mode { kKeep, kLayer, kSkip };
  struct Kept {
    uint32_t type;
    std::string payload;
  };

  State(const model::Transformer& m, uint64_t fp, std::string session_id, uint64_t max_bytes)
      : model(m), fingerprint(fp), id(std::move(session_id)), max_stream_bytes(max_bytes) {}

  absl::Status Write(std::string_view bytes);
  absl::StatusOr<std::unique_ptr<Session>> Finish();

  // Gathers up to `want` bytes of a fixed-size field into `fixed`; true
  // once it is complete.
  bool Gather(std::string_view bytes, size_t* i, size_t want);
  void StreamHeaderDone();
  void SectionHeaderDone();
  void Payload(std::string_view bytes);
  void LayerPayload(std::string_view bytes);
  // A layer section's index and blob header are in: the blob's sink, or a
  // refusal.
  void BeginLayer(size_t l);
  void SectionDone();
  void EndSection();
  // The first refusal wins; `late`: found after the header section parsed
  // (the section count, checked right after it, outranks it).
  void Refuse(absl::Status st, bool late = true) {
    if (!refused.ok()) return;
    refused = std::move(st);
    refused_late = late;
  }
  void SkipRest() {
    crc = util::Crc32cExtend(crc, layer_head.data(), layer_head.size());
    mode = Mode::kSkip;
  }
  void ProcessPrefix();
  void FinishLayer(size_t l);
  void ProcessAux(const Kept& section);
  size_t num_layers() const { return static_cast<size_t>(model.config().num_hidden_layers); }

  const model::Transformer& model;
  const uint64_t fingerprint;
  std::string id;      // the given one; the stream's own once its header parsed (version 4)
  std::string tenant;  // the stream's (version 4), else none
  const uint64_t max_stream_bytes;
  kv::LayerWireSink::Admit admit;  // SessionWireSink::SetAdmit; may be empty

  Stage stage = Stage::kStreamHeader;
  std::string fixed;     // the stream header, a section header or a CRC being gathered
  uint64_t offset = 0;   // stream bytes consumed
  absl::Status broken;   // an integrity fault: sticky
  absl::Status refused;  // the first other refusal
  bool refused_late = false;
  uint32_t header_crc = 0;  // of the 24-byte stream header
  uint32_t version = 0;     // the stream's, from its header

  // The section being read.
  uint32_t type = 0;
  uint64_t len = 0, got = 0, start = 0;
  uint32_t crc = 0;  // so far (a layer section: of its 20 bytes before the blob)
  Mode mode = Mode::kKeep;
  std::string payload;                    // kKeep
  std::string layer_head;                 // kLayer: index and blob header, gathered
  std::optional<kv::LayerWireSink> sink;  // kLayer: the blob, once begun
  std::future<kv::LayerKvCache> ahead;    // the next layer's cache, being reserved
  size_t ahead_bytes = 0;                 // what `ahead` reserves (the rows of this layer's size)
  size_t count = 0;                       // sections before this one

  // What the sections said.
  std::vector<Kept> prefix;  // sections 0..2
  bool prefix_done = false;
  bool header_ok = false;  // the header section parsed (and `id` is final)
  SessionConfig config;
  std::unique_ptr<Session> session;
  uint64_t cached = 0;
  size_t aux_next = 0;  // index into config.qsa.layers
};

bool SessionWireSink::State::Gather(std::string_view bytes, size_t* i, size_t want) {
  const size_t take = std::min(want - fixed.size(), bytes.size() - *i);
  fixed.append(bytes.data() + *i, take);
  *i += take;
  offset += take;
  return fixed.size() == want;
}

absl::Status SessionWireSink::State::Write(std::string_view bytes) {
  size_t i = 0;
  while (broken.ok() && i < bytes.size()) {
    switch (stage) {
      case Stage::kStreamHeader:
        if (Gather(bytes, &i, kHeaderBytes)) {
          StreamHeaderDone();
        } else if (fixed.size() >= 4 && std::memcmp(fixed.data(), kMagic, 4) != 0) {
          broken = Corrupt("bad magic (not a Cortiq session stream)");
        }
        break;
      case Stage::kSectionHeader:
        if (Gather(bytes, &i, 16)) SectionHeaderDone();
        break;
      case Stage::kPayload: {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(bytes.size() - i, len - got));
        Payload(bytes.substr(i, n));
        i += n;
        offset += n;
        got += n;
        if (got == len) stage = Stage::kCrc;
        break;
      }
      case Stage::kCrc:
        if (Gather(bytes, &i, 4)) SectionDone();
        break;
      case Stage::kEnded:
        broken = Corrupt("bytes after the end section");
        break;
    }
  }
  return broken;
}

void SessionWireSink::State::StreamHeaderDone() {
  ByteReader r(fixed);  // 24 bytes: every read below succeeds
  char magic[4] = {};
  uint32_t flags = 0, reserved = 0;
  uint64_t fp = 0;
  r.Raw(magic, 4);
  r.U32(&version);
  r.U32(&flags);
  r.U32(&reserved);
  r.U64(&fp);
  if (std::memcmp(magic, kMagic, 4) != 0) {
    broken = Corrupt("bad magic (not a Cortiq session stream)");
    return;
  }
  // Checked before the checksums: an unknown version may checksum differently.
  if (version < kSessionWireMinVersion || version > kSessionWireMaxVersion) {
    broken = absl::FailedPreconditionError(
        absl::StrCat("session wire: version ", version, ": this server reads ",
                     kSessionWireMinVersion, "..", kSessionWireMaxVersion));
    return;
  }
  if ((flags & ~kFlagF16) != 0 || reserved != 0) {
    broken = Corrupt("unknown flags");
    return;
  }
  header_crc = util::Crc32c(fixed);
  // The identity check comes after the integrity check: a corrupt stream is
  // DATA_LOSS even when the corruption hit the fingerprint.
  if (fp != fingerprint) {
    Refuse(absl::FailedPreconditionError(absl::StrFormat(
               "session wire: model fingerprint %016x in the stream, %016x here: the session was "
               "made by another model (weights, config or tokenizer)",
               fp, fingerprint)),
           /*late=*/false);
  }
  fixed.clear();
  stage = Stage::kSectionHeader;
}

void SessionWireSink::State::SectionHeaderDone() {
  ByteReader r(fixed);  // 16 bytes
  uint32_t rsv = 0;
  r.U32(&type);
  r.U32(&rsv);
  r.U64(&len);
  if (rsv != 0) {
    broken = Corrupt(absl::StrCat("section ", count, " (", util::Sv(SectionName(type)),
                                  "): length ", len, " runs past the end of the stream"));
    return;
  }
  // The sampler section is kept whole in memory: its length is bounded by
  // what a sampler state can be (a present byte + the largest blob).
  if (count == 2 && type == kSectionSampler && len > 1 + model::Sampler::kMaxStateBytes) {
    broken = Corrupt(absl::StrCat("section 2 (sampler): length ", len, ", at most ",
                                  1 + model::Sampler::kMaxStateBytes));
    return;
  }
  start = offset - fixed.size();
  crc = util::Crc32c(fixed);
  fixed.clear();
  got = 0;
  payload.clear();
  layer_head.clear();
  sink.reset();
  const size_t layers = num_layers();
  if (type == kSectionEnd || (refused.ok() && count < 3)) {
    mode = Mode::kKeep;
  } else {
    if (!prefix_done) ProcessPrefix();  // the fourth section has begun
    if (!refused.ok()) {
      mode = Mode::kSkip;
    } else if (count < 3 + layers) {
      mode = Mode::kLayer;
      if (type != kSectionLayer || len < sizeof(uint32_t)) {
        Refuse(Corrupt(absl::StrCat("layer ", count - 3, ": missing or out of order")));
        mode = Mode::kSkip;
      }
    } else if (config.attention == AttentionMode::kQsa && aux_next < config.qsa.layers.size()) {
      mode = Mode::kKeep;
    } else {
      Refuse(Corrupt("unexpected sections after the layers"));
      mode = Mode::kSkip;
    }
  }
  stage = len == 0 ? Stage::kCrc : Stage::kPayload;
}

void SessionWireSink::State::Payload(std::string_view bytes) {
  switch (mode) {
    case Mode::kKeep:
      payload.append(bytes);
      crc = util::Crc32cExtend(crc, bytes.data(), bytes.size());
      break;
    case Mode::kSkip:
      crc = util::Crc32cExtend(crc, bytes.data(), bytes.size());
      break;
    case Mode::kLayer:
      LayerPayload(bytes);
      break;
  }
}

void SessionWireSink::State::LayerPayload(std::string_view bytes) {
  if (!sink) {
    // The index and the blob's header first (all of a shorter payload).
    const size_t want =
        static_cast<size_t>(std::min<uint64_t>(len, sizeof(uint32_t) + kv::kWireHeaderBytes));
    const size_t take = std::min(want - layer_head.size(), bytes.size());
    layer_head.append(bytes.data(), take);
    bytes.remove_prefix(take);
    if (layer_head.size() < want) return;
    BeginLayer(count - 3);
    if (!sink) {  // refused: the rest is only checksummed
      SkipRest();
      Payload(bytes);
      return;
    }
  }
  sink->Write(bytes);
}

void SessionWireSink::State::BeginLayer(size_t l) {
  uint32_t index;
  std::memcpy(&index, layer_head.data(), sizeof(index));
  const uint64_t blob_bytes = len - sizeof(uint32_t);
  const uint64_t blob_at = start + 16 + sizeof(uint32_t);
  if (index != l) {
    return Refuse(Corrupt(absl::StrCat("layer ", l, ": missing or out of order")));
  }
  if (blob_bytes > max_stream_bytes - std::min(max_stream_bytes, blob_at)) {
    // It cannot arrive within the limit: reserve nothing (the caller
    // refuses the stream before it ends, or it ends truncated).
    return Refuse(absl::ResourceExhaustedError(
        absl::StrCat("layer ", l, ": ", blob_bytes, " bytes, more than the stream may hold")));
  }
  const model::ModelConfig& m = model.config();
  const kv::WireImportExpect expect{static_cast<size_t>(m.num_attention_heads),
                                    static_cast<size_t>(m.max_position_embeddings)};
  const size_t H = static_cast<size_t>(m.num_key_value_heads);
  const size_t D = static_cast<size_t>(m.head_dim);
  std::optional<kv::LayerKvCache> spare;
  if (ahead.valid()) spare = ahead.get();
  ahead_bytes = 0;
  absl::StatusOr<kv::LayerWireSink> begun =
      kv::LayerWireSink::Begin(std::string_view(layer_head).substr(sizeof(uint32_t)), blob_bytes, H,
                               D, config.kv_mode, expect, spare ? &*spare : nullptr, admit);
  if (!begun.ok() && begun.status().code() == absl::StatusCode::kResourceExhausted) {
    // Refused by admit (the importer's budget): stop now, allocate nothing.
    broken = absl::ResourceExhaustedError(absl::StrCat("layer ", l, ": ", begun.status().message()));
    return;
  }
  if (!begun.ok()) {
    return Refuse(absl::Status(begun.status().code(),
                               absl::StrCat("layer ", l, ": ", begun.status().message())));
  }
  sink = *std::move(begun);
  crc = util::Crc32cExtend(crc, layer_head.data(), sizeof(uint32_t));
  // A large layer: reserve the next one's rows on another thread while this
  // one arrives (page-faulting fresh memory costs as much as copying the
  // rows into it); taken only if the next blob asks for the same, and only
  // if its bytes can still arrive within the limit.
  const size_t positions = sink->reserved_positions();
  const uint64_t next_end = blob_at + 2 * blob_bytes + kv::kWireCrcBytes + 16 + sizeof(uint32_t);
  if (positions > 0 && blob_bytes >= kReserveAheadBytes && l + 1 < num_layers() &&
      next_end <= max_stream_bytes &&
      (!admit || admit(kv::LayerKvCache::ProjectedBytes(H, D, config.kv_mode, positions)).ok())) {
    const kv::KvMode mode = config.kv_mode;
    ahead_bytes = kv::LayerKvCache::ProjectedBytes(H, D, mode, positions);
    ahead = std::async(std::launch::async, [H, D, mode, positions] {
      kv::LayerKvCache next(H, D, mode);
      next.Reserve(positions);
      return next;
    });
  }
}

void SessionWireSink::State::SectionDone() {
  uint32_t stored;
  std::memcpy(&stored, fixed.data(), sizeof(stored));
  fixed.clear();
  uint32_t want = crc;
  if (mode == Mode::kLayer) {
    // CRC(type, reserved, length, index, blob) from the blob's own: its last
    // four bytes are its checksum over everything before them.
    const uint32_t blob_crc = sink->stored_crc();
    char le[4];
    std::memcpy(le, &blob_crc, sizeof(le));
    want = util::Crc32cExtend(
        util::Crc32cCombine(crc, sink->body_crc(), len - sizeof(uint32_t) - sizeof(le)), le,
        sizeof(le));
  }
  if (stored != want) {
    broken = Corrupt(
        absl::StrCat("section ", count, " (", util::Sv(SectionName(type)), "): checksum mismatch"));
    return;
  }
  if (type == kSectionEnd) {
    EndSection();
    return;
  }
  const size_t index = count++;
  stage = Stage::kSectionHeader;
  if (mode == Mode::kSkip) return;
  if (index < 3) {
    prefix.push_back({type, std::move(payload)});
  } else if (mode == Mode::kLayer) {
    FinishLayer(index - 3);
  } else {
    ProcessAux({type, std::move(payload)});
  }
}

void SessionWireSink::State::EndSection() {
  ByteReader e(payload);
  uint64_t total;
  uint32_t sections, crc_of_header;
  if (!e.U64(&total) || !e.U32(&sections) || !e.U32(&crc_of_header) || !e.done() ||
      total != start || sections != count) {
    broken = Corrupt("end section disagrees with the stream");
  } else if (crc_of_header != header_crc) {
    broken = Corrupt("stream header checksum mismatch");
  }
  stage = Stage::kEnded;
}

void SessionWireSink::State::ProcessPrefix() {
  prefix_done = true;
  if (!refused.ok()) return;
  // Order: header, tokens, sampler, layers 0..L-1, QSA aux blobs.
  if (prefix.empty() || prefix[0].type != kSectionHeader) {
    return Refuse(Corrupt("no header section"), /*late=*/false);
  }
  // The geometry first: another model's session is FAILED_PRECONDITION.
  const model::ModelConfig& mcfg = model.config();
  absl::StatusOr<ParsedHeader> parsed = ParseHeader(prefix[0].payload, mcfg, version);
  if (!parsed.ok()) return Refuse(parsed.status(), /*late=*/false);
  config = parsed->config;
  if (!parsed->id.empty()) id = std::move(parsed->id);  // version 4: the session's own
  tenant = std::move(parsed->tenant);
  header_ok = true;
  if (prefix.size() < 3) return Refuse(Corrupt("missing sections"));
  if (prefix[1].type != kSectionTokens || prefix[2].type != kSectionSampler) {
    return Refuse(Corrupt("sections out of order"));
  }
  absl::StatusOr<std::unique_ptr<Session>> made = Session::Create(id, model, config);
  if (!made.ok()) return Refuse(Corrupt(absl::StrCat("header: ", made.status().message())));
  session = *std::move(made);
  session->set_tenant(tenant);
  Session* s = session.get();

  // Tokens.
  ByteReader t(prefix[1].payload);
  uint64_t n;
  uint32_t pending_len;
  if (!t.U64(&n) || n > t.remaining() / sizeof(int32_t)) {
    return Refuse(Corrupt("tokens: bad count"));
  }
  std::vector<int32_t> tokens(n);
  std::string_view pending;
  if (!t.Raw(tokens.data(), n * sizeof(int32_t)) || !t.U64(&cached) || !t.U32(&pending_len) ||
      pending_len > 3 || !t.Bytes(pending_len, &pending) || !t.done()) {
    return Refuse(Corrupt("tokens: malformed"));
  }
  // Ids in the vocabulary, cached <= tokens ("tokens: ..." messages).
  absl::Status history = s->RestoreHistory(std::move(tokens), cached, pending);
  if (!history.ok()) return Refuse(Corrupt(std::string(history.message())));

  // Sampler.
  ByteReader sr(prefix[2].payload);
  uint8_t has_sampler;
  if (!sr.U8(&has_sampler) || has_sampler > 1) return Refuse(Corrupt("sampler: malformed"));
  if (has_sampler == 1) {
    std::string_view blob;
    sr.Bytes(sr.remaining(), &blob);
    absl::StatusOr<model::Sampler> sampler = model::Sampler::Deserialize(blob);
    if (!sampler.ok()) {
      return Refuse(Corrupt(absl::StrCat("sampler: ", sampler.status().message())));
    }
    s->RestoreSampler(*std::move(sampler));
  } else if (!sr.done()) {
    return Refuse(Corrupt("sampler: trailing bytes"));
  }
  prefix.clear();
}

// Layers: each blob imported into a fresh cache of this model's geometry.
void SessionWireSink::State::FinishLayer(size_t l) {
  absl::StatusOr<kv::LayerKvCache> cache = sink->Finish();
  sink.reset();
  if (!cache.ok()) {
    return Refuse(absl::Status(cache.status().code(),
                               absl::StrCat("layer ", l, ": ", cache.status().message())));
  }
  // The state checks the cache against the session (positions, mode).
  absl::Status installed = session->InstallLayerCache(l, *std::move(cache), cached);
  if (!installed.ok()) return Refuse(Corrupt(absl::StrCat("layer ", l, ": ", installed.message())));
}

// QSA aux blobs: exactly one per bound QSA layer, ascending.
void SessionWireSink::State::ProcessAux(const Kept& sec) {
  const size_t l = config.qsa.layers[aux_next++];
  ByteReader ar(sec.payload);
  uint32_t index;
  if (sec.type != kSectionQsaAux || !ar.U32(&index) || index != l) {
    return Refuse(Corrupt(absl::StrCat("qsa_aux: layer ", l, " missing or out of order")));
  }
  std::string_view blob;
  ar.Bytes(ar.remaining(), &blob);
  absl::Status st = session->RestoreLayerAux(
      l, model.qsa_runtime(),
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(blob.data()), blob.size()));
  const attention::LayerAttentionState& state = session->kv().layer(l);
  if (!st.ok()) return Refuse(Corrupt(absl::StrCat("qsa_aux: layer ", l, ": ", st.message())));
  if (!state.HasAux() || state.AuxPositions() != cached) {
    return Refuse(Corrupt(absl::StrCat("qsa_aux: layer ", l, " disagrees with the cache length")));
  }
}

absl::StatusOr<std::unique_ptr<Session>> SessionWireSink::State::Finish() {
  if (!broken.ok()) return broken;
  switch (stage) {
    case Stage::kStreamHeader:
      return fixed.size() < 4 ? Corrupt("bad magic (not a Cortiq session stream)")
                              : Corrupt("truncated header");
    case Stage::kSectionHeader:
      return Corrupt("truncated section header");
    case Stage::kPayload:
      return Corrupt(absl::StrCat("section ", count, " (", util::Sv(SectionName(type)),
                                  "): length ", len, " runs past the end of the stream"));
    case Stage::kCrc:
      return Corrupt("truncated section checksum");
    case Stage::kEnded:
      break;
  }
  if (!prefix_done) ProcessPrefix();
  // The section count is checked right after the header section parsed.
  if (header_ok && (refused.ok() || refused_late) && count < 3 + num_layers()) {
    return Corrupt("missing sections");
  }
  if (!refused.ok()) return refused;
  if (config.attention == AttentionMode::kQsa && aux_next < config.qsa.layers.size() &&
      cached != 0) {  // a session never bound has nothing ingested, hence no aux
    return Corrupt(absl::StrCat("qsa_aux: layer ", config.qsa.layers[aux_next], " missing"));
  }
  session->PublishMemory();
  return std::move(session);
}

SessionWireSink::SessionWireSink(const model::Transformer& model, uint64_t fingerprint,
                                 std::string id, uint64_t max_stream_bytes)
    : state_(std::make_unique<State>(model, fingerprint, std::move(id), max_stream_bytes)) {}
SessionWireSink::~SessionWireSink() = default;
SessionWireSink::SessionWireSink(SessionWireSink&&) noexcept = default;

void SessionWireSink::SetAdmit(kv::LayerWireSink::Admit admit) { state_->admit = std::move(admit); }

absl::Status SessionWireSink::Write(std::string_view bytes) { return state_->Write(bytes); }

absl::StatusOr<std::unique_ptr<Session>> SessionWireSink::Finish() { return state_->Finish(); }

std::optional<std::string> SessionWireSink::session_id() const {
  if (!state_->header_ok) return std::nullopt;
  return state_->id;
}

size_t SessionWireSink::held_bytes() const {
  const State& st = *state_;
  size_t bytes = st.fixed.capacity() + st.payload.capacity() + st.layer_head.capacity();
  for (const State::Kept& k : st.prefix) bytes += k.payload.capacity();
  if (st.session) {
    bytes += MemoryOf(st.session->kv()).total() + st.session->tokens().capacity() * sizeof(int32_t);
  }
  if (st.sink) bytes += st.sink->held_bytes();
  // A spare taken from `ahead` but not used (another capacity) is freed in
  // BeginLayer, so a ready future and ahead_bytes agree.
  if (st.ahead.valid()) bytes += st.ahead_bytes;
  return bytes;
}

absl::StatusOr<std::unique_ptr<Session>> ImportSessionWire(std::string_view wire,
                                                           const model::Transformer& model,
                                                           uint64_t fingerprint, std::string id) {
  SessionWireSink sink(model, fingerprint, std::move(id), wire.size());
  CORTIQ_RETURN_IF_ERROR(sink.Write(wire));
  return sink.Finish();
}

}  // namespace cortiq::session
