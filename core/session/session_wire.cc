#include "core/session/session_wire.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/kv/layer_kv_cache.h"
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
    case kSectionHeader: return "header";
    case kSectionTokens: return "tokens";
    case kSectionSampler: return "sampler";
    case kSectionLayer: return "layer";
    case kSectionQsaAux: return "qsa_aux";
    case kSectionEnd: return "end";
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

// Header payload: geometry (checked against the importer's model) and the
// session configuration.
std::string HeaderPayload(const model::ModelConfig& m, const SessionConfig& c) {
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
  return w.Take();
}

absl::StatusOr<SessionConfig> ParseHeader(std::string_view payload, const model::ModelConfig& m) {
  ByteReader r(payload);
  uint32_t layers, heads, kv_heads, head_dim, vocab;
  if (!r.U32(&layers) || !r.U32(&heads) || !r.U32(&kv_heads) || !r.U32(&head_dim) ||
      !r.U32(&vocab)) {
    return Corrupt("header: truncated geometry");
  }
  auto mismatch = [](std::string_view field, uint64_t wire, int64_t here) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session wire: ", util::Sv(field), " is ", wire, " in the stream but ", here,
        " in this server's model: the session belongs to another geometry"));
  };
  if (layers != uint64_t(m.num_hidden_layers)) return mismatch("num_layers", layers, m.num_hidden_layers);
  if (heads != uint64_t(m.num_attention_heads)) return mismatch("num_attention_heads", heads, m.num_attention_heads);
  if (kv_heads != uint64_t(m.num_key_value_heads)) return mismatch("num_key_value_heads", kv_heads, m.num_key_value_heads);
  if (head_dim != uint64_t(m.head_dim)) return mismatch("head_dim", head_dim, m.head_dim);
  if (vocab != uint64_t(m.vocab_size)) return mismatch("vocab_size", vocab, m.vocab_size);
  SessionConfig c;
  uint8_t kv_mode, attention, rect;
  uint32_t o1m, o1w, o1sink, ratio, budget;
  if (!r.U8(&kv_mode) || kv_mode > 1 || !r.U8(&attention) || attention > 2 || !r.U32(&o1m) ||
      !r.U32(&o1w) || !r.U32(&o1sink) || !r.U8(&rect) || rect > 1 ||
      !GetLayerList(r, layers, &c.o1.layers) || !r.U32(&ratio) || !r.U32(&budget) ||
      !GetLayerList(r, layers, &c.qsa.layers) || !r.done()) {
    return Corrupt("header: malformed session configuration");
  }
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
  c.kv_mode = kv_mode == 1 ? kv::KvMode::kInt8 : kv::KvMode::kF32;
  c.attention = static_cast<AttentionMode>(attention);
  c.o1.m = o1m;
  c.o1.w = o1w;
  c.o1.sink = o1sink;
  c.o1.rect = rect == 1 ? kv::O1Rect::kFm : kv::O1Rect::kAggregate;
  c.qsa.ratio = ratio;
  c.qsa.budget = budget;
  return c;
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

absl::StatusOr<uint32_t> NegotiateWireVersion(const std::vector<uint32_t>& peer_versions) {
  uint32_t best = 0;
  for (uint32_t v : peer_versions) {
    if (v >= kSessionWireMinVersion && v <= kSessionWireMaxVersion) best = std::max(best, v);
  }
  if (best == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "wire version: the peer speaks none of the versions this server writes (",
        kSessionWireMinVersion, "..", kSessionWireMaxVersion, ")"));
  }
  return best;
}

absl::StatusOr<std::string> ExportSessionWire(const Session& session, uint64_t fingerprint,
                                              const SessionWireOptions& options) {
  if (options.version < kSessionWireMinVersion || options.version > kSessionWireMaxVersion) {
    return absl::InvalidArgumentError(absl::StrCat("version: ", options.version,
                                                   " is not one this server writes (",
                                                   kSessionWireMinVersion, "..",
                                                   kSessionWireMaxVersion, ")"));
  }
  const model::SequenceKv& kv = session.kv();
  const auto& layers = kv.layers();
  ByteWriter w;
  // One allocation for the whole stream: the layers' bytes bound their blobs.
  w.Reserve(kv.MemoryBytes() + session.tokens().size() * sizeof(int32_t) + 4096 +
            layers.size() * 128);
  w.Raw(kMagic, 4);
  w.U32(options.version);
  w.U32(options.f16 ? kFlagF16 : 0);
  w.U32(0);
  w.U64(fingerprint);
  size_t sections = 0;

  // The geometry comes from the caches themselves (the session's model).
  model::ModelConfig geometry;
  geometry.num_hidden_layers = static_cast<int64_t>(layers.size());
  geometry.num_key_value_heads = layers.empty() ? 0 : static_cast<int64_t>(layers[0].num_kv_heads());
  geometry.head_dim = layers.empty() ? 0 : static_cast<int64_t>(layers[0].head_dim());
  geometry.num_attention_heads = session.num_attention_heads();
  geometry.vocab_size = session.vocab_size();
  PutSection(w, kSectionHeader, HeaderPayload(geometry, session.config()));
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
  lo.version = options.version;
  lo.f16 = options.f16;
  for (size_t l = 0; l < layers.size(); ++l) {
    absl::StatusOr<std::string> blob = layers[l].ExportWire(lo);
    if (!blob.ok()) {
      return absl::Status(blob.status().code(),
                          absl::StrCat("layer ", l, ": ", blob.status().message()));
    }
    ByteWriter p;
    p.U32(static_cast<uint32_t>(l));
    p.Bytes(*blob);
    PutSection(w, kSectionLayer, p.str());
    ++sections;
  }
  if (session.config().attention == AttentionMode::kQsa) {
    for (size_t l : session.config().qsa.layers) {
      if (kv.qsa_state(l) == nullptr) continue;  // not bound yet: nothing ingested
      CORTIQ_ASSIGN_OR_RETURN(std::vector<uint8_t> aux, kv.QsaSnapshotAux(l));
      ByteWriter p;
      p.U32(static_cast<uint32_t>(l));
      p.Raw(aux.data(), aux.size());
      PutSection(w, kSectionQsaAux, p.str());
      ++sections;
    }
  }
  {
    ByteWriter e;
    e.U64(w.size());
    e.U32(static_cast<uint32_t>(sections));
    e.U32(util::Crc32c(std::string_view(w.str()).substr(0, kHeaderBytes)));
    PutSection(w, kSectionEnd, e.str());
  }
  return w.Take();
}

absl::StatusOr<std::unique_ptr<Session>> ImportSessionWire(std::string_view wire,
                                                           const model::Transformer& model,
                                                           uint64_t fingerprint, std::string id) {
  const model::ModelConfig& mcfg = model.config();
  ByteReader r(wire);
  char magic[4];
  uint32_t version, flags, reserved;
  uint64_t fp;
  if (!r.Raw(magic, 4) || std::memcmp(magic, kMagic, 4) != 0) {
    return Corrupt("bad magic (not a Cortiq session stream)");
  }
  if (!r.U32(&version) || !r.U32(&flags) || !r.U32(&reserved) || !r.U64(&fp)) {
    return Corrupt("truncated header");
  }
  // Checked before the checksums: an unknown version may checksum differently.
  if (version < kSessionWireMinVersion || version > kSessionWireMaxVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session wire: version ", version, ": this server reads ", kSessionWireMinVersion, "..",
        kSessionWireMaxVersion));
  }
  if ((flags & ~kFlagF16) != 0 || reserved != 0) return Corrupt("unknown flags");

  // Split into sections, verifying each length and CRC before parsing any.
  struct Section {
    uint32_t type;
    std::string_view payload;
  };
  std::vector<Section> sections;
  bool ended = false;
  while (!ended) {
    const size_t start = r.pos();
    uint32_t type, rsv;
    uint64_t len;
    if (!r.U32(&type) || !r.U32(&rsv) || !r.U64(&len)) return Corrupt("truncated section header");
    std::string_view payload;
    if (rsv != 0 || len > r.remaining() || !r.Bytes(len, &payload)) {
      return Corrupt(absl::StrCat("section ", sections.size(), " (", util::Sv(SectionName(type)),
                                  "): length ", len, " runs past the end of the stream"));
    }
    uint32_t crc;
    if (!r.U32(&crc)) return Corrupt("truncated section checksum");
    if (crc != util::Crc32c(wire.substr(start, r.pos() - 4 - start))) {
      return Corrupt(absl::StrCat("section ", sections.size(), " (", util::Sv(SectionName(type)),
                                  "): checksum mismatch"));
    }
    if (type == kSectionEnd) {
      ByteReader e(payload);
      uint64_t total;
      uint32_t count, header_crc;
      if (!e.U64(&total) || !e.U32(&count) || !e.U32(&header_crc) || !e.done() ||
          total != start || count != sections.size()) {
        return Corrupt("end section disagrees with the stream");
      }
      if (header_crc != util::Crc32c(wire.substr(0, kHeaderBytes))) {
        return Corrupt("stream header checksum mismatch");
      }
      ended = true;
    } else {
      sections.push_back({type, payload});
    }
  }
  if (!r.done()) return Corrupt("bytes after the end section");
  // The identity check comes after the integrity check: a corrupt stream is
  // DATA_LOSS even when the corruption hit the fingerprint.
  if (fp != fingerprint) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "session wire: model fingerprint %016x in the stream, %016x here: the session was made "
        "by another model (weights, config or tokenizer)",
        fp, fingerprint));
  }

  // Order: header, tokens, sampler, layers 0..L-1, QSA aux blobs.
  const size_t num_layers = static_cast<size_t>(mcfg.num_hidden_layers);
  if (sections.empty() || sections[0].type != kSectionHeader) return Corrupt("no header section");
  // The geometry first: another model's session is FAILED_PRECONDITION.
  CORTIQ_ASSIGN_OR_RETURN(SessionConfig config, ParseHeader(sections[0].payload, mcfg));
  if (sections.size() < 3 + num_layers) return Corrupt("missing sections");
  if (sections[1].type != kSectionTokens || sections[2].type != kSectionSampler) {
    return Corrupt("sections out of order");
  }
  absl::StatusOr<std::unique_ptr<Session>> made = Session::Create(std::move(id), model, config);
  if (!made.ok()) return Corrupt(absl::StrCat("header: ", made.status().message()));
  std::unique_ptr<Session> s = *std::move(made);

  // Tokens.
  ByteReader t(sections[1].payload);
  uint64_t n, cached;
  uint32_t pending_len;
  if (!t.U64(&n) || n > t.remaining() / sizeof(int32_t)) return Corrupt("tokens: bad count");
  s->tokens().resize(n);
  std::string_view pending;
  if (!t.Raw(s->tokens().data(), n * sizeof(int32_t)) || !t.U64(&cached) ||
      !t.U32(&pending_len) || pending_len > 3 || !t.Bytes(pending_len, &pending) || !t.done()) {
    return Corrupt("tokens: malformed");
  }
  for (int32_t id_ : s->tokens()) {
    if (id_ < 0 || id_ >= mcfg.vocab_size) return Corrupt("tokens: id outside the vocabulary");
  }
  if (cached > n) return Corrupt("tokens: more cached positions than tokens");
  s->detok_pending() = std::string(pending);

  // Sampler.
  ByteReader sr(sections[2].payload);
  uint8_t has_sampler;
  if (!sr.U8(&has_sampler) || has_sampler > 1) return Corrupt("sampler: malformed");
  if (has_sampler == 1) {
    std::string_view blob;
    sr.Bytes(sr.remaining(), &blob);
    absl::StatusOr<model::Sampler> sampler = model::Sampler::Deserialize(blob);
    if (!sampler.ok()) return Corrupt(absl::StrCat("sampler: ", sampler.status().message()));
    s->sampler() = *std::move(sampler);
  } else if (!sr.done()) {
    return Corrupt("sampler: trailing bytes");
  }

  // Layers: each blob imported into a fresh cache of this model's geometry.
  auto& layers = s->kv().layers();
  for (size_t l = 0; l < num_layers; ++l) {
    const Section& sec = sections[3 + l];
    ByteReader lr(sec.payload);
    uint32_t index;
    if (sec.type != kSectionLayer || !lr.U32(&index) || index != l) {
      return Corrupt(absl::StrCat("layer ", l, ": missing or out of order"));
    }
    std::string_view blob;
    lr.Bytes(lr.remaining(), &blob);
    kv::LayerKvCache cache(static_cast<size_t>(mcfg.num_key_value_heads),
                           static_cast<size_t>(mcfg.head_dim), config.kv_mode);
    const kv::WireImportExpect expect{static_cast<size_t>(mcfg.num_attention_heads),
                                      static_cast<size_t>(mcfg.max_position_embeddings)};
    if (absl::Status st = cache.ImportWire(blob, expect); !st.ok()) {
      return absl::Status(st.code(), absl::StrCat("layer ", l, ": ", st.message()));
    }
    if (cache.seq_len() != cached) {
      return Corrupt(absl::StrCat("layer ", l, ": ", cache.seq_len(), " positions, the session ",
                                  cached));
    }
    const bool o1_layer = config.attention == AttentionMode::kO1 && config.o1.IsO1Layer(l);
    if (cache.O1Sealed() && !o1_layer) {
      return Corrupt(absl::StrCat("layer ", l, ": sealed O(1) state on a layer the session runs exact"));
    }
    layers[l] = std::move(cache);
  }
  // QSA aux blobs: exactly one per bound QSA layer, ascending.
  size_t next = 3 + num_layers;
  if (config.attention == AttentionMode::kQsa) {
    for (size_t l : config.qsa.layers) {
      if (next >= sections.size()) {
        if (cached == 0) break;  // never bound: nothing ingested
        return Corrupt(absl::StrCat("qsa_aux: layer ", l, " missing"));
      }
      const Section& sec = sections[next++];
      ByteReader ar(sec.payload);
      uint32_t index;
      if (sec.type != kSectionQsaAux || !ar.U32(&index) || index != l) {
        return Corrupt(absl::StrCat("qsa_aux: layer ", l, " missing or out of order"));
      }
      std::string_view blob;
      ar.Bytes(ar.remaining(), &blob);
      absl::Status st = model.QsaRestoreAux(
          s->kv(), l,
          std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(blob.data()), blob.size()));
      if (!st.ok()) return Corrupt(absl::StrCat("qsa_aux: layer ", l, ": ", st.message()));
      const qsa::QsaSeqState* qs = s->kv().qsa_state(l);
      if (qs == nullptr || qs->ingested() != cached) {
        return Corrupt(absl::StrCat("qsa_aux: layer ", l, " disagrees with the cache length"));
      }
    }
  }
  if (next != sections.size()) return Corrupt("unexpected sections after the layers");
  s->PublishMemory();
  return s;
}

}  // namespace cortiq::session
