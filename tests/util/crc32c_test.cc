// CRC-32C known answers (RFC 3720 B.4 and the "123456789" check value), the
// Extend contract, and the table and SSE4.2 paths agreeing at every length
// and alignment.
#include "core/util/crc32c.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace cortiq::util {
namespace {

uint32_t Crc(const std::string& s) { return Crc32c(s.data(), s.size()); }
uint32_t Crc(const std::vector<uint8_t>& v) { return Crc32c(v.data(), v.size()); }

TEST(Crc32cTest, KnownAnswers) {
  EXPECT_EQ(Crc("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(std::string_view("123456789")), 0xE3069283u);
  EXPECT_EQ(Crc(""), 0u);
  EXPECT_EQ(Crc("a"), 0xC1D04330u);
  // RFC 3720 appendix B.4.
  EXPECT_EQ(Crc(std::vector<uint8_t>(32, 0x00)), 0x8A9136AAu);
  EXPECT_EQ(Crc(std::vector<uint8_t>(32, 0xFF)), 0x62A8AB43u);
  std::vector<uint8_t> up(32), down(32);
  for (int i = 0; i < 32; ++i) {
    up[i] = static_cast<uint8_t>(i);
    down[i] = static_cast<uint8_t>(31 - i);
  }
  EXPECT_EQ(Crc(up), 0x46DD794Eu);
  EXPECT_EQ(Crc(down), 0x113FDB5Cu);
}

TEST(Crc32cTest, BothPathsGiveTheKnownAnswer) {
  const std::string s = "123456789";
  EXPECT_EQ(internal::Crc32cExtendPortable(0, s.data(), s.size()), 0xE3069283u);
  if (!internal::Crc32cHasSse42()) GTEST_SKIP() << "no SSE4.2 on this CPU";
  EXPECT_EQ(internal::Crc32cExtendSse42(0, s.data(), s.size()), 0xE3069283u);
}

TEST(Crc32cTest, ExtendEqualsTheCrcOfTheConcatenation) {
  std::mt19937 rng(7);
  std::vector<uint8_t> buf(300);
  for (uint8_t& b : buf) b = static_cast<uint8_t>(rng());
  const uint32_t whole = Crc32c(buf.data(), buf.size());
  for (size_t cut = 0; cut <= buf.size(); ++cut) {
    const uint32_t head = Crc32c(buf.data(), cut);
    EXPECT_EQ(Crc32cExtend(head, buf.data() + cut, buf.size() - cut), whole) << "cut " << cut;
  }
}

TEST(Crc32cTest, PortableAndSse42AgreeAtEveryLengthAndAlignment) {
  if (!internal::Crc32cHasSse42()) GTEST_SKIP() << "no SSE4.2 on this CPU";
  std::mt19937 rng(11);
  std::vector<uint8_t> buf(1024 + 16);
  for (uint8_t& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t n = 0; n <= 1024; n += (n < 64 ? 1 : 37)) {
      const uint32_t seed = static_cast<uint32_t>(rng());
      ASSERT_EQ(internal::Crc32cExtendPortable(seed, buf.data() + offset, n),
                internal::Crc32cExtendSse42(seed, buf.data() + offset, n))
          << "offset " << offset << " n " << n;
    }
  }
}

TEST(Crc32cTest, DetectsEverySingleBitFlip) {
  std::vector<uint8_t> buf(64);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(i * 37);
  const uint32_t want = Crc(buf);
  for (size_t i = 0; i < buf.size() * 8; ++i) {
    buf[i / 8] ^= static_cast<uint8_t>(1u << (i % 8));
    EXPECT_NE(Crc(buf), want) << "bit " << i;
    buf[i / 8] ^= static_cast<uint8_t>(1u << (i % 8));
  }
}

}  // namespace
}  // namespace cortiq::util
