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

}  // namespace

absl::Status PackedWeights::QuantizeInt8(std::span<WeightView* const> views,
                                         std::span<const void* const> keep_sources,
                                         util::ThreadPool* pool) {
  // One copy per distinct source, each at a 4 KiB boundary.
  struct Copy {
    const void* source;
    DType dtype;
    size_t rows, cols, offset;
  };
  std::vector<Copy> copies;
  size_t total = 0;
  for (WeightView* v : views) {
    if (v->dtype == DType::kQ8_0) continue;
    const bool seen = std::any_of(copies.begin(), copies.end(),
                                  [&](const Copy& c) { return c.source == v->data; });
    if (seen) continue;
    copies.push_back({v->data, v->dtype, v->rows, v->cols, total});
    total += (v->rows * RowBytes(DType::kQ8_0, v->cols) + 4095) / 4096 * 4096;
  }
  if (copies.empty()) return absl::OkStatus();
  try {
    int8_ = util::HugeBuffer<uint8_t>(total);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("--weights int8: the int8 copy of the weights (", total,
                     " bytes) could not be mapped"));
  }
  for (const Copy& c : copies) {
    uint8_t* dst = int8_.data() + c.offset;
    const size_t src_row = RowBytes(c.dtype, c.cols), dst_row = RowBytes(DType::kQ8_0, c.cols);
    const auto* src = static_cast<const uint8_t*>(c.source);
    pool->ParallelFor(
        c.rows,
        [&](size_t begin, size_t end) {
          std::vector<float> row(c.cols);  // one per chunk: load time only
          for (size_t r = begin; r < end; ++r) {
            ConvertToF32(src + r * src_row, c.dtype, c.cols, row.data());
            QuantizeQ8_0(row.data(), c.cols, dst + r * dst_row);
          }
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

bool PackedWeights::Owns(const void* p) const {
  auto in = [p](const void* base, size_t bytes) {
    const auto* b = static_cast<const uint8_t*>(base);
    const auto* q = static_cast<const uint8_t*>(p);
    return base != nullptr && q >= b && q < b + bytes;
  };
  return in(tiles_.data(), tiles_.MemoryBytes()) || in(int8_.data(), int8_.MemoryBytes());
}

absl::StatusOr<PackedWeights> PackedWeights::Pack(std::span<WeightView* const> views,
                                                  std::span<const void* const> keep_sources,
                                                  util::ThreadPool* pool,
                                                  const PackOptions& options) {
  PackedWeights out;
  if (options.int8) {
    if (absl::Status s = out.QuantizeInt8(views, keep_sources, pool); !s.ok()) return s;
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
