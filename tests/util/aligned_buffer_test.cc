#include "core/util/aligned_buffer.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace cortiq::util {
namespace {

// The mapping that holds `p`, from /proc/self/smaps: its size and whether
// the kernel was advised huge pages for it ("hg" in VmFlags).
struct MappingInfo {
  size_t bytes = 0;
  bool advised_huge = false;
};
MappingInfo MappingOf(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool in = false;
  MappingInfo info;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
      in = a >= lo && a < hi;
      if (in) info.bytes = hi - lo;
      continue;
    }
    if (in && line.rfind("VmFlags:", 0) == 0) {
      info.advised_huge = line.find(" hg") != std::string::npos;
      return info;
    }
  }
  return info;
}

class HugePagesEnv {
 public:
  explicit HugePagesEnv(const char* value) {
    if (value == nullptr) {
      unsetenv("CORTIQ_HUGE_PAGES");
    } else {
      setenv("CORTIQ_HUGE_PAGES", value, 1);
    }
  }
  ~HugePagesEnv() { unsetenv("CORTIQ_HUGE_PAGES"); }
};

TEST(AlignedBufferTest, ZeroFilledAndAlignedSmallAndMapped) {
  for (size_t n : {size_t{1}, size_t{1000}, size_t{3} << 20}) {
    AlignedBuffer<float> b(n);
    ASSERT_EQ(b.size(), n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % AlignedBuffer<float>::kAlignment, 0u);
    for (size_t i = 0; i < n; i += 997) ASSERT_EQ(b[i], 0.0f) << i;
    b[n - 1] = 2.5f;
    EXPECT_EQ(b[n - 1], 2.5f);
  }
}

TEST(AlignedBufferTest, HugePagesOnlyWhenAskedAndNeverMoreThanAsked) {
  constexpr size_t kHuge = kHugePageBytes;
  // 5 MiB + 12 KiB: two whole 2 MiB extents and a tail.
  const size_t n = 5 * (size_t{1} << 20) + 12 * 1024;
  {
    HugePagesEnv env(nullptr);
    EXPECT_FALSE(AlignedBuffer<uint8_t>::HugePagesRequested());
    AlignedBuffer<uint8_t> b(n);
    EXPECT_FALSE(MappingOf(b.data()).advised_huge);
  }
  {
    HugePagesEnv env("0");
    EXPECT_FALSE(AlignedBuffer<uint8_t>::HugePagesRequested());
  }
  {
    HugePagesEnv env("1");
    ASSERT_TRUE(AlignedBuffer<uint8_t>::HugePagesRequested());
    AlignedBuffer<uint8_t> b(n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % kHuge, 0u);
    const MappingInfo m = MappingOf(b.data());
    EXPECT_TRUE(m.advised_huge);
    EXPECT_GE(m.bytes, n);  // (the kernel may merge it with a neighbour)
    for (size_t i = 0; i < n; i += 4093) ASSERT_EQ(b[i], 0) << i;
    b[n - 1] = 9;
    EXPECT_EQ(b[n - 1], 9);
    // Resize frees the huge mapping and makes another.
    b.Resize(kHuge / 2);
    EXPECT_FALSE(MappingOf(b.data()).advised_huge);  // below 2 MiB: plain pages
  }
}

TEST(AlignedBufferTest, UncommittedMapsNothingUntilCommitted) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t n = (size_t{4} << 20) / sizeof(float);  // 4 MiB
  AlignedBuffer<float> b;
  b.ResizeUncommitted(n);
  ASSERT_EQ(b.size(), n);
  ASSERT_EQ(reinterpret_cast<uintptr_t>(b.data()) % page, 0u);
  auto resident = [&] {
    std::vector<unsigned char> in(n * sizeof(float) / page);
    EXPECT_EQ(mincore(b.data(), n * sizeof(float), in.data()), 0);
    size_t r = 0;
    for (unsigned char c : in) r += c & 1;
    return r;
  };
  EXPECT_EQ(resident(), 0u);
  // Elements [1000, 1000 + 3 pages' worth): the pages holding them, 4 here
  // (the range starts mid-page).
  const size_t per_page = page / sizeof(float);
  b.Commit(1000, 3 * per_page);
  EXPECT_EQ(resident(), 4u);
  for (size_t i = 0; i < 4 * per_page; ++i) ASSERT_EQ(b[i], 0.0f) << i;
  // Committing again keeps what was written.
  b[1000] = 3.5f;
  b.Commit(0, 5 * per_page);
  EXPECT_EQ(resident(), 5u);
  EXPECT_EQ(b[1000], 3.5f);
  AlignedBuffer<float> small;
  EXPECT_THROW(small.ResizeUncommitted(16), std::length_error);
}

}  // namespace
}  // namespace cortiq::util
