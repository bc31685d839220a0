// CRC-32C (see crc32c.h). Slicing-by-8 tables built at compile time; the
// SSE4.2 path is one function compiled for that ISA (target attribute) and
// chosen once from CPUID, so the binary still runs on any x86-64 (and builds
// elsewhere with the table only).
//
// crc32 has a latency of 3 cycles and a throughput of 1, so one dependent
// chain runs at a third of the instruction's speed. Long inputs are cut into
// stripes of three lanes checksummed side by side and joined with the shift
// operator: the register after lane A, moved over |B| + |C| zero bytes, XOR
// the register of B (from 0) moved over |C|, XOR the register of C (from 0).
// Moving a register over n zero bytes multiplies it by x^(8n) modulo the
// polynomial; for the fixed lane length that product is four table lookups.
#include "core/util/crc32c.h"

#include <algorithm>
#include <array>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define CORTIQ_CRC32C_HAVE_SSE42 1
#else
#define CORTIQ_CRC32C_HAVE_SSE42 0
#endif

namespace cortiq::util {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

// kTables[0] is the classic byte table; kTables[k][b] is the CRC of byte b
// followed by k zero bytes, so eight bytes fold in with eight lookups.
constexpr std::array<std::array<uint32_t, 256>, 8> MakeTables() {
  std::array<std::array<uint32_t, 256>, 8> t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int i = 0; i < 8; ++i) c = (c >> 1) ^ ((c & 1u) ? kPoly : 0u);
    t[0][b] = c;
  }
  for (size_t k = 1; k < 8; ++k) {
    for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
  }
  return t;
}
constexpr auto kTables = MakeTables();
static_assert(kTables[0][1] == 0xF26B8303u);  // spot check of the byte table

// ---- GF(2) arithmetic modulo the polynomial, reflected (bit 31 is x^0) ----

// a(x) · b(x) mod P(x).
constexpr uint32_t MultModP(uint32_t a, uint32_t b) {
  uint32_t p = 0;
  for (uint32_t m = 1u << 31; m != 0 && a != 0; m >>= 1) {
    if (a & m) {
      p ^= b;
      a ^= m;
    }
    b = (b & 1u) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

// kX2n[k] = x^(2^k) mod P, k = 0..63 (lengths in bits up to 2^64).
constexpr std::array<uint32_t, 64> MakeX2n() {
  std::array<uint32_t, 64> t{};
  t[0] = 1u << 30;  // x^1
  for (size_t k = 1; k < t.size(); ++k) t[k] = MultModP(t[k - 1], t[k - 1]);
  return t;
}
constexpr auto kX2n = MakeX2n();

// x^(8n) mod P: the operator that moves a CRC register over n zero bytes.
constexpr uint32_t X8nModP(uint64_t n) {
  uint32_t p = 1u << 31;  // x^0
  for (size_t k = 3; n != 0; n >>= 1, ++k) {
    if (n & 1u) p = MultModP(kX2n[k], p);
  }
  return p;
}

// MultModP(x^(8n), c) as four byte-table lookups (the product is linear in c).
using ShiftTable = std::array<std::array<uint32_t, 256>, 4>;
constexpr ShiftTable MakeShiftTable(uint64_t n) {
  ShiftTable t{};
  const uint32_t k = X8nModP(n);
  for (uint32_t i = 0; i < 4; ++i) {
    for (uint32_t b = 0; b < 256; ++b) t[i][b] = MultModP(k, b << (8 * i));
  }
  return t;
}
uint32_t Shift(const ShiftTable& t, uint32_t c) {
  return t[0][c & 0xFFu] ^ t[1][(c >> 8) & 0xFFu] ^ t[2][(c >> 16) & 0xFFu] ^ t[3][c >> 24];
}

// Three lanes of kLane bytes per stripe (kLane a multiple of 8).
constexpr size_t kLane = 4096;
constexpr ShiftTable kShiftLane = MakeShiftTable(kLane);
constexpr ShiftTable kShift2Lanes = MakeShiftTable(2 * kLane);

uint64_t LoadLe64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the slicing step assumes LE loads");
  return v;
}

#if CORTIQ_CRC32C_HAVE_SSE42
__attribute__((target("sse4.2"))) uint32_t ExtendSse42Impl(uint32_t crc, const uint8_t* p,
                                                           size_t n) {
  uint64_t c = ~crc;
  for (; n > 0 && (reinterpret_cast<uintptr_t>(p) & 7u) != 0; --n) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
  }
  for (; n >= 3 * kLane; n -= 3 * kLane, p += 3 * kLane) {
    uint64_t a = c, b = 0, d = 0;
    for (size_t i = 0; i < kLane; i += 8) {
      a = _mm_crc32_u64(a, LoadLe64(p + i));
      b = _mm_crc32_u64(b, LoadLe64(p + kLane + i));
      d = _mm_crc32_u64(d, LoadLe64(p + 2 * kLane + i));
    }
    c = Shift(kShift2Lanes, static_cast<uint32_t>(a)) ^
        Shift(kShiftLane, static_cast<uint32_t>(b)) ^ static_cast<uint32_t>(d);
  }
  for (; n >= 8; n -= 8, p += 8) c = _mm_crc32_u64(c, LoadLe64(p));
  for (; n > 0; --n) c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
  return ~static_cast<uint32_t>(c);
}
#endif

bool DetectSse42() {
#if CORTIQ_CRC32C_HAVE_SSE42
  return __builtin_cpu_supports("sse4.2");
#else
  return false;
#endif
}

}  // namespace

namespace internal {

uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  for (; n > 0 && (reinterpret_cast<uintptr_t>(p) & 7u) != 0; --n) {
    c = (c >> 8) ^ kTables[0][(c ^ *p++) & 0xFFu];
  }
  for (; n >= 8; n -= 8, p += 8) {
    const uint64_t v = LoadLe64(p) ^ c;
    c = kTables[7][v & 0xFF] ^ kTables[6][(v >> 8) & 0xFF] ^ kTables[5][(v >> 16) & 0xFF] ^
        kTables[4][(v >> 24) & 0xFF] ^ kTables[3][(v >> 32) & 0xFF] ^ kTables[2][(v >> 40) & 0xFF] ^
        kTables[1][(v >> 48) & 0xFF] ^ kTables[0][v >> 56];
  }
  for (; n > 0; --n) c = (c >> 8) ^ kTables[0][(c ^ *p++) & 0xFFu];
  return ~c;
}

uint32_t Crc32cExtendSse42(uint32_t crc, const void* data, size_t n) {
#if CORTIQ_CRC32C_HAVE_SSE42
  return ExtendSse42Impl(crc, static_cast<const uint8_t*>(data), n);
#else
  return Crc32cExtendPortable(crc, data, n);
#endif
}

bool Crc32cHasSse42() {
  static const bool has = DetectSse42();
  return has;
}

}  // namespace internal

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n) {
  if (n == 0) return crc;
  return internal::Crc32cHasSse42() ? internal::Crc32cExtendSse42(crc, data, n)
                                    : internal::Crc32cExtendPortable(crc, data, n);
}

uint32_t Crc32c(const void* data, size_t n) { return Crc32cExtend(0, data, n); }

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  return MultModP(X8nModP(len_b), crc_a) ^ crc_b;
}

uint32_t Crc32cCopy(uint32_t crc, void* dst, const void* src, size_t n) {
  // 16 KiB blocks: the copy is checksummed from L1 (48 KiB on current x86).
  constexpr size_t kBlock = 16 << 10;
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  for (size_t i = 0; i < n; i += kBlock) {
    const size_t len = std::min(kBlock, n - i);
    std::memcpy(d + i, s + i, len);
    crc = Crc32cExtend(crc, d + i, len);
  }
  return crc;
}

}  // namespace cortiq::util
