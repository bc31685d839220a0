// Shared by the wire-import fuzz target (tests/fuzz/wire_import_fuzz.cc), its
// corpus generator (make_corpus.cc) and the corpus regression test
// (tests/session/wire_corpus_test.cc): the constants the seed corpus was
// written with, and the checksum fix-up that lets a fuzzer reach past the
// CRC32C checks.
//
// Why a fix-up: every CQSW section and every CQKV blob carries a CRC32C, so
// almost every mutation a fuzzer makes is refused at the first checksum and
// the parsers behind it are never reached. Each input therefore runs twice:
// as is (the envelope checks) and with every length-derived field and
// checksum recomputed (everything behind them). The parsers themselves are
// untouched: no fuzzing-only branch in production code.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "core/util/crc32c.h"

namespace cortiq::fuzz {

// The model fingerprint every seed stream carries (any constant works: the
// importer compares it with the caller's, it is not derived from the weights).
inline constexpr uint64_t kWireFuzzFingerprint = 0x1234abcd5678ef01ull;
// The "tiny" random checkpoint's shape and seed (model::NamedShape("tiny"),
// RandomCheckpointOptions{} = f32, seed 1): 2 layers, 4 q / 2 kv heads,
// head_dim 16, vocab 259, max_position_embeddings 4096.
inline constexpr const char* kWireFuzzShape = "tiny";
// The standalone CQKV targets: LayerKvCache(2 kv heads, 16 head_dim) in f32
// and int8, imported with WireImportExpect{4 q heads, 4096 positions}.
inline constexpr size_t kFuzzKvHeads = 2;
inline constexpr size_t kFuzzHeadDim = 16;
inline constexpr size_t kFuzzQHeads = 4;
inline constexpr size_t kFuzzMaxPositions = 4096;

namespace internal {

inline uint32_t LoadU32(const std::string& s, size_t at) {
  uint32_t v;
  std::memcpy(&v, s.data() + at, 4);
  return v;
}
inline uint64_t LoadU64(const std::string& s, size_t at) {
  uint64_t v;
  std::memcpy(&v, s.data() + at, 8);
  return v;
}
inline void StoreU32(std::string& s, size_t at, uint32_t v) { std::memcpy(s.data() + at, &v, 4); }
inline void StoreU64(std::string& s, size_t at, uint64_t v) { std::memcpy(s.data() + at, &v, 8); }

// CQKV blob at [at, at + len) of `s`: body_bytes := len − 48, then the CRC
// of [0, 44 + B). Too short or not CQKV: left alone.
inline void FixLayerBlob(std::string& s, size_t at, size_t len) {
  if (len < 48 || std::memcmp(s.data() + at, "CQKV", 4) != 0) return;
  StoreU64(s, at + 36, len - 48);
  StoreU32(s, at + len - 4, util::Crc32c(std::string_view(s).substr(at, len - 4)));
}

}  // namespace internal

// `wire` with every checksum (and the lengths and counts the checksums
// protect) recomputed as an exporter would have written them: a CQKV blob's
// body_bytes and CRC; a CQSW stream's layer blobs, section CRCs and end
// section (offset, count, header CRC). Section lengths are NOT changed: a
// section whose length runs past the end stops the walk, and the rest is
// left as it was. Anything else comes back unchanged. O(wire.size()).
inline std::string FixWireChecksums(std::string_view wire) {
  using internal::LoadU32;
  using internal::LoadU64;
  using internal::StoreU32;
  using internal::StoreU64;
  std::string s(wire);
  if (s.size() >= 4 && std::memcmp(s.data(), "CQKV", 4) == 0) {
    internal::FixLayerBlob(s, 0, s.size());
    return s;
  }
  if (s.size() < 24 || std::memcmp(s.data(), "CQSW", 4) != 0) return s;
  size_t pos = 24;
  uint32_t count = 0;
  while (s.size() - pos >= 20) {  // type, reserved, length, crc
    const uint32_t type = LoadU32(s, pos);
    const uint64_t len = LoadU64(s, pos + 8);
    if (len > s.size() - pos - 20) break;
    const size_t payload = pos + 16;
    if (type == 4 && len >= 4) internal::FixLayerBlob(s, payload + 4, len - 4);
    if (type == 15 && len == 16) {
      StoreU64(s, payload, pos);
      StoreU32(s, payload + 8, count);
      StoreU32(s, payload + 12, util::Crc32c(std::string_view(s).substr(0, 24)));
    }
    StoreU32(s, payload + len, util::Crc32c(std::string_view(s).substr(pos, 16 + len)));
    pos = payload + len + 4;
    if (type == 15) break;
    ++count;
  }
  return s;
}

}  // namespace cortiq::fuzz
