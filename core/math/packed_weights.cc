#include "core/math/packed_weights.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <new>
#include <vector>

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

}  // namespace

PackedWeights PackedWeights::Pack(std::span<WeightView* const> views,
                                  std::span<const void* const> keep_sources,
                                  util::ThreadPool* pool) {
  PackedWeights out;
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
    if (std::find(keep_sources.begin(), keep_sources.end(), v->data) == keep_sources.end()) {
      DropPages(src, v->rows * v->cols * sizeof(uint16_t));
    }
  }
  return out;
}

}  // namespace cortiq::math
