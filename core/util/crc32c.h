// CRC-32C (Castagnoli): the checksum of the wire formats (docs/WIRE_FORMAT.md).
//
// Reflected polynomial 0x82F63B78, initial value and final XOR 0xFFFFFFFF —
// the CRC of iSCSI (RFC 3720), ext4, LevelDB and SSE4.2's crc32 instruction.
// Crc32c("123456789") == 0xE3069283.
//
// Cost: SSE4.2 crc32 where the CPU has it (chosen once at run time from
// CPUID): three independent 8-byte streams over 12 KiB stripes, about 8 bytes
// per cycle; otherwise a slicing-by-8 table (8 bytes per step). The two give
// identical results. Allocates nothing; thread-safe.
//
// Example (a checksum over two pieces equals the checksum of their concatenation):
//   uint32_t crc = util::Crc32c(header.data(), header.size());
//   crc = util::Crc32cExtend(crc, body.data(), body.size());
//   // the same, from the two pieces' own checksums (O(log n), no data pass):
//   crc = util::Crc32cCombine(util::Crc32c(header), util::Crc32c(body), body.size());
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace cortiq::util {

// CRC-32C of data[0, n). n == 0 gives 0.
uint32_t Crc32c(const void* data, size_t n);
inline uint32_t Crc32c(std::string_view data) { return Crc32c(data.data(), data.size()); }
// CRC-32C of (the bytes that gave crc) followed by data[0, n).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);
// CRC-32C of A followed by B, from crc_a = Crc32c(A), crc_b = Crc32c(B) and
// len_b = |B|: O(log len_b) arithmetic, no pass over the data.
uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);
// Copies src[0, n) to dst (non-overlapping) and returns Crc32cExtend(crc,
// src, n), in one pass: each block is checksummed while the copy is still in
// the L1 cache, so the source is read from memory once.
uint32_t Crc32cCopy(uint32_t crc, void* dst, const void* src, size_t n);

namespace internal {
// The two implementations, exposed so tests can compare them. Same contract
// as Crc32cExtend; the SSE4.2 one may only be called when Crc32cHasSse42().
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n);
uint32_t Crc32cExtendSse42(uint32_t crc, const void* data, size_t n);
bool Crc32cHasSse42();
}  // namespace internal

}  // namespace cortiq::util
