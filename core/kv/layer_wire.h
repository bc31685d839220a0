// The CQKV layer blob (docs/WIRE_FORMAT.md) piece by piece: LayerWireSource
// reads a cache's blob into the caller's buffers, LayerWireSink writes a blob
// into a new cache as its bytes arrive. A session migration streams layers
// through them between the caches and the network buffers, without a copy
// of the whole blob on either side. LayerKvCache::ExportWire and ImportWire
// (layer_kv_cache.h) are these two run over one whole buffer, so the bytes,
// the checks, the errors and their order are the same. Both reach the cache
// through its public API only: the source reads LayerKvCache::HeadRows and
// the O1* accessors; the sink fills a KvRows (KvRows::Fill, SetDenseRows)
// and hands it over as a LayerKvCache.
//
// Example (copy a layer through a 64 KiB buffer):
//   CORTIQ_ASSIGN_OR_RETURN(LayerWireSource src, LayerWireSource::Make(cache, {}));
//   char buf[65536];
//   size_t n = src.Read(buf, sizeof(buf));  // the first 44 bytes are the header
//   CORTIQ_ASSIGN_OR_RETURN(LayerWireSink sink, LayerWireSink::Begin(
//       {buf, 44}, src.size(), cache.num_kv_heads(), cache.head_dim(), cache.mode(), expect));
//   sink.Write({buf + 44, n - 44});
//   while (src.left() > 0) sink.Write({buf, src.Read(buf, sizeof(buf))});
//   CORTIQ_ASSIGN_OR_RETURN(LayerKvCache copy, sink.Finish());
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/kv/layer_kv_cache.h"

namespace cortiq::kv {

// Bytes of a blob before its body, and of the checksum after it.
inline constexpr size_t kWireHeaderBytes = 44;
inline constexpr size_t kWireCrcBytes = 4;

// A layer's blob read front to back, straight from the cache's rows. Holds
// pointers into the cache: it must neither change nor go away before the
// last Read (a session lease guarantees it). Move-only; one reader.
class LayerWireSource {
 public:
  // ExportWire's refusals, every one checked here before a byte is read
  // (with f16, that is a pass over the rows for values beyond f16's range),
  // each FailedPrecondition carrying its WireRefusal (wire_refusal.h).
  // A sealed O(1) layer (small) is serialised here and read from a copy.
  static absl::StatusOr<LayerWireSource> Make(const LayerKvCache& cache,
                                              const WireOptions& options);

  uint64_t size() const { return size_; }  // the blob's bytes, 48 + body
  uint64_t left() const { return size_ - pos_; }
  // Writes the next min(n, left()) bytes of the blob to dst and returns how
  // many. One pass over them: copied (or rounded to f16) and checksummed.
  size_t Read(char* dst, size_t n);
  // CRC-32C of the blob's bytes [0, size() - 4), i.e. the checksum it ends
  // with; valid once Read has passed them (for Crc32cCombine).
  uint32_t body_crc() const { return crc_; }

 private:
  enum class Kind : uint8_t { kOwned, kRaw, kF16, kCrc };
  struct Piece {
    Kind kind;
    uint64_t bytes;             // bytes this piece adds to the blob
    const char* src = nullptr;  // kRaw: the rows; kF16: the f32 rows (bytes / 2 floats)
    size_t offset = 0;          // kOwned: where in owned_
  };
  LayerWireSource() = default;
  void Add(Piece p);

  std::string owned_;  // the header (sealed: header and body)
  std::vector<Piece> pieces_;
  uint64_t size_ = 0, pos_ = 0;
  size_t piece_ = 0;       // the piece being read
  uint64_t in_piece_ = 0;  // bytes of it already read
  uint32_t crc_ = 0;
  char crc_le_[kWireCrcBytes] = {};
};

// A blob written into a new cache as its bytes arrive (rows straight into the
// cache's storage). Move-only; one writer.
class LayerWireSink {
 public:
  // Starts a blob of `blob_bytes` bytes (its length comes from whatever
  // frames it) whose first min(44, blob_bytes) bytes are `header`, for a
  // cache of this geometry and mode (the importer's model; see ImportWire).
  // What ImportWire checks before the checksum fails here: truncated, bad
  // magic, unknown version (FailedPrecondition), length mismatch. What it
  // checks after the checksum waits for Finish: the sink then only
  // checksums the rest. Otherwise the rows are reserved now (the exporter's
  // capacity, at most expect.max_positions), so the caller decides when a
  // blob's bytes can still arrive before beginning it. `reserved`, when
  // given: a fresh cache of this geometry already reserved (on another
  // thread, ahead of time); its rows are taken (LayerKvCache::TakeRows,
  // leaving it released) instead of reserving when its capacity is the one
  // the blob asks for, else it is left as it is.
  // `admit`, when given, is asked before anything is allocated, with the
  // bytes about to be held (the rows to reserve, a sealed body to keep); its
  // error (an importer's memory budget: RESOURCE_EXHAUSTED) is returned at
  // once, with nothing allocated. Rows taken from `reserved` are not asked
  // for (the caller admitted them when it reserved them).
  using Admit = std::function<absl::Status(size_t bytes)>;
  static absl::StatusOr<LayerWireSink> Begin(std::string_view header, uint64_t blob_bytes,
                                             size_t num_kv_heads, size_t head_dim, KvMode mode,
                                             const WireImportExpect& expect,
                                             LayerKvCache* reserved = nullptr,
                                             const Admit& admit = nullptr);
  // Positions the new cache reserved for the rows (0: none, e.g. a sealed
  // layer or a refused header): what the next layer will likely ask for.
  size_t reserved_positions() const { return next_.capacity(); }
  // Heap bytes this sink holds now: the reserved rows and a sealed body's
  // kept bytes. O(1).
  size_t held_bytes() const { return next_.MemoryBytes() + kept_.capacity(); }

  // Bytes still to come: the body, then the 4-byte checksum.
  uint64_t left() const { return left_; }
  // The blob's next bytes; bytes.size() <= left() (the caller frames them).
  void Write(std::string_view bytes);
  // Once left() == 0: DataLoss on a checksum mismatch, else the first check
  // that failed after it (DataLoss, FailedPrecondition), else the cache,
  // holding what ImportWire would have installed.
  absl::StatusOr<LayerKvCache> Finish();
  // CRC-32C of the blob's bytes [0, blob_bytes - 4), and the checksum the
  // blob carries (valid once left() == 0; for Crc32cCombine).
  uint32_t body_crc() const { return crc_; }
  uint32_t stored_crc() const;

 private:
  enum class Kind : uint8_t { kRaw, kF16, kKeep, kSkip };
  struct Piece {
    Kind kind;
    uint64_t bytes;       // blob bytes this piece takes
    char* dst = nullptr;  // kRaw: the rows; kF16: the f32 rows (bytes / 2 floats)
  };
  LayerWireSink(size_t num_kv_heads, size_t head_dim, KvMode mode);
  // The body's destinations once the header passed every check.
  // Plans the body's pieces and reserves its rows; admit's refusal only is
  // returned (a malformed body is deferred_, reported after the checksum).
  absl::Status PlanBody(uint64_t body_bytes, uint64_t capacity, bool f16, bool int8,
                        const WireImportExpect& expect, LayerKvCache* reserved,
                        const Admit& admit);
  void WriteF16(float* dst, uint64_t offset, std::string_view bytes);

  KvRows next_;            // the exact rows being written (empty for a sealed blob)
  absl::Status deferred_;  // the first check after the checksum that failed
  bool sealed_ = false;    // kKeep: the O(1) body is kept and parsed at Finish
  size_t q_heads_ = 0;     // expect.num_q_heads, for the O(1) body
  uint64_t seq_len_ = 0;
  std::string kept_;  // kKeep's bytes
  std::vector<Piece> pieces_;
  size_t piece_ = 0;
  uint64_t in_piece_ = 0;
  uint64_t left_ = 0;
  uint32_t crc_ = 0;
  char crc_le_[kWireCrcBytes] = {};
  size_t crc_got_ = 0;
  uint8_t half_ = 0;  // kF16: the low byte of an f16 split between two writes
};

}  // namespace cortiq::kv
