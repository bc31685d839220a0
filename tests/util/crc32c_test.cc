// CRC-32C known answers (RFC 3720 B.4 and the "123456789" check value), the
// Extend contract, and the table and SSE4.2 paths agreeing at every length
// and alignment.
#include "core/util/crc32c.h"

#include <gtest/gtest.h>

#include <algorithm>
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

// Lengths around the three-lane stripes (3 × 4 KiB) of the SSE4.2 path.
TEST(Crc32cTest, PortableAndSse42AgreeOnLongInputs) {
  if (!internal::Crc32cHasSse42()) GTEST_SKIP() << "no SSE4.2 on this CPU";
  std::mt19937 rng(13);
  std::vector<uint8_t> buf(5 * 12288 + 64);
  for (uint8_t& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t offset : {0, 1, 5}) {
    for (size_t n : {12287, 12288, 12289, 24576 + 7, 3 * 12288 - 8, 5 * 12288 + 3}) {
      const uint32_t seed = static_cast<uint32_t>(rng());
      ASSERT_EQ(internal::Crc32cExtendPortable(seed, buf.data() + offset, n),
                internal::Crc32cExtendSse42(seed, buf.data() + offset, n))
          << "offset " << offset << " n " << n;
    }
  }
}

TEST(Crc32cTest, CombineEqualsTheCrcOfTheConcatenation) {
  std::mt19937 rng(17);
  std::vector<uint8_t> buf(70000);
  for (uint8_t& b : buf) b = static_cast<uint8_t>(rng());
  const uint32_t whole = Crc32c(buf.data(), buf.size());
  for (size_t cut : {0, 1, 7, 8, 300, 4096, 12288, 40000, 69999, 70000}) {
    const uint32_t a = Crc32c(buf.data(), cut);
    const uint32_t b = Crc32c(buf.data() + cut, buf.size() - cut);
    EXPECT_EQ(Crc32cCombine(a, b, buf.size() - cut), whole) << "cut " << cut;
  }
  // A long run of zeros, and lengths past 2^32 through the operator's
  // composition: moving over n1 then n2 bytes is moving over n1 + n2.
  std::vector<uint8_t> zeros(3'000'000, 0);
  EXPECT_EQ(Crc32cCombine(whole, Crc32c(zeros.data(), zeros.size()), zeros.size()),
            Crc32cExtend(whole, zeros.data(), zeros.size()));
  const uint64_t n1 = uint64_t{1} << 33, n2 = (uint64_t{1} << 31) + 3;
  EXPECT_EQ(Crc32cCombine(Crc32cCombine(whole, 0x1111u, n1), 0x2222u, n2),
            Crc32cCombine(whole, Crc32cCombine(0x1111u, 0x2222u, n2), n1 + n2));
}

TEST(Crc32cTest, CopyCopiesAndChecksums) {
  std::mt19937 rng(19);
  std::vector<uint8_t> src(100000), dst(src.size());
  for (uint8_t& b : src) b = static_cast<uint8_t>(rng());
  for (size_t n : {0, 1, 16383, 16384, 16385, 100000}) {
    std::fill(dst.begin(), dst.end(), 0);
    EXPECT_EQ(Crc32cCopy(0xABCDu, dst.data(), src.data(), n), Crc32cExtend(0xABCDu, src.data(), n));
    EXPECT_TRUE(std::equal(src.begin(), src.begin() + n, dst.begin())) << n;
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
