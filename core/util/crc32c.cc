// CRC-32C (see crc32c.h). Slicing-by-8 tables built at compile time; the
// SSE4.2 path is one function compiled for that ISA (target attribute) and
// chosen once from CPUID, so the binary still runs on any x86-64 (and builds
// elsewhere with the table only).
#include "core/util/crc32c.h"

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

}  // namespace cortiq::util
