// LayerKvCache::ExportWire / ImportWire: the per-layer wire format of
// session migration (seed 001 export_wire / import_wire; the contract is in
// layer_kv_cache.h, the same layout in docs/WIRE_FORMAT.md).
//
// Layer blob "CQKV". Little-endian, no padding, no alignment: every field is
// read and written with memcpy at the offset shown.
//
//   off   size  field
//     0      4  magic "CQKV" (43 51 4B 56)
//     4      4  u32 version: 1 or 2
//     8      4  u32 flags: bit0 F16  f32 rows travel as f16 (alone only)
//                          bit1 INT8 the cache is KvMode::kInt8 (version 2)
//                          bit2 O1   a sealed O(1) layer (version 2, not with INT8)
//                          bits 3..31 zero
//    12      4  u32 num_kv_heads H (>= 1)
//    16      4  u32 head_dim D (>= 1)
//    20      8  u64 seq_len S: positions appended (O1: absorbed by the states)
//    28      8  u64 capacity C: positions the exporter had reserved, >= S
//                 (O1: 0, the exact storage is freed at the seal)
//    36      8  u64 body_bytes B
//    44      B  body (below)
//  44+B      4  u32 CRC-32C (Castagnoli) of bytes [0, 44 + B)
//  total 48 + B bytes.
//
// Exact body (O1 clear): for each KV head h = 0..H-1, its S stored rows —
//   f32:   K_h f32[S×D], V_h f32[S×D]
//   F16:   K_h f16[S×D], V_h f16[S×D]   (IEEE binary16, round to nearest even)
//   INT8:  K_h i8[S×D], K scales f32[S], V_h i8[S×D], V scales f32[S]
//   so B = H × (the above), exactly. Every head holds S rows (dead heads are
//   refused at export), so no per-head length travels.
//
// O1 body (sealed layer, f32 mode):
//   u32 num_q_heads Q (a multiple of H; group g owns Q heads g·Q/H ..)
//   for each KV group g = 0..H-1 (one NystromState, d = dv = D):
//     u64 m, u64 w, u64 sink, u64 m_eff (0 in exact-only mode)
//     u8  exact_only (0 or 1)
//     f32 scale (the state's 1/√d, bits verbatim)
//     u64 win_len, u64 win_head, u64 sink_len
//     f32 win_k[cap×D], f32 win_v[cap×D]   cap = win_len if exact_only, else w
//                                          (the whole ring, unused slots too)
//     f32 sink_k[sink_len×D], f32 sink_v[sink_len×D]
//     f32 k_tilde[m_eff×D]
//     for each of its Q/H query heads:
//       u8  rect (0 aggregate, 1 fm)
//       u64 far_len
//       f32 t_hat[m_eff×D], z_hat[m_eff], m_max[m_eff] (running maxima, -inf
//           allowed), q_tilde[m_eff×D], mu[m_eff×m_eff]
//   Every float of the state travels bit for bit (F16 never applies), so
//   O1Step after import is bit-identical to O1Step on the exporter.
//
// Import order (ImportWire): size >= 48 → magic → version (FailedPrecondition
// when unknown) → B == size − 48 → CRC → flags → geometry against the
// caller's (FailedPrecondition) → body, every array length checked against
// the bytes left before it is allocated → the new state is built aside in a
// fresh LayerKvCache and moved into *this only when complete. Past the CRC,
// an impossible value can only come from a buggy or forged exporter; it is
// still DataLoss, never a crash.
//
// Both directions run piece by piece (layer_wire.h): LayerWireSource reads
// the header, then each head's rows straight from the cache, then the CRC;
// LayerWireSink checks the header up to the length when it begins, checks
// the rest of it (and reserves the rows) at once but reports those errors
// only after the CRC, as the order above says, and writes each head's rows
// straight into the new cache. ExportWire / ImportWire run them over one
// buffer.
#include "core/kv/layer_wire.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/kv/kv_rows.h"
#include "core/kv/layer_kv_cache.h"
#include "core/kv/nystrom.h"
#include "core/kv/wire_refusal.h"
#include "core/math/kernels.h"
#include "core/util/crc32c.h"
#include "core/util/status_macros.h"

namespace cortiq::kv {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the CQKV blob is little-endian and written with memcpy");

constexpr char kMagic[4] = {'C', 'Q', 'K', 'V'};
constexpr size_t kHeaderBytes = kWireHeaderBytes;
constexpr size_t kCrcBytes = kWireCrcBytes;
constexpr uint32_t kFlagF16 = 1u << 0;
constexpr uint32_t kFlagInt8 = 1u << 1;
constexpr uint32_t kFlagO1 = 1u << 2;
constexpr uint32_t kFlagsV1 = kFlagF16;
constexpr uint32_t kFlagsV2 = kFlagF16 | kFlagInt8 | kFlagO1;
// f32 magnitudes from here up round to f16 infinity.
constexpr float kF16Overflow = 65520.0f;
// f16 conversions go through a small local buffer: the blob gives 2-byte
// fields no alignment guarantee (a session wraps layer blobs at any offset).
constexpr size_t kF16Chunk = 256;

absl::Status Refused(WireRefusal reason, absl::string_view why) {
  return WireRefused(reason, absl::StrCat("ExportWire refused: ", why));
}
// Index of the first NaN or infinity in x (x.size() when all are finite).
// The all-finite pass is a branch-free OR over the exponent bits, so it
// vectorises; only a stream with a bad value pays for locating it.
size_t FirstNonFinite(std::span<const float> x) {
  constexpr uint32_t kExp = 0x7f800000u;
  uint32_t bad = 0;
  for (float v : x) bad |= uint32_t((std::bit_cast<uint32_t>(v) & kExp) == kExp);
  if (bad == 0) return x.size();
  for (size_t i = 0; i < x.size(); ++i) {
    if ((std::bit_cast<uint32_t>(x[i]) & kExp) == kExp) return i;
  }
  return x.size();
}

absl::Status Corrupt(absl::string_view why) {
  return absl::DataLossError(absl::StrCat("CQKV layer blob corrupt: ", why));
}
absl::Status Mismatch(absl::string_view what, uint64_t blob, uint64_t here) {
  return absl::FailedPreconditionError(absl::StrCat("CQKV geometry mismatch: the blob has ", what,
                                                    " ", blob, ", this layer ", here));
}

// a · b, or false on overflow.
bool Mul(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_mul_overflow(a, b, out); }

// Appends fields at the end of a preallocated buffer; with a null buffer it
// only counts (the first pass sizes a sealed layer's body so it is allocated
// once).
class Writer {
 public:
  explicit Writer(char* out) : out_(out) {}
  size_t size() const { return n_; }
  void Bytes(const void* src, size_t n) {
    if (out_ != nullptr && n > 0) std::memcpy(out_ + n_, src, n);
    n_ += n;
  }
  template <typename T>
  void Put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    Bytes(&v, sizeof(v));
  }
  void Floats(std::span<const float> v) { Bytes(v.data(), v.size() * sizeof(float)); }

 private:
  char* out_;
  size_t n_ = 0;
};

// Reads fields front to back; every read checks the bytes left first, so a
// length field can never make it allocate or read past the buffer.
class Reader {
 public:
  explicit Reader(std::string_view buf) : p_(buf.data()), left_(buf.size()) {}
  size_t left() const { return left_; }

  template <typename T>
  absl::Status Get(const char* field, T* v) {
    static_assert(std::is_trivially_copyable_v<T>);
    CORTIQ_RETURN_IF_ERROR(Need(field, 1, sizeof(T)));
    std::memcpy(v, p_, sizeof(T));
    Advance(sizeof(T));
    return absl::OkStatus();
  }
  // count elements of elem_bytes each: a pointer to them (unaligned), after
  // checking they are all in the buffer.
  absl::StatusOr<const char*> Span(const char* field, uint64_t count, size_t elem_bytes) {
    CORTIQ_RETURN_IF_ERROR(Need(field, count, elem_bytes));
    const char* at = p_;
    Advance(count * elem_bytes);
    return at;
  }
  // count f32 into *out (allocated only once the bytes are known to be there).
  absl::Status Floats(const char* field, uint64_t count, std::vector<float>* out) {
    absl::StatusOr<const char*> at = Span(field, count, sizeof(float));
    if (!at.ok()) return at.status();
    out->resize(count);
    if (count > 0) std::memcpy(out->data(), *at, count * sizeof(float));
    return absl::OkStatus();
  }

 private:
  absl::Status Need(const char* field, uint64_t count, size_t elem_bytes) const {
    uint64_t bytes = 0;
    if (!Mul(count, elem_bytes, &bytes) || bytes > left_) {
      return Corrupt(
          absl::StrFormat("%s needs %d × %d bytes, %d left", field, count, elem_bytes, left_));
    }
    return absl::OkStatus();
  }
  void Advance(size_t n) {
    p_ += n;
    left_ -= n;
  }
  const char* p_;
  size_t left_;
};

// ---- sealed O(1) state -------------------------------------------------------

// One group's NystromState (see the banner for the field order). The
// state's own invariants (FromParts) guarantee the array sizes the reader
// derives from the scalars; a mismatch is an internal error, not a refusal.
absl::Status WriteGroup(Writer& w, const NystromState& st, size_t head_dim) {
  const NystromGroup& g = st.group();
  if (g.d != head_dim || g.dv != head_dim) {
    return absl::InternalError(absl::StrCat("ExportWire: a group state has d = ", g.d,
                                            ", dv = ", g.dv, " on a layer of head_dim ", head_dim));
  }
  const size_t cap = g.exact_only ? g.win_len : g.w;
  if (g.win_k.size() != cap * g.d || g.win_v.size() != cap * g.dv ||
      g.sink_k.size() != g.sink_len * g.d || g.sink_v.size() != g.sink_len * g.dv ||
      g.k_tilde.size() != g.m_eff * g.d) {
    return absl::InternalError("ExportWire: a group state's arrays disagree with its sizes");
  }
  w.Put<uint64_t>(g.m);
  w.Put<uint64_t>(g.w);
  w.Put<uint64_t>(g.sink);
  w.Put<uint64_t>(g.m_eff);
  w.Put<uint8_t>(g.exact_only ? 1 : 0);
  w.Put<float>(g.scale);
  w.Put<uint64_t>(g.win_len);
  w.Put<uint64_t>(g.win_head);
  w.Put<uint64_t>(g.sink_len);
  w.Floats(g.win_k);
  w.Floats(g.win_v);
  w.Floats(g.sink_k);
  w.Floats(g.sink_v);
  w.Floats(g.k_tilde);
  for (const NystromHead& h : st.heads()) {
    const size_t me = g.m_eff;
    if (h.t_hat.size() != me * g.dv || h.z_hat.size() != me || h.m_max.size() != me ||
        h.q_tilde.size() != me * g.d || h.mu.size() != me * me) {
      return absl::InternalError("ExportWire: a head state's arrays disagree with m_eff");
    }
    w.Put<uint8_t>(static_cast<uint8_t>(h.rect));
    w.Put<uint64_t>(h.far_len);
    w.Floats(h.t_hat);
    w.Floats(h.z_hat);
    w.Floats(h.m_max);
    w.Floats(h.q_tilde);
    w.Floats(h.mu);
  }
  return absl::OkStatus();
}

absl::StatusOr<NystromState> ReadGroup(Reader& r, size_t group, size_t q_heads, size_t head_dim,
                                       uint64_t seq_len) {
  const uint64_t D = head_dim;
  NystromGroup g;
  uint64_t m = 0, w = 0, sink = 0, m_eff = 0, win_len = 0, win_head = 0, sink_len = 0;
  uint8_t exact_only = 0;
  CORTIQ_RETURN_IF_ERROR(r.Get("m", &m));
  CORTIQ_RETURN_IF_ERROR(r.Get("w", &w));
  CORTIQ_RETURN_IF_ERROR(r.Get("sink", &sink));
  CORTIQ_RETURN_IF_ERROR(r.Get("m_eff", &m_eff));
  CORTIQ_RETURN_IF_ERROR(r.Get("exact_only", &exact_only));
  CORTIQ_RETURN_IF_ERROR(r.Get("scale", &g.scale));
  CORTIQ_RETURN_IF_ERROR(r.Get("win_len", &win_len));
  CORTIQ_RETURN_IF_ERROR(r.Get("win_head", &win_head));
  CORTIQ_RETURN_IF_ERROR(r.Get("sink_len", &sink_len));
  if (exact_only > 1) {
    return Corrupt(absl::StrCat("group ", group, ": exact_only byte ", exact_only));
  }
  // Each array's element count, overflow-checked; Reader checks the bytes.
  const uint64_t cap = exact_only ? win_len : w;
  uint64_t win_n = 0, sink_n = 0, kt_n = 0, mm_n = 0;
  if (!Mul(cap, D, &win_n) || !Mul(sink_len, D, &sink_n) || !Mul(m_eff, D, &kt_n) ||
      !Mul(m_eff, m_eff, &mm_n)) {
    return Corrupt(absl::StrCat("group ", group, ": array sizes overflow"));
  }
  g.m = m;
  g.w = w;
  g.sink = sink;
  g.m_eff = m_eff;
  g.exact_only = exact_only == 1;
  g.d = head_dim;
  g.dv = head_dim;
  g.win_len = win_len;
  g.win_head = win_head;
  g.sink_len = sink_len;
  CORTIQ_RETURN_IF_ERROR(r.Floats("win_k", win_n, &g.win_k));
  CORTIQ_RETURN_IF_ERROR(r.Floats("win_v", win_n, &g.win_v));
  CORTIQ_RETURN_IF_ERROR(r.Floats("sink_k", sink_n, &g.sink_k));
  CORTIQ_RETURN_IF_ERROR(r.Floats("sink_v", sink_n, &g.sink_v));
  CORTIQ_RETURN_IF_ERROR(r.Floats("k_tilde", kt_n, &g.k_tilde));
  std::vector<NystromHead> heads(q_heads);
  for (NystromHead& h : heads) {
    uint8_t rect = 0;
    CORTIQ_RETURN_IF_ERROR(r.Get("rect", &rect));
    if (rect != static_cast<uint8_t>(O1Rect::kAggregate) &&
        rect != static_cast<uint8_t>(O1Rect::kFm)) {
      return Corrupt(absl::StrCat("group ", group, ": rectifier byte ", rect));
    }
    h.rect = static_cast<O1Rect>(rect);
    uint64_t far_len = 0;
    CORTIQ_RETURN_IF_ERROR(r.Get("far_len", &far_len));
    // Bounded so sink + window + far (O1Install's check) cannot wrap around.
    if (far_len > seq_len) {
      return Corrupt(absl::StrCat("group ", group, ": far_len ", far_len, " > seq_len ", seq_len));
    }
    h.far_len = far_len;
    CORTIQ_RETURN_IF_ERROR(r.Floats("t_hat", kt_n, &h.t_hat));
    CORTIQ_RETURN_IF_ERROR(r.Floats("z_hat", m_eff, &h.z_hat));
    CORTIQ_RETURN_IF_ERROR(r.Floats("m_max", m_eff, &h.m_max));
    CORTIQ_RETURN_IF_ERROR(r.Floats("q_tilde", kt_n, &h.q_tilde));
    CORTIQ_RETURN_IF_ERROR(r.Floats("mu", mm_n, &h.mu));
  }
  absl::StatusOr<NystromState> st = NystromState::FromParts(std::move(g), std::move(heads));
  if (!st.ok()) return Corrupt(absl::StrCat("group ", group, ": ", st.status().message()));
  return st;
}

// The exact body's arrays in wire order (the banner's layout): per head its
// keys then its values, S rows each (int8: each followed by its scales).
// head(h) gives head h's S rows: a HeadRowsView (export) or a HeadRowsFill
// (import). fn(pointer, bytes on the wire, f16) once per array; an f16
// array's pointer is to f32 rows, two wire bytes per value.
template <typename HeadFn, typename Fn>
void ForEachBodyArray(size_t num_kv_heads, size_t S, bool int8, bool f16, HeadFn head, Fn fn) {
  for (size_t h = 0; h < num_kv_heads && S > 0; ++h) {
    const auto rows = head(h);
    if (int8) {
      fn(rows.keys_i8.data(), rows.keys_i8.size_bytes(), false);
      fn(rows.key_scales.data(), rows.key_scales.size_bytes(), false);
      fn(rows.values_i8.data(), rows.values_i8.size_bytes(), false);
      fn(rows.value_scales.data(), rows.value_scales.size_bytes(), false);
    } else {
      const size_t value_bytes = f16 ? sizeof(uint16_t) : sizeof(float);
      fn(rows.keys.data(), rows.keys.size() * value_bytes, f16);
      fn(rows.values.data(), rows.values.size() * value_bytes, f16);
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// Export.

namespace {

// With f16: the first finite value that would arrive as infinity.
absl::Status CheckF16Range(std::span<const float> src, absl::string_view what) {
  for (size_t i = 0; i < src.size(); ++i) {
    if (std::isfinite(src[i]) && std::fabs(src[i]) >= kF16Overflow) {
      return Refused(
          WireRefusal::kF16Range,
          absl::StrFormat("f16 was asked for, and %s holds %g at element %d, beyond f16's range "
                          "(max 65504); export f32",
                          what, src[i], i));
    }
  }
  return absl::OkStatus();
}

// Bytes [offset, offset + n) of f32 rows written as f16 (2 bytes per value),
// through a small buffer: neither end needs to fall on a value or be aligned.
void ReadF16(const float* src, uint64_t offset, char* dst, size_t n) {
  uint16_t buf[kF16Chunk];
  for (size_t done = 0; done < n;) {
    const uint64_t at = offset + done, first = at / 2;
    const size_t count = std::min<uint64_t>(kF16Chunk, (at + (n - done) + 1) / 2 - first);
    math::ConvertFromF32(src + first, math::DType::kF16, count, buf);
    const size_t skip = at % 2;
    const size_t len = std::min(count * sizeof(uint16_t) - skip, n - done);
    std::memcpy(dst + done, reinterpret_cast<const char*>(buf) + skip, len);
    done += len;
  }
}

}  // namespace

void LayerWireSource::Add(Piece p) {
  if (p.bytes == 0) return;
  size_ += p.bytes;
  pieces_.push_back(p);
}

absl::StatusOr<LayerWireSource> LayerWireSource::Make(const LayerKvCache& c,
                                                      const WireOptions& options) {
  const uint32_t version = options.version;
  if (version < kWireVersionMin || version > kWireVersionMax) {
    return absl::InvalidArgumentError(absl::StrCat("ExportWire: version ", version,
                                                   ": this build writes ", kWireVersionMin, "..",
                                                   kWireVersionMax));
  }
  // State no version describes.
  if (c.O1Collecting()) {
    return Refused(
        WireRefusal::kO1Collecting,
        "O(1) trace being collected: seal or release first (a query trace is not part of any "
        "wire version)");
  }
  if (c.HasImportance()) {
    return Refused(WireRefusal::kImportance,
                   absl::StrCat("the layer holds accumulated importance, which wire version ",
                                version, " does not describe"));
  }
  if (c.HasDeadHeads()) {
    return Refused(
        WireRefusal::kDeadHeads,
        absl::StrCat("dead heads (frozen columns): a head skipped positions, and wire version ",
                     version, " does not describe the per-position alive log"));
  }
  const bool int8 = c.mode() == KvMode::kInt8;
  const bool sealed = c.O1Sealed();
  if (version == 1 && int8) {
    return Refused(WireRefusal::kInt8Rows,
                   "int8 rows (version 1): version 1 carries f32 rows only; export version 2");
  }
  if (version == 1 && sealed) {
    return Refused(WireRefusal::kO1Overlay,
                   "O(1) overlay (version 1): version 1 carries exact rows only; export version 2");
  }
  if (c.num_kv_heads() > UINT32_MAX || c.head_dim() > UINT32_MAX) {
    return absl::InvalidArgumentError("ExportWire: num_kv_heads or head_dim exceeds u32");
  }
  // f16 applies to f32 rows only: int8 rows and O(1) state travel exact.
  const bool f16 = options.f16 && !int8 && !sealed;
  const uint32_t flags = (f16 ? kFlagF16 : 0) | (int8 ? kFlagInt8 : 0) | (sealed ? kFlagO1 : 0);
  const size_t H = c.num_kv_heads(), D = c.head_dim(), S = c.seq_len();

  // A sealed layer's state is small and scattered over many arrays: it is
  // serialised here, in two passes (size, then bytes) into one allocation.
  auto write_o1 = [&](Writer& w) -> absl::Status {
    w.Put<uint32_t>(static_cast<uint32_t>(c.O1NumHeads()));
    for (const NystromState& st : c.O1States()) CORTIQ_RETURN_IF_ERROR(WriteGroup(w, st, D));
    return absl::OkStatus();
  };
  uint64_t body_bytes = 0;
  if (sealed) {
    Writer counter(nullptr);
    CORTIQ_RETURN_IF_ERROR(write_o1(counter));
    body_bytes = counter.size();
  } else if (S > 0) {
    const size_t row = int8 ? D + sizeof(float) : (f16 ? D * sizeof(uint16_t) : D * sizeof(float));
    body_bytes = uint64_t{2} * H * S * row;
    for (size_t h = 0; h < H && f16; ++h) {
      const HeadRowsView rows = c.HeadRows(h);  // S rows: dead heads were refused
      CORTIQ_RETURN_IF_ERROR(CheckF16Range(rows.keys, absl::StrCat("the keys of KV head ", h)));
      CORTIQ_RETURN_IF_ERROR(CheckF16Range(rows.values, absl::StrCat("the values of KV head ", h)));
    }
  }

  LayerWireSource src;
  src.owned_.resize(kHeaderBytes + (sealed ? body_bytes : 0));
  Writer w(src.owned_.data());
  w.Bytes(kMagic, sizeof(kMagic));
  w.Put<uint32_t>(version);
  w.Put<uint32_t>(flags);
  w.Put<uint32_t>(static_cast<uint32_t>(H));
  w.Put<uint32_t>(static_cast<uint32_t>(D));
  w.Put<uint64_t>(S);
  w.Put<uint64_t>(c.capacity());
  w.Put<uint64_t>(body_bytes);
  if (sealed) {
    CORTIQ_RETURN_IF_ERROR(write_o1(w));
    if (w.size() != src.owned_.size()) {
      return absl::InternalError("ExportWire: the body changed size between passes");
    }
  }
  src.Add({.kind = Kind::kOwned, .bytes = src.owned_.size()});
  if (!sealed) {
    ForEachBodyArray(
        H, S, int8, f16, [&c](size_t h) { return c.HeadRows(h); },
        [&src](const auto* rows, uint64_t bytes, bool halves) {
          src.Add({.kind = halves ? Kind::kF16 : Kind::kRaw,
                   .bytes = bytes,
                   .src = reinterpret_cast<const char*>(rows)});
        });
  }
  if (src.size_ != kHeaderBytes + body_bytes) {
    return absl::InternalError("ExportWire: the body disagrees with its length");
  }
  src.Add({.kind = Kind::kCrc, .bytes = kCrcBytes});
  return src;
}

size_t LayerWireSource::Read(char* dst, size_t n) {
  size_t done = 0;
  while (done < n && piece_ < pieces_.size()) {
    const Piece& p = pieces_[piece_];
    const size_t len = static_cast<size_t>(std::min<uint64_t>(n - done, p.bytes - in_piece_));
    char* out = dst + done;
    switch (p.kind) {
      case Kind::kOwned:
        crc_ = util::Crc32cCopy(crc_, out, owned_.data() + p.offset + in_piece_, len);
        break;
      case Kind::kRaw:
        crc_ = util::Crc32cCopy(crc_, out, p.src + in_piece_, len);
        break;
      case Kind::kF16:
        ReadF16(reinterpret_cast<const float*>(p.src), in_piece_, out, len);
        crc_ = util::Crc32cExtend(crc_, out, len);
        break;
      case Kind::kCrc:
        if (in_piece_ == 0) std::memcpy(crc_le_, &crc_, sizeof(crc_));
        std::memcpy(out, crc_le_ + in_piece_, len);
        break;
    }
    done += len;
    pos_ += len;
    in_piece_ += len;
    if (in_piece_ == p.bytes) {
      ++piece_;
      in_piece_ = 0;
    }
  }
  return done;
}

absl::StatusOr<std::string> LayerKvCache::ExportWire(const WireOptions& options) const {
  CORTIQ_ASSIGN_OR_RETURN(LayerWireSource src, LayerWireSource::Make(*this, options));
  std::string out(src.size(), '\0');
  src.Read(out.data(), out.size());
  return out;
}

// ---------------------------------------------------------------------------
// Import.

LayerWireSink::LayerWireSink(size_t num_kv_heads, size_t head_dim, KvMode mode)
    : next_(num_kv_heads, head_dim, mode) {}

absl::StatusOr<LayerWireSink> LayerWireSink::Begin(std::string_view header, uint64_t blob_bytes,
                                                   size_t num_kv_heads, size_t head_dim,
                                                   KvMode mode, const WireImportExpect& expect,
                                                   LayerKvCache* reserved, const Admit& admit) {
  // ---- envelope: magic, version, length (the checksum comes last) ----
  if (blob_bytes < kHeaderBytes + kCrcBytes) {
    return Corrupt(absl::StrCat("truncated: ", blob_bytes, " bytes, a layer blob has at least ",
                                kHeaderBytes + kCrcBytes));
  }
  if (header.size() != kHeaderBytes) {
    return absl::InternalError("LayerWireSink::Begin: the header is not 44 bytes");
  }
  if (std::memcmp(header.data(), kMagic, sizeof(kMagic)) != 0) {
    return Corrupt("bad magic (not CQKV)");
  }
  Reader hdr(header.substr(sizeof(kMagic)));
  uint32_t version = 0, flags = 0, nkv = 0, hd = 0;
  uint64_t seq_len = 0, capacity = 0, body_bytes = 0;
  CORTIQ_RETURN_IF_ERROR(hdr.Get("version", &version));
  if (version < kWireVersionMin || version > kWireVersionMax) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CQKV version ", version, ": this build reads ", kWireVersionMin, "..", kWireVersionMax));
  }
  CORTIQ_RETURN_IF_ERROR(hdr.Get("flags", &flags));
  CORTIQ_RETURN_IF_ERROR(hdr.Get("num_kv_heads", &nkv));
  CORTIQ_RETURN_IF_ERROR(hdr.Get("head_dim", &hd));
  CORTIQ_RETURN_IF_ERROR(hdr.Get("seq_len", &seq_len));
  CORTIQ_RETURN_IF_ERROR(hdr.Get("capacity", &capacity));
  CORTIQ_RETURN_IF_ERROR(hdr.Get("body_bytes", &body_bytes));
  const uint64_t have_body = blob_bytes - kHeaderBytes - kCrcBytes;
  if (body_bytes != have_body) {
    return Corrupt(absl::StrCat("length mismatch: the header says ", body_bytes,
                                " body bytes, the buffer holds ", have_body,
                                body_bytes > have_body ? " (truncated)" : ""));
  }
  LayerWireSink sink(num_kv_heads, head_dim, mode);
  sink.crc_ = util::Crc32c(header);
  sink.left_ = body_bytes + kCrcBytes;
  sink.seq_len_ = seq_len;
  sink.q_heads_ = expect.num_q_heads;

  // ---- header fields: valid for the version, then against the caller ----
  // (checked now, reported by Finish after the checksum)
  const uint32_t allowed = version == 1 ? kFlagsV1 : kFlagsV2;
  const bool f16 = flags & kFlagF16, int8 = flags & kFlagInt8, sealed = flags & kFlagO1;
  const KvMode blob_mode = int8 ? KvMode::kInt8 : KvMode::kF32;
  absl::Status& st = sink.deferred_;
  if ((flags & ~allowed) != 0) {
    st = Corrupt(absl::StrFormat("flags %#x not defined in version %d", flags, version));
  } else if (f16 && (int8 || sealed)) {
    st = Corrupt("the f16 flag with int8 rows or O(1) state");
  } else if (int8 && sealed) {
    st = Corrupt("int8 rows on a sealed O(1) layer");
  } else if (nkv == 0 || hd == 0) {
    st = Corrupt("num_kv_heads or head_dim is 0");
  } else if (sealed ? capacity != 0 : capacity < seq_len) {
    st = Corrupt(absl::StrCat("capacity ", capacity, " with seq_len ", seq_len,
                              sealed ? " on a sealed layer" : ""));
  } else if (nkv != num_kv_heads) {
    st = Mismatch("num_kv_heads", nkv, num_kv_heads);
  } else if (hd != head_dim) {
    st = Mismatch("head_dim", hd, head_dim);
  } else if (blob_mode != mode) {
    st = absl::FailedPreconditionError(absl::StrCat("CQKV geometry mismatch: the blob has ",
                                                    KvModeName(blob_mode), " KV rows, this layer ",
                                                    KvModeName(mode)));
  } else if (seq_len > expect.max_positions) {
    st = absl::FailedPreconditionError(
        absl::StrCat("CQKV geometry mismatch: the blob holds seq_len ", seq_len,
                     " positions, this model's max_positions is ", expect.max_positions));
  } else if (sealed) {
    if (admit) {
      absl::Status admitted = admit(body_bytes);
      if (!admitted.ok()) return admitted;
    }
    sink.sealed_ = true;
    sink.kept_.reserve(body_bytes);
    sink.pieces_.push_back({.kind = Kind::kKeep, .bytes = body_bytes});
  } else {
    absl::Status admitted = sink.PlanBody(body_bytes, capacity, f16, int8, expect, reserved, admit);
    if (!admitted.ok()) return admitted;
  }
  if (!st.ok()) sink.pieces_.assign({{.kind = Kind::kSkip, .bytes = body_bytes}});
  return sink;
}

absl::Status LayerWireSink::PlanBody(uint64_t body_bytes, uint64_t capacity, bool f16, bool int8,
                                     const WireImportExpect& expect, LayerKvCache* reserved,
                                     const Admit& admit) {
  // The body is exactly H heads of S rows: check the length in full (and
  // every product for overflow) before reserving anything.
  KvRows& c = next_;
  const size_t H = c.num_kv_heads(), D = c.head_dim(), S = seq_len_;
  const size_t row_bytes = int8 ? D : (f16 ? D * sizeof(uint16_t) : D * sizeof(float));
  const size_t scale_bytes = int8 ? sizeof(float) : 0;
  uint64_t per_pos = 2 * (row_bytes + scale_bytes), per_head = 0, want_body = 0;
  if (!Mul(per_pos, S, &per_head) || !Mul(per_head, H, &want_body) || want_body != body_bytes) {
    deferred_ = Corrupt(absl::StrCat("body holds ", body_bytes, " bytes; ", H, " heads of ", S,
                                     " rows need ", per_head, " each"));
    return absl::OkStatus();
  }
  // The exporter's reservation (same capacity, same MemoryBytes), within
  // what this model accepts: the caller's, when it is exactly that.
  const size_t positions = std::min<uint64_t>(capacity, expect.max_positions);
  if (reserved != nullptr && positions > 0 && reserved->mode() == c.mode() &&
      reserved->num_kv_heads() == H && reserved->head_dim() == D && reserved->seq_len() == 0 &&
      reserved->capacity() == positions &&
      reserved->MemoryBytes() == KvRows::ProjectedBytes(H, D, c.mode(), positions)) {
    c = reserved->TakeRows();
  } else {
    if (admit) {
      absl::Status admitted = admit(KvRows::ProjectedBytes(H, D, c.mode(), positions));
      if (!admitted.ok()) return admitted;
    }
    c.Reserve(positions);
  }
  ForEachBodyArray(
      H, S, int8, f16, [&c, S](size_t h) { return c.Fill(h, S); },
      [this](auto* rows, uint64_t bytes, bool halves) {
        pieces_.push_back({.kind = halves ? Kind::kF16 : Kind::kRaw,
                           .bytes = bytes,
                           .dst = reinterpret_cast<char*>(rows)});
      });
  return absl::OkStatus();
}

void LayerWireSink::WriteF16(float* dst, uint64_t offset, std::string_view bytes) {
  size_t i = 0;
  if (offset % 2 == 1 && !bytes.empty()) {  // the value the last write split
    const uint16_t v = static_cast<uint16_t>(half_ | (static_cast<uint8_t>(bytes[0]) << 8));
    math::ConvertToF32(&v, math::DType::kF16, 1, dst + offset / 2);
    i = 1;
    ++offset;
  }
  uint16_t chunk[kF16Chunk];
  while (bytes.size() - i >= sizeof(uint16_t)) {
    const size_t count = std::min(kF16Chunk, (bytes.size() - i) / sizeof(uint16_t));
    std::memcpy(chunk, bytes.data() + i, count * sizeof(uint16_t));
    math::ConvertToF32(chunk, math::DType::kF16, count, dst + offset / 2);
    i += count * sizeof(uint16_t);
    offset += count * sizeof(uint16_t);
  }
  if (i < bytes.size()) half_ = static_cast<uint8_t>(bytes[i]);  // little-endian: the low byte
}

void LayerWireSink::Write(std::string_view bytes) {
  size_t i = 0;
  while (i < bytes.size() && piece_ < pieces_.size()) {
    const Piece& p = pieces_[piece_];
    const size_t len =
        static_cast<size_t>(std::min<uint64_t>(bytes.size() - i, p.bytes - in_piece_));
    const std::string_view in = bytes.substr(i, len);
    switch (p.kind) {
      case Kind::kRaw:
        crc_ = util::Crc32cCopy(crc_, p.dst + in_piece_, in.data(), len);
        break;
      case Kind::kF16:
        crc_ = util::Crc32cExtend(crc_, in.data(), len);
        WriteF16(reinterpret_cast<float*>(p.dst), in_piece_, in);
        break;
      case Kind::kKeep:
        crc_ = util::Crc32cExtend(crc_, in.data(), len);
        kept_.append(in);
        break;
      case Kind::kSkip:
        crc_ = util::Crc32cExtend(crc_, in.data(), len);
        break;
    }
    i += len;
    left_ -= len;
    in_piece_ += len;
    if (in_piece_ == p.bytes) {
      ++piece_;
      in_piece_ = 0;
    }
  }
  for (; i < bytes.size() && crc_got_ < kCrcBytes; ++i, --left_) crc_le_[crc_got_++] = bytes[i];
}

uint32_t LayerWireSink::stored_crc() const {
  uint32_t crc = 0;
  std::memcpy(&crc, crc_le_, sizeof(crc));
  return crc;
}

absl::StatusOr<LayerKvCache> LayerWireSink::Finish() {
  if (left_ != 0) return absl::InternalError("LayerWireSink::Finish before the last byte");
  if (stored_crc() != crc_) {
    return Corrupt(
        absl::StrFormat("checksum mismatch (stored %08x, computed %08x)", stored_crc(), crc_));
  }
  if (!deferred_.ok()) return deferred_;
  const size_t H = next_.num_kv_heads(), D = next_.head_dim(), S = seq_len_;
  if (sealed_) {
    Reader r(kept_);
    uint32_t q_heads = 0;
    CORTIQ_RETURN_IF_ERROR(r.Get("num_q_heads", &q_heads));
    if (q_heads == 0 || q_heads % H != 0) {
      return Corrupt(absl::StrCat("num_q_heads ", q_heads, " is not a multiple of ", H));
    }
    if (q_heads != q_heads_) return Mismatch("num_q_heads", q_heads, q_heads_);
    std::vector<NystromState> states;
    states.reserve(H);
    for (size_t g = 0; g < H; ++g) {
      absl::StatusOr<NystromState> st = ReadGroup(r, g, q_heads / H, D, S);
      if (!st.ok()) return st.status();
      states.push_back(*std::move(st));
    }
    if (r.left() != 0) return Corrupt(absl::StrCat(r.left(), " trailing body bytes"));
    LayerKvCache sealed(std::move(next_));  // no rows: nothing was reserved
    const absl::Status s = sealed.O1Install(std::move(states), S);
    if (!s.ok()) return Corrupt(s.message());
    return sealed;
  }
  next_.SetDenseRows(S);
  LayerKvCache cache(std::move(next_));
  // Rows a model could have written are finite: a NaN or infinity (forged,
  // or an f16 overflow on the way) would poison every later step.
  for (size_t h = 0; h < H; ++h) {
    struct Part {
      const char* what;
      std::span<const float> values;
    };
    const Part parts[] = {{"key", cache.HeadKeys(h)},
                          {"value", cache.HeadValues(h)},
                          {"key scale", cache.HeadKeyScales(h)},
                          {"value scale", cache.HeadValueScales(h)}};
    for (const Part& p : parts) {
      const size_t i = FirstNonFinite(p.values);
      if (i == p.values.size()) continue;
      const size_t per_row = p.values.size() / std::max<size_t>(cache.HeadLen(h), 1);
      return Corrupt(absl::StrCat("non-finite ", p.what, " in head ", h, " at row ",
                                  i / std::max<size_t>(per_row, 1)));
    }
  }
  return cache;
}

absl::Status LayerKvCache::ImportWire(std::string_view buf, const WireImportExpect& expect) {
  absl::StatusOr<LayerWireSink> sink =
      LayerWireSink::Begin(buf.substr(0, std::min(buf.size(), kHeaderBytes)), buf.size(),
                           num_kv_heads(), head_dim(), mode(), expect);
  if (!sink.ok()) return sink.status();
  sink->Write(buf.substr(kHeaderBytes));
  absl::StatusOr<LayerKvCache> next = sink->Finish();
  if (!next.ok()) return next.status();
  *this = *std::move(next);
  return absl::OkStatus();
}

}  // namespace cortiq::kv
