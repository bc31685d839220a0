// Backend: where the QSA indexer's buffers live and its kernels run.
//
// The indexer (qsa_indexer.h) never dereferences a buffer: it allocates,
// copies and frees through a Backend and launches the Backend's kernels on a
// stream. A CPU backend (cpu_backend.h) is the one implementation today; a
// CUDA backend can stand beside it later by implementing this same interface
// (DevicePtr = a CUdeviceptr, Stream = a cudaStream_t, the kernels as
// launches), without any change to QsaIndexer or to its callers.
//
// Contract
//   * DevicePtr is the backend's opaque 64-bit handle to device memory; 0 is
//     null. Byte offsets inside an allocation are formed with `p + bytes`
//     (valid for CPU addresses and CUDA device pointers alike). Only a backend
//     whose HostAddressable() is true may have its DevicePtrs turned into host
//     pointers (DevicePtr::FromHost / AsHost): the CPU backend, and adapters
//     over host memory such as LayerKvPool (kv_pool.h).
//   * Stream is an opaque ordering handle (kDefaultStream = 0). Kernels and
//     copies issued on one stream run in issue order. The CPU backend runs
//     everything synchronously on the calling thread (and its thread pool) and
//     ignores the stream.
//   * Copies are synchronous with respect to the HOST buffer: CopyToDevice may
//     reuse its source and CopyToHost's destination is filled when the call
//     returns (a CUDA backend synchronises the stream inside CopyToHost).
//   * Every call returns absl::Status; a kernel that fails leaves its outputs
//     unspecified. Kernels do not validate shapes: the indexer validates its
//     callers' arguments before it launches anything.
//   * Memory accounting: stats() reports the allocations the backend holds
//     right now (count and bytes as requested), so a test or a metric can tell
//     that every byte was given back.
//
// Thread-safety: implementations must make Allocate / Free / stats() safe to
// call concurrently; kernels on different streams (or, on the CPU backend,
// from different threads) with disjoint outputs may run concurrently.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/math/kernels.h"

namespace cortiq::qsa {

// An opaque device address (0 = null).
struct DevicePtr {
  uint64_t addr = 0;

  bool null() const { return addr == 0; }
  explicit operator bool() const { return addr != 0; }
  friend bool operator==(DevicePtr a, DevicePtr b) { return a.addr == b.addr; }
  // A byte offset inside the same allocation (null stays null).
  DevicePtr operator+(size_t bytes) const {
    return addr == 0 ? DevicePtr{} : DevicePtr{addr + bytes};
  }

  // Host-addressable backends only (see the banner).
  static DevicePtr FromHost(const void* p) {
    return DevicePtr{static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p))};
  }
  template <typename T>
  T* AsHost() const {
    return reinterpret_cast<T*>(static_cast<uintptr_t>(addr));
  }
};

using Stream = uint64_t;
inline constexpr Stream kDefaultStream = 0;

// ---------------------------------------------------------------------------
// The paged KV pool the selected-set attention reads.
//
// Position t of KV head h lives at
//   k + (table[t / block_size] · strides.block + (t % block_size) · strides.row
//        + h · strides.head) elements
// (the same for v), and for int8 rows its dequantisation scale at the same
// formula over k_scale / v_scale with scale_strides. One formula covers a
// vLLM-style pool [num_blocks][block_size][heads][head_dim] and the exact
// cache's head-major rows (kv_pool.h: LayerKvPool, identity table).
enum class KvDType : uint8_t { kF32 = 0, kInt8 = 1 };

struct PoolStrides {
  size_t block = 0;  // elements between physical block b and b + 1
  size_t row = 0;    // elements between consecutive rows of one block
  size_t head = 0;   // elements between KV head h and h + 1
};

struct KvPool {
  KvDType dtype = KvDType::kF32;
  DevicePtr k, v;              // f32 or int8 elements
  DevicePtr k_scale, v_scale;  // kInt8 only: one f32 per row
  size_t num_kv_heads = 0;
  size_t head_dim = 0;
  size_t block_size = 0;      // positions per pool block (paging grain)
  PoolStrides strides;        // in elements of k / v
  PoolStrides scale_strides;  // in floats of k_scale / v_scale (kInt8 only)
};

// Logical pool block → physical pool block, u32 [num_blocks] on the device.
struct BlockTable {
  DevicePtr ids;
  size_t num_blocks = 0;
};

// ---------------------------------------------------------------------------
// Kernel arguments. Shapes are row-major; "f32 [a × b]" is a device buffer.

// out = per-head RoPE(RmsNorm(W·x + bias)).
struct ProjectArgs {
  DevicePtr x;  // f32 [rows × cols]
  size_t rows = 0;
  size_t cols = 0;
  DevicePtr w;  // w_dtype [(heads · head_dim) × cols], nn.Linear layout
  math::DType w_dtype = math::DType::kF32;
  size_t heads = 0;
  size_t head_dim = 0;
  DevicePtr bias;  // null or f32 [heads · head_dim]
  DevicePtr norm;  // null (no norm) or f32 [head_dim]: RmsNorm per head
  float eps = 1e-6f;
  // RoPE (rotate-half) on the first `rot` dims of every head: pairs (i, i +
  // rot/2) turn by angle = double(pos) · double(inv_freq[i]), cos/sin rounded
  // to f32 (the transformer's own tables). rot == 0: no RoPE.
  DevicePtr inv_freq;  // f32 [rot / 2]
  size_t rot = 0;
  size_t pos0 = 0;  // row r is at position pos0 + r
  DevicePtr out;    // f32 [rows × heads · head_dim]
};

// Mean-pools blocks [first_block, end_block): pooled[b] = bf16(Σ_{i<ratio}
// f32(raw[b·ratio + i]) / ratio), the sum in token order, per dim.
struct PoolArgs {
  DevicePtr raw;     // bf16 [≥ end_block · ratio × hd]
  DevicePtr pooled;  // bf16 [≥ end_block × hd]
  size_t hd = 0;
  size_t ratio = 0;
  size_t first_block = 0;
  size_t end_block = 0;
};

// scores[r][b] = Σ_{j < n_heads} relu(q[r][j] · f32(pooled[b])) for the
// scored blocks b ∈ [1, min(num_blocks, cur_r)), cur_r = (pos0 + r) / ratio;
// every other entry of the row is left unwritten (never read).
struct ScoreArgs {
  DevicePtr q;  // f32 [rows × n_heads × hd] (normed, roped indexer queries)
  size_t rows = 0;
  size_t n_heads = 0;
  size_t hd = 0;
  DevicePtr pooled;  // bf16 [num_blocks × hd]
  size_t num_blocks = 0;
  size_t pos0 = 0;
  size_t ratio = 0;
  DevicePtr scores;  // f32 [rows × num_blocks]
};

// Per row r (position p = pos0 + r, current block cur = p / ratio): the
// selected blocks, ascending — block 0 (sink), block cur, and the
// budget − 2 best scored blocks of [1, cur) (score descending, lower index
// first on ties); every block when cur < budget. counts[r] = how many.
struct SelectArgs {
  DevicePtr scores;  // f32 [rows × ld]
  size_t rows = 0;
  size_t ld = 0;
  size_t pos0 = 0;
  size_t ratio = 0;
  size_t budget = 0;
  DevicePtr selected;  // u32 [rows × budget]
  DevicePtr counts;    // u32 [rows]
};

// Attention of each query row over exactly its selected positions: for row r
// at position p, the positions of its selected blocks clipped to ≤ p, in
// ascending order, for every query head (GQA: head j reads KV head j /
// (nq / num_kv_heads)). Per head the operations are those of
// kv::LayerKvCache::AttendGroup over the compacted rows: logit = Dot · scale
// (int8: (s_k · DotI8) · scale), math::Softmax over the compacted logits,
// out = Σ Axpy ascending from 0 — so when the set is every position the
// output is AttendGroup's, bit for bit.
struct AttendArgs {
  DevicePtr q;    // f32 [rows × nq × head_dim] (the layer's roped queries)
  DevicePtr out;  // f32 [rows × nq × head_dim], overwritten
  size_t rows = 0;
  size_t nq = 0;
  float scale = 0.0f;  // logit scale (the caller's 1/sqrt(head_dim))
  KvPool pool;
  BlockTable table;
  DevicePtr selected;  // u32 [rows × budget], ascending per row
  DevicePtr counts;    // u32 [rows]
  size_t budget = 0;   // leading dimension of `selected`
  size_t pos0 = 0;
  size_t ratio = 0;
};

struct BackendStats {
  size_t live_allocations = 0;   // Allocate()d and not yet Free()d
  size_t live_bytes = 0;         // their requested sizes
  size_t total_allocations = 0;  // since construction
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual const char* name() const = 0;
  // True when a DevicePtr is a host address (DevicePtr::AsHost is valid).
  virtual bool HostAddressable() const = 0;

  // ---- memory ----
  // A zero-filled buffer of `bytes` (> 0) bytes, 64-byte aligned.
  virtual absl::StatusOr<DevicePtr> Allocate(size_t bytes) = 0;
  // Frees a pointer Allocate returned; null is a no-op. An unknown pointer is
  // an error (never undefined behaviour on the CPU backend).
  virtual absl::Status Free(DevicePtr p) = 0;
  virtual absl::Status CopyToDevice(DevicePtr dst, const void* src, size_t bytes, Stream s) = 0;
  virtual absl::Status CopyToHost(void* dst, DevicePtr src, size_t bytes, Stream s) = 0;
  virtual absl::Status CopyOnDevice(DevicePtr dst, DevicePtr src, size_t bytes, Stream s) = 0;
  virtual absl::Status Synchronize(Stream s) = 0;
  virtual BackendStats stats() const = 0;

  // ---- kernels (see the argument structs) ----
  virtual absl::Status Project(const ProjectArgs& a, Stream s) = 0;
  // dst[i] = bf16(src[i]) (round to nearest even), i < n.
  virtual absl::Status StoreBf16(DevicePtr src_f32, DevicePtr dst_bf16, size_t n, Stream s) = 0;
  virtual absl::Status PoolBlocks(const PoolArgs& a, Stream s) = 0;
  virtual absl::Status ScoreBlocks(const ScoreArgs& a, Stream s) = 0;
  virtual absl::Status SelectTopK(const SelectArgs& a, Stream s) = 0;
  virtual absl::Status AttendSelected(const AttendArgs& a, Stream s) = 0;
};

}  // namespace cortiq::qsa
