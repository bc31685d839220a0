// CRC-32C (Castagnoli): the checksum of the wire formats (docs/WIRE_FORMAT.md).
//
// Reflected polynomial 0x82F63B78, initial value and final XOR 0xFFFFFFFF —
// the CRC of iSCSI (RFC 3720), ext4, LevelDB and SSE4.2's crc32 instruction.
// Crc32c("123456789") == 0xE3069283.
//
// Cost: SSE4.2 crc32 (8 bytes per instruction, chosen once at run time from
// CPUID) where the CPU has it, otherwise a slicing-by-8 table (8 bytes per
// step); the two give identical results. Allocates nothing; thread-safe.
//
// Example (a checksum over two pieces equals the checksum of their concatenation):
//   uint32_t crc = util::Crc32c(header.data(), header.size());
//   crc = util::Crc32cExtend(crc, body.data(), body.size());
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

namespace internal {
// The two implementations, exposed so tests can compare them. Same contract
// as Crc32cExtend; the SSE4.2 one may only be called when Crc32cHasSse42().
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n);
uint32_t Crc32cExtendSse42(uint32_t crc, const void* data, size_t n);
bool Crc32cHasSse42();
}  // namespace internal

}  // namespace cortiq::util
