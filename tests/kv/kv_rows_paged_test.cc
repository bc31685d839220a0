// KvRows' paged row buffers: from 1 MiB a row buffer's head blocks start on
// pages and span a stride grown ahead of the capacity, of which only the
// pages under capacity() rows are committed. Checked here: what Reserve
// counts is what ProjectedBytes says on both sides of the threshold; a kept
// session's turns (ReleaseUnused, then Reserve a few more positions) commit
// pages in place instead of moving every row, and only at the geometric
// steps do the rows move; the pages counted are the pages resident
// (mincore); Copy and ShrinkToFit keep every row and count exactly.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/kv/kv_rows.h"
#include "tests/kv/kv_test_util.h"

namespace cortiq::kv {
namespace {

using kvtest::RandomVec;

constexpr size_t kH = 8, kD = 128;

size_t Page() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }
size_t RoundUpPage(size_t b) { return (b + Page() - 1) / Page() * Page(); }
size_t Round64(size_t b) { return (b + 63) / 64 * 64; }
size_t RowBytes(KvMode mode) { return kD * (mode == KvMode::kF32 ? 4 : 1); }

// Appends n random positions to every head.
void Append(KvRows& r, std::mt19937& rng, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    r.Append(RandomVec(rng, kH * kD), RandomVec(rng, kH * kD), {});
  }
}

// The stored bytes of head h's keys and values.
std::vector<char> Stored(const KvRows& r, size_t h) {
  const HeadRowsView v = r.Head(h);
  std::vector<char> out;
  auto add = [&](const void* p, size_t n) {
    out.insert(out.end(), static_cast<const char*>(p), static_cast<const char*>(p) + n);
  };
  if (v.mode == KvMode::kF32) {
    add(v.keys.data(), v.keys.size_bytes());
    add(v.values.data(), v.values.size_bytes());
  } else {
    add(v.keys_i8.data(), v.keys_i8.size_bytes());
    add(v.key_scales.data(), v.key_scales.size_bytes());
    add(v.values_i8.data(), v.values_i8.size_bytes());
    add(v.value_scales.data(), v.value_scales.size_bytes());
  }
  return out;
}

std::vector<std::vector<char>> StoredAll(const KvRows& r) {
  std::vector<std::vector<char>> all;
  for (size_t h = 0; h < kH; ++h) all.push_back(Stored(r, h));
  return all;
}

const void* KeyBase(const KvRows& r, size_t h) {
  const HeadRowsView v = r.Head(h);
  return v.mode == KvMode::kF32 ? static_cast<const void*>(v.keys.data())
                                : static_cast<const void*>(v.keys_i8.data());
}

// Resident pages of each head's key block, over its whole stride (the
// distance between two heads' blocks); all heads must agree, else 0.
size_t ResidentKeyPages(const KvRows& r) {
  const auto* a = static_cast<const char*>(KeyBase(r, 0));
  const auto* b = static_cast<const char*>(KeyBase(r, 1));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % Page(), 0u) << "a paged head block starts on a page";
  const size_t stride = static_cast<size_t>(b - a), pages = stride / Page();
  EXPECT_EQ(stride % Page(), 0u);
  size_t resident = 0;
  for (size_t h = 0; h < kH; ++h) {
    std::vector<unsigned char> in(pages);
    EXPECT_EQ(mincore(const_cast<char*>(a) + h * stride, pages * Page(), in.data()), 0);
    size_t n = 0;
    for (unsigned char c : in) n += c & 1;
    if (h == 0) resident = n;
    if (n != resident) {
      ADD_FAILURE() << "head " << h << ": " << n << " pages resident, head 0: " << resident;
      return 0;
    }
  }
  return resident;
}

TEST(KvRowsPagedTest, ReserveCountsWhatItProjectsOnBothSidesOfTheThreshold) {
  for (KvMode mode : {KvMode::kF32, KvMode::kInt8}) {
    const size_t rb = RowBytes(mode);
    // 1 MiB of rows per buffer: 256 positions in f32, 1024 in int8.
    const size_t threshold = (size_t{1} << 20) / (kH * rb);
    for (size_t p : {size_t{1}, size_t{100}, threshold - 1, threshold, threshold + 1,
                     threshold * 4 + 3, size_t{2201}}) {
      KvRows r(kH, kD, mode);
      r.Reserve(p);
      EXPECT_EQ(r.MemoryBytes(), KvRows::ProjectedBytes(kH, kD, mode, p)) << p;
      size_t rows = p < threshold ? Round64(kH * p * rb) : kH * RoundUpPage(p * rb);
      size_t want = Round64(kH * sizeof(size_t)) + 2 * rows;
      if (mode == KvMode::kInt8) want += 2 * Round64(kH * p * 4);
      EXPECT_EQ(KvRows::ProjectedBytes(kH, kD, mode, p), want) << p;
      if (p >= threshold) {
        std::mt19937 rng(1);
        Append(r, rng, 2);  // two heads' rows to find the stride by
        EXPECT_EQ(ResidentKeyPages(r), RoundUpPage(p * rb) / Page()) << p;
      }
    }
  }
}

TEST(KvRowsPagedTest, AKeptSessionsTurnsCommitPagesInPlaceAndMoveRowsOnlyGeometrically) {
  for (KvMode mode : {KvMode::kF32, KvMode::kInt8}) {
    std::mt19937 rng(7);
    const size_t rb = RowBytes(mode);
    KvRows r(kH, kD, mode);
    r.Reserve(2200);  // prompt + max_tokens
    Append(r, rng, 2150);
    const auto held = StoredAll(r);
    r.ReleaseUnused();  // the call ended early
    EXPECT_EQ(StoredAll(r), held);
    if (mode == KvMode::kF32) {
      EXPECT_EQ(r.MemoryBytes(), KvRows::ProjectedBytes(kH, kD, mode, 2150));
    }
    EXPECT_EQ(ResidentKeyPages(r), RoundUpPage(2150 * rb) / Page());
    // Forty turns of 16 prompt + 16 generated positions.
    size_t moves = 0;
    for (size_t turn = 0; turn < 40; ++turn) {
      const auto before = StoredAll(r);
      const void* base = KeyBase(r, 0);
      const size_t positions = r.seq_len() + 32 + 50;  // + max_tokens headroom
      r.Reserve(positions);
      EXPECT_EQ(r.MemoryBytes(), KvRows::ProjectedBytes(kH, kD, mode, positions)) << turn;
      EXPECT_EQ(StoredAll(r), before) << "turn " << turn << ": a stored row changed";
      EXPECT_EQ(ResidentKeyPages(r), RoundUpPage(positions * rb) / Page()) << turn;
      moves += KeyBase(r, 0) != base;
      Append(r, rng, 32);
      const auto held = StoredAll(r);
      r.ReleaseUnused();
      EXPECT_EQ(StoredAll(r), held) << "turn " << turn << ": ReleaseUnused changed a row";
      EXPECT_EQ(ResidentKeyPages(r), RoundUpPage(r.seq_len() * rb) / Page()) << turn;
    }
    // 2,150 -> 3,430 positions: the first stride (3,300: the 2,200
    // reserved and half again) is outgrown once; every other turn commits
    // in place.
    EXPECT_EQ(moves, 1u) << "rows moved on " << moves << " of 40 turns";
  }
}

TEST(KvRowsPagedTest, CopyAndShrinkToFitKeepEveryRowAndCountExactly) {
  for (KvMode mode : {KvMode::kF32, KvMode::kInt8}) {
    std::mt19937 rng(8);
    KvRows r(kH, kD, mode);
    r.Reserve(1500);
    Append(r, rng, 100);
    const auto first100 = StoredAll(r);
    Append(r, rng, 1300);
    r.Reserve(1700);  // inside the stride (2,250): in place
    Append(r, rng, 100);
    const auto rows = StoredAll(r);

    KvRows c = r.Copy();
    EXPECT_EQ(StoredAll(c), rows);
    EXPECT_EQ(c.MemoryBytes(), r.MemoryBytes());
    EXPECT_EQ(c.MemoryBytes(), KvRows::ProjectedBytes(kH, kD, mode, 1700));
    EXPECT_EQ(c.capacity(), r.capacity());
    Append(c, rng, 5);  // appends on without disturbing the original
    EXPECT_EQ(StoredAll(r), rows);

    // Pages given back (ReleaseUnused: a turn that ended short of its
    // reservation) are not committed again by a copy (a fork of n > 1
    // choices): it holds what the original holds, not its capacity (it
    // used to commit the whole capacity, past what admission reserved).
    KvRows q = r.Copy();
    q.ReleaseUnused();
    KvRows f = q.Copy();
    EXPECT_EQ(StoredAll(f), rows);
    EXPECT_EQ(f.MemoryBytes(), q.MemoryBytes());
    EXPECT_LT(f.MemoryBytes(), KvRows::ProjectedBytes(kH, kD, mode, 1700));
    EXPECT_EQ(ResidentKeyPages(f), RoundUpPage(1500 * RowBytes(mode)) / Page());
    f.Reserve(1700);
    Append(f, rng, 200);
    EXPECT_EQ(f.MemoryBytes(), KvRows::ProjectedBytes(kH, kD, mode, 1700));
    Append(f, rng, 10);  // past the reservation, inside the capacity
    EXPECT_EQ(StoredAll(q), rows);

    r.ShrinkToFit();
    EXPECT_EQ(r.capacity(), 1500u);
    EXPECT_EQ(r.MemoryBytes(), KvRows::ProjectedBytes(kH, kD, mode, 1500));
    EXPECT_EQ(StoredAll(r), rows);
    EXPECT_EQ(ResidentKeyPages(r), RoundUpPage(1500 * RowBytes(mode)) / Page());

    // Below the threshold again: a plain buffer, exact to 64 bytes.
    r.TruncateLast(1400);
    r.ShrinkToFit();
    EXPECT_EQ(r.capacity(), 100u);
    EXPECT_EQ(r.MemoryBytes(), KvRows::ProjectedBytes(kH, kD, mode, 100));
    EXPECT_EQ(StoredAll(r), first100);
  }
}

}  // namespace
}  // namespace cortiq::kv
