#include "core/math/packed_weights.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <new>
#include <vector>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace cortiq::math {
namespace {

// Hands the whole pages inside [p, p + bytes) back to the kernel. The
// mapping is read-only and file-backed: anything that reads it again (QSA
// deriving its indexer from q/k) faults the pages back in from the file.
void DropPages(const void* p, size_t bytes) {
  const long page = sysconf(_SC_PAGESIZE);
  if (page <= 0) return;
  const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + bytes) / page * page;
  if (e > b) madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
}

bool Kept(std::span<const void* const> keep, const void* p) {
  return std::find(keep.begin(), keep.end(), p) != keep.end();
}

// One copy of a source matrix in a packed buffer, at `offset` bytes.
struct Copy {
  const void* source;
  DType dtype;
  size_t rows, cols, offset;
};

// Rows [begin, end) of a float matrix quantized to Q8_0 rows at `dst` (load
// time only: one row of scratch per call).
void QuantizeRows(const uint8_t* src, DType dtype, size_t cols, size_t begin, size_t end,
                  uint8_t* dst) {
  const size_t src_row = RowBytes(dtype, cols), dst_row = RowBytes(DType::kQ8_0, cols);
  std::vector<float> row(cols);
  for (size_t r = begin; r < end; ++r) {
    ConvertToF32(src + r * src_row, dtype, cols, row.data());
    QuantizeQ8_0(row.data(), cols, dst + (r - begin) * dst_row);
  }
}

bool HasSource(const std::vector<Copy>& copies, const void* p) {
  return std::any_of(copies.begin(), copies.end(), [&](const Copy& c) { return c.source == p; });
}

}  // namespace

absl::Status PackedWeights::QuantizeInt8(std::span<WeightView* const> views,
                                         std::span<const void* const> keep_sources,
                                         util::ThreadPool* pool, bool lanes,
                                         const WeightView* only) {
  // One copy per distinct source, each at a 4 KiB boundary.
  std::vector<Copy> copies;
  size_t total = 0;
  for (WeightView* v : views) {
    if (v->dtype == DType::kQ8_0) continue;
    if (lanes && (only == nullptr || v->data != only->data)) continue;
    if (HasSource(copies, v->data)) continue;
    copies.push_back({v->data, v->dtype, v->rows, v->cols, total});
    total += (v->rows * RowBytes(DType::kQ8_0, v->cols) + 4095) / 4096 * 4096;
  }
  if (copies.empty()) return absl::OkStatus();
  try {
    int8_ = util::HugeBuffer<uint8_t>(total);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "--weights int8: the int8 copy of the weights (", total, " bytes) could not be mapped"));
  }
  for (const Copy& c : copies) {
    uint8_t* dst = int8_.data() + c.offset;
    const size_t src_row = RowBytes(c.dtype, c.cols), dst_row = RowBytes(DType::kQ8_0, c.cols);
    const auto* src = static_cast<const uint8_t*>(c.source);
    pool->ParallelFor(
        c.rows,
        [&](size_t begin, size_t end) {
          QuantizeRows(src, c.dtype, c.cols, begin, end, dst + begin * dst_row);
        },
        64);
    for (WeightView* v : views) {
      if (v->data != c.source) continue;
      v->data = dst;
      v->dtype = DType::kQ8_0;
      v->bf16_activations = false;
    }
    if (!Kept(keep_sources, c.source)) DropPages(c.source, c.rows * src_row);
  }
  return absl::OkStatus();
}

absl::Status PackedWeights::PackLanes(std::span<WeightView* const> views,
                                      std::span<const void* const> keep_sources,
                                      util::ThreadPool* pool, const WeightView* rows_only,
                                      bool int8) {
  std::vector<Copy> copies;
  size_t total = 0;
  bool from_float = false;
  for (const WeightView* v : views) {
    if (v == rows_only || v->data == nullptr || v->cols % kQ8Block != 0) continue;
    const bool q8 = v->dtype == DType::kQ8_0;
    if (!q8 && !(int8 && DTypeSize(v->dtype) > 0)) continue;
    if (HasSource(copies, v->data)) continue;
    from_float = from_float || !q8;
    copies.push_back({v->data, v->dtype, v->rows, v->cols, total});
    total += (Q8LaneBytes(v->rows, v->cols) + 4095) / 4096 * 4096;
  }
  if (copies.empty()) return absl::OkStatus();
  try {
    lanes_ = util::HugeBuffer<uint8_t>(total);
  } catch (const std::bad_alloc&) {
    if (from_float) {
      return absl::ResourceExhaustedError(
          absl::StrCat("--weights int8: the lane-order copy of the weights (", total,
                       " bytes) could not be mapped"));
    }
    spdlog::warn(
        "model: the lane-order copy of the int8 weights ({} bytes) could not be mapped; "
        "reading them in place",
        total);
    return absl::OkStatus();
  }
  for (const Copy& c : copies) {
    uint8_t* dst = lanes_.data() + c.offset;
    const auto* src = static_cast<const uint8_t*>(c.source);
    const size_t src_row = RowBytes(c.dtype, c.cols), q8_row = RowBytes(DType::kQ8_0, c.cols);
    const size_t group_bytes = Q8LaneBytes(kQ8LaneRows, c.cols);
    pool->ParallelFor(
        c.rows,
        [&](size_t begin, size_t end) {
          if (c.dtype == DType::kQ8_0) return PackQ8Lanes(src, c.rows, c.cols, dst, begin, end);
          // A float source: 16 rows at a time quantized exactly as
          // QuantizeInt8 would, then laid out (load time only).
          std::vector<uint8_t> q(kQ8LaneRows * q8_row);
          for (size_t r0 = begin; r0 < end; r0 += kQ8LaneRows) {
            const size_t n = std::min(kQ8LaneRows, c.rows - r0);
            QuantizeRows(src, c.dtype, c.cols, r0, r0 + n, q.data());
            PackQ8Lanes(q.data(), n, c.cols, dst + r0 / kQ8LaneRows * group_bytes, 0, n);
          }
        },
        kQ8LaneRows);
    for (WeightView* v : views) {
      if (v->data != c.source || v == rows_only) continue;
      v->q8_lanes = dst;
      if (v->dtype != DType::kQ8_0) {  // no Q8_0 rows of it exist
        v->data = nullptr;
        v->dtype = DType::kQ8_0;
        v->bf16_activations = false;
      }
    }
    if (!Kept(keep_sources, c.source) && !Owns(c.source)) {
      DropPages(c.source, c.rows * src_row);
    }
  }
  return absl::OkStatus();
}

bool PackedWeights::Owns(const void* p) const {
  auto in = [p](const void* base, size_t bytes) {
    const auto* b = static_cast<const uint8_t*>(base);
    const auto* q = static_cast<const uint8_t*>(p);
    return base != nullptr && q >= b && q < b + bytes;
  };
  return in(tiles_.data(), tiles_.MemoryBytes()) || in(int8_.data(), int8_.MemoryBytes()) ||
         in(lanes_.data(), lanes_.MemoryBytes());
}

absl::StatusOr<PackedWeights> PackedWeights::Pack(std::span<WeightView* const> views,
                                                  std::span<const void* const> keep_sources,
                                                  util::ThreadPool* pool,
                                                  const PackOptions& options) {
  PackedWeights out;
  const bool lanes = Q8LanesUsed();
  // Tied (the row-read view shares its source with a multiplied one): the
  // lane-order copy serves both (Q8LaneRowToF32), no Q8_0 rows are made.
  const WeightView* rows = options.rows_only;
  const bool tied = rows != nullptr && std::any_of(views.begin(), views.end(), [&](const auto* v) {
                      return v != rows && v->data == rows->data;
                    });
  if (options.int8) {
    if (absl::Status s = out.QuantizeInt8(views, keep_sources, pool, lanes, tied ? nullptr : rows);
        !s.ok()) {
      return s;
    }
  }
  if (lanes) {
    if (absl::Status s =
            out.PackLanes(views, keep_sources, pool, tied ? nullptr : rows, options.int8);
        !s.ok()) {
      return s;
    }
  }
  if (!AmxTilesUsed()) return out;
  std::vector<WeightView*> packed;
  std::vector<size_t> offset;
  size_t total = 0;
  for (WeightView* v : views) {
    if (!v->bf16_activations || v->dtype != DType::kBF16) continue;
    packed.push_back(v);
    offset.push_back(total);
    total +=
        (AmxTileElements(v->rows, v->cols) + kAlignElements - 1) / kAlignElements * kAlignElements;
  }
  if (packed.empty()) return out;
  try {
    out.tiles_ = util::HugeBuffer<uint16_t>(total);
  } catch (const std::bad_alloc&) {
    spdlog::warn(
        "model: the AMX tile copy of the weights ({} bytes) could not be mapped; "
        "reading them from the checkpoint in place",
        total * sizeof(uint16_t));
    return out;
  }
  for (size_t i = 0; i < packed.size(); ++i) {
    WeightView* v = packed[i];
    uint16_t* tiles = out.tiles_.data() + offset[i];
    const auto* src = static_cast<const uint16_t*>(v->data);
    pool->ParallelFor(
        v->rows,
        [&](size_t begin, size_t end) { PackAmxTiles(src, v->rows, v->cols, tiles, begin, end); },
        16);
    v->amx_tiles = tiles;
    if (!Kept(keep_sources, v->data)) DropPages(src, v->rows * v->cols * sizeof(uint16_t));
  }
  return out;
}

}  // namespace cortiq::math
