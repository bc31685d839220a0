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
#include "core/kv/layer_kv_cache.h"
#include "core/kv/nystrom.h"
#include "core/math/kernels.h"
#include "core/util/crc32c.h"
#include "core/util/status_macros.h"

namespace cortiq::kv {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the CQKV blob is little-endian and written with memcpy");

constexpr char kMagic[4] = {'C', 'Q', 'K', 'V'};
constexpr size_t kHeaderBytes = 44;
constexpr size_t kCrcBytes = 4;
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

absl::Status Refused(absl::string_view why) {
  return absl::FailedPreconditionError(absl::StrCat("ExportWire refused: ", why));
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
// only counts (the first pass sizes the blob so it is allocated once).
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
  // f32 → f16 (round to nearest even). FailedPrecondition, naming `what`,
  // for a finite value that would become infinity.
  absl::Status F16s(const float* src, size_t n, absl::string_view what) {
    if (out_ != nullptr) {
      for (size_t i = 0; i < n; ++i) {
        if (std::isfinite(src[i]) && std::fabs(src[i]) >= kF16Overflow) {
          return Refused(absl::StrFormat(
              "f16 was asked for, and %s holds %g at element %d, beyond f16's range "
              "(max 65504); export f32",
              what, src[i], i));
        }
      }
      uint16_t buf[kF16Chunk];
      for (size_t i = 0; i < n; i += kF16Chunk) {
        const size_t len = std::min(kF16Chunk, n - i);
        math::ConvertFromF32(src + i, math::DType::kF16, len, buf);
        std::memcpy(out_ + n_ + i * sizeof(uint16_t), buf, len * sizeof(uint16_t));
      }
    }
    n_ += n * sizeof(uint16_t);
    return absl::OkStatus();
  }

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

}  // namespace

// ---------------------------------------------------------------------------
// Export.

absl::StatusOr<std::string> LayerKvCache::ExportWire(const WireOptions& options) const {
  const uint32_t version = options.version;
  if (version < kWireVersionMin || version > kWireVersionMax) {
    return absl::InvalidArgumentError(absl::StrCat("ExportWire: version ", version,
                                                   ": this build writes ", kWireVersionMin, "..",
                                                   kWireVersionMax));
  }
  // State no version describes.
  if (O1Collecting()) {
    return Refused(
        "O(1) trace being collected: seal or release first (a query trace is not part of any "
        "wire version)");
  }
  if (HasImportance()) {
    return Refused(absl::StrCat("the layer holds accumulated importance, which wire version ",
                                version, " does not describe"));
  }
  if (HasDeadHeads()) {
    return Refused(
        absl::StrCat("dead heads (frozen columns): a head skipped positions, and wire version ",
                     version, " does not describe the per-position alive log"));
  }
  const bool int8 = mode_ == KvMode::kInt8;
  const bool sealed = O1Sealed();
  if (version == 1 && int8) {
    return Refused("int8 rows (version 1): version 1 carries f32 rows only; export version 2");
  }
  if (version == 1 && sealed) {
    return Refused("O(1) overlay (version 1): version 1 carries exact rows only; export version 2");
  }
  if (num_kv_heads_ > UINT32_MAX || head_dim_ > UINT32_MAX) {
    return absl::InvalidArgumentError("ExportWire: num_kv_heads or head_dim exceeds u32");
  }
  // f16 applies to f32 rows only: int8 rows and O(1) state travel exact.
  const bool f16 = options.f16 && !int8 && !sealed;
  const uint32_t flags = (f16 ? kFlagF16 : 0) | (int8 ? kFlagInt8 : 0) | (sealed ? kFlagO1 : 0);

  const size_t H = num_kv_heads_, D = head_dim_, S = seq_len_;
  auto write_body = [&](Writer& w) -> absl::Status {
    if (sealed) {
      w.Put<uint32_t>(static_cast<uint32_t>(o1_->num_heads));
      for (const NystromState& st : o1_->states) CORTIQ_RETURN_IF_ERROR(WriteGroup(w, st, D));
      return absl::OkStatus();
    }
    for (size_t h = 0; h < H && S > 0; ++h) {
      if (int8) {
        w.Bytes(k_i8_.data() + RowBase(h), S * D);
        w.Bytes(k_scale_.data() + ScaleBase(h), S * sizeof(float));
        w.Bytes(v_i8_.data() + RowBase(h), S * D);
        w.Bytes(v_scale_.data() + ScaleBase(h), S * sizeof(float));
      } else if (f16) {
        const float* k = k_f32_.data() + RowBase(h);
        const float* v = v_f32_.data() + RowBase(h);
        CORTIQ_RETURN_IF_ERROR(w.F16s(k, S * D, absl::StrCat("the keys of KV head ", h)));
        CORTIQ_RETURN_IF_ERROR(w.F16s(v, S * D, absl::StrCat("the values of KV head ", h)));
      } else {
        w.Bytes(k_f32_.data() + RowBase(h), S * D * sizeof(float));
        w.Bytes(v_f32_.data() + RowBase(h), S * D * sizeof(float));
      }
    }
    return absl::OkStatus();
  };

  Writer counter(nullptr);
  CORTIQ_RETURN_IF_ERROR(write_body(counter));
  const uint64_t body_bytes = counter.size();

  std::string out(kHeaderBytes + body_bytes + kCrcBytes, '\0');
  Writer w(out.data());
  w.Bytes(kMagic, sizeof(kMagic));
  w.Put<uint32_t>(version);
  w.Put<uint32_t>(flags);
  w.Put<uint32_t>(static_cast<uint32_t>(H));
  w.Put<uint32_t>(static_cast<uint32_t>(D));
  w.Put<uint64_t>(S);
  w.Put<uint64_t>(capacity_);
  w.Put<uint64_t>(body_bytes);
  CORTIQ_RETURN_IF_ERROR(write_body(w));
  if (w.size() != kHeaderBytes + body_bytes) {
    return absl::InternalError("ExportWire: the body changed size between passes");
  }
  w.Put<uint32_t>(util::Crc32c(out.data(), kHeaderBytes + body_bytes));
  return out;
}

// ---------------------------------------------------------------------------
// Import.

absl::Status LayerKvCache::ImportWire(std::string_view buf, const WireImportExpect& expect) {
  // ---- envelope: magic, version, length, checksum ----
  if (buf.size() < kHeaderBytes + kCrcBytes) {
    return Corrupt(absl::StrCat("truncated: ", buf.size(), " bytes, a layer blob has at least ",
                                kHeaderBytes + kCrcBytes));
  }
  if (std::memcmp(buf.data(), kMagic, sizeof(kMagic)) != 0) return Corrupt("bad magic (not CQKV)");
  Reader hdr(buf.substr(sizeof(kMagic), kHeaderBytes - sizeof(kMagic)));
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
  const size_t have_body = buf.size() - kHeaderBytes - kCrcBytes;
  if (body_bytes != have_body) {
    return Corrupt(absl::StrCat("length mismatch: the header says ", body_bytes,
                                " body bytes, the buffer holds ", have_body,
                                body_bytes > have_body ? " (truncated)" : ""));
  }
  uint32_t crc = 0;
  std::memcpy(&crc, buf.data() + kHeaderBytes + body_bytes, sizeof(crc));
  const uint32_t want = util::Crc32c(buf.data(), kHeaderBytes + body_bytes);
  if (crc != want) {
    return Corrupt(absl::StrFormat("checksum mismatch (stored %08x, computed %08x)", crc, want));
  }

  // ---- header fields: valid for the version, then against the caller ----
  const uint32_t allowed = version == 1 ? kFlagsV1 : kFlagsV2;
  if ((flags & ~allowed) != 0) {
    return Corrupt(absl::StrFormat("flags %#x not defined in version %d", flags, version));
  }
  const bool f16 = flags & kFlagF16, int8 = flags & kFlagInt8, sealed = flags & kFlagO1;
  if (f16 && (int8 || sealed)) return Corrupt("the f16 flag with int8 rows or O(1) state");
  if (int8 && sealed) return Corrupt("int8 rows on a sealed O(1) layer");
  if (nkv == 0 || hd == 0) return Corrupt("num_kv_heads or head_dim is 0");
  if (sealed ? capacity != 0 : capacity < seq_len) {
    return Corrupt(absl::StrCat("capacity ", capacity, " with seq_len ", seq_len,
                                sealed ? " on a sealed layer" : ""));
  }
  const KvMode mode = int8 ? KvMode::kInt8 : KvMode::kF32;
  if (nkv != num_kv_heads_) return Mismatch("num_kv_heads", nkv, num_kv_heads_);
  if (hd != head_dim_) return Mismatch("head_dim", hd, head_dim_);
  if (mode != mode_) {
    return absl::FailedPreconditionError(absl::StrCat("CQKV geometry mismatch: the blob has ",
                                                      KvModeName(mode), " KV rows, this layer ",
                                                      KvModeName(mode_)));
  }
  if (seq_len > expect.max_positions) {
    return absl::FailedPreconditionError(
        absl::StrCat("CQKV geometry mismatch: the blob holds seq_len ", seq_len,
                     " positions, this model's max_positions is ", expect.max_positions));
  }

  // ---- body, built aside ----
  const size_t H = num_kv_heads_, D = head_dim_, S = seq_len;
  Reader r(buf.substr(kHeaderBytes, body_bytes));
  LayerKvCache next(H, D, mode_);
  if (sealed) {
    uint32_t q_heads = 0;
    CORTIQ_RETURN_IF_ERROR(r.Get("num_q_heads", &q_heads));
    if (q_heads == 0 || q_heads % H != 0) {
      return Corrupt(absl::StrCat("num_q_heads ", q_heads, " is not a multiple of ", H));
    }
    if (q_heads != expect.num_q_heads) {
      return Mismatch("num_q_heads", q_heads, expect.num_q_heads);
    }
    std::vector<NystromState> states;
    states.reserve(H);
    for (size_t g = 0; g < H; ++g) {
      absl::StatusOr<NystromState> st = ReadGroup(r, g, q_heads / H, D, S);
      if (!st.ok()) return st.status();
      states.push_back(*std::move(st));
    }
    if (r.left() != 0) return Corrupt(absl::StrCat(r.left(), " trailing body bytes"));
    const absl::Status s = next.O1Install(std::move(states), S);
    if (!s.ok()) return Corrupt(s.message());
  } else {
    // The body is exactly H heads of S rows: check the length in full (and
    // every product for overflow) before reserving anything.
    const size_t row_bytes = int8 ? D : (f16 ? D * sizeof(uint16_t) : D * sizeof(float));
    const size_t scale_bytes = int8 ? sizeof(float) : 0;
    uint64_t per_pos = 2 * (row_bytes + scale_bytes), per_head = 0, want_body = 0;
    if (!Mul(per_pos, S, &per_head) || !Mul(per_head, H, &want_body) || want_body != body_bytes) {
      return Corrupt(absl::StrCat("body holds ", body_bytes, " bytes; ", H, " heads of ", S,
                                  " rows need ", per_head, " each"));
    }
    // The exporter's reservation (same capacity, same MemoryBytes), within
    // what this model accepts.
    next.Reserve(std::min<uint64_t>(capacity, expect.max_positions));
    for (size_t h = 0; h < H && S > 0; ++h) {
      auto raw = [&](const char* field, size_t bytes, void* dst) -> absl::Status {
        absl::StatusOr<const char*> at = r.Span(field, bytes, 1);
        if (!at.ok()) return at.status();
        std::memcpy(dst, *at, bytes);
        return absl::OkStatus();
      };
      auto halves = [&](const char* field, float* dst) -> absl::Status {
        absl::StatusOr<const char*> at = r.Span(field, S * D, sizeof(uint16_t));
        if (!at.ok()) return at.status();
        uint16_t chunk[kF16Chunk];
        for (size_t i = 0; i < S * D; i += kF16Chunk) {
          const size_t len = std::min(kF16Chunk, S * D - i);
          std::memcpy(chunk, *at + i * sizeof(uint16_t), len * sizeof(uint16_t));
          math::ConvertToF32(chunk, math::DType::kF16, len, dst + i);
        }
        return absl::OkStatus();
      };
      if (int8) {
        CORTIQ_RETURN_IF_ERROR(raw("k rows", S * D, next.k_i8_.data() + next.RowBase(h)));
        CORTIQ_RETURN_IF_ERROR(
            raw("k scales", S * sizeof(float), next.k_scale_.data() + next.ScaleBase(h)));
        CORTIQ_RETURN_IF_ERROR(raw("v rows", S * D, next.v_i8_.data() + next.RowBase(h)));
        CORTIQ_RETURN_IF_ERROR(
            raw("v scales", S * sizeof(float), next.v_scale_.data() + next.ScaleBase(h)));
      } else if (f16) {
        CORTIQ_RETURN_IF_ERROR(halves("k rows", next.k_f32_.data() + next.RowBase(h)));
        CORTIQ_RETURN_IF_ERROR(halves("v rows", next.v_f32_.data() + next.RowBase(h)));
      } else {
        CORTIQ_RETURN_IF_ERROR(
            raw("k rows", S * D * sizeof(float), next.k_f32_.data() + next.RowBase(h)));
        CORTIQ_RETURN_IF_ERROR(
            raw("v rows", S * D * sizeof(float), next.v_f32_.data() + next.RowBase(h)));
      }
      next.head_len_[h] = S;
    }
    next.seq_len_ = S;
  }
  *this = std::move(next);
  return absl::OkStatus();
}

}  // namespace cortiq::kv
