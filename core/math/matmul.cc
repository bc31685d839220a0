// MatMul driver: picks decode GEMV or packed GEMM, packs x into thread-local
// scratch, and splits the rows of W over the pool. The arithmetic lives in the
// per-ISA tables (kernels.cc, kernels_avx2.cc, kernels_avx512.cc).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "core/math/kernels.h"
#include "core/math/kernels_internal.h"
#include "core/util/aligned_buffer.h"
#include "core/util/thread_pool.h"

namespace cortiq::math {
namespace {

// Below this many bytes of W, waking the pool costs more than it saves.
constexpr size_t kMinParallelWeightBytes = 64 * 1024;

// Grows `buf` to at least n floats; never shrinks, so steady state allocates
// nothing.
float* Reserve(util::AlignedBuffer<float>& buf, size_t n) {
  if (buf.size() < n) buf.Resize(n);
  return buf.data();
}

// bf16: x rounded to bf16 and packed for t.gemv_bf16 (AVX512_BF16 tables).
void Gemv(const internal::KernelTable& t, const float* x, size_t batch, const WeightView& w,
          float* y, util::ThreadPool* pool, bool bf16) {
  internal::GemvArgs args;
  args.x = nullptr;
  args.xb = nullptr;
  args.batch = batch;
  args.w = w.data;
  args.dtype = w.dtype;
  args.rows = w.rows;
  args.cols = w.cols;
  args.y = y;
  if (bf16) {
    thread_local util::AlignedBuffer<uint16_t> xbuf;
    const size_t n = t.gemv_bf16_pack_size(batch, w.cols);
    if (xbuf.size() < n) xbuf.Resize(n);
    t.gemv_bf16_pack_x(x, batch, w.cols, xbuf.data());
    args.xb = xbuf.data();
    args.x_stride = (w.cols + t.gemv_col_block - 1) / t.gemv_col_block * t.gemv_col_block;
  } else if (t.gemv_pack_x == nullptr) {
    args.x = x;
    args.x_stride = w.cols;
  } else {
    thread_local util::AlignedBuffer<float> xbuf;
    const size_t block = t.gemv_col_block;
    const size_t stride = (w.cols + block - 1) / block * block;
    float* xp = Reserve(xbuf, batch * stride);
    t.gemv_pack_x(x, batch, w.cols, t.gemv_bf16_even_odd && w.dtype == DType::kBF16, stride, xp);
    args.x = xp;
    args.x_stride = stride;
  }
  const auto kernel = bf16 ? t.gemv_bf16 : t.gemv;
  if (pool == nullptr || w.rows * RowBytes(w.dtype, w.cols) < kMinParallelWeightBytes) {
    kernel(args, 0, w.rows);
    return;
  }
  // Chunk edges on whole row tiles (the same rows go through the same tiles
  // whatever the thread count).
  pool->ParallelFor(
      w.rows, [&](size_t begin, size_t end) { kernel(args, begin, end); },
      bf16 ? t.gemv_bf16_row_block : 8);
}

// bf16 false: the f32 GEMM (x packed as f32 columns). bf16 true (bf16
// activations on bf16 W, the table has gemm_bf16): VDPBF16PS, x rounded to
// bf16 and packed as pairs of columns, one 32-bit word each.
void Gemm(const internal::KernelTable& t, const float* x, size_t batch, const WeightView& w,
          float* y, util::ThreadPool* pool, bool bf16) {
  const size_t mr = t.gemm_mr;
  const size_t panels = (batch + mr - 1) / mr;
  const size_t words = bf16 ? (w.cols + 1) / 2 : w.cols;  // per x row
  thread_local util::AlignedBuffer<float> xbuf;
  float* xp = Reserve(xbuf, panels * words * mr);

  internal::GemmArgs args;
  args.xp = xp;
  args.m = batch;
  args.w = w.data;
  args.dtype = w.dtype;
  args.n = w.rows;
  args.k = w.cols;
  args.y = y;

  auto pack = [&](size_t begin, size_t end) {
    if (bf16) {
      t.gemm_bf16_pack_x(x, batch, w.cols, reinterpret_cast<uint32_t*>(xp), begin, end);
    } else {
      t.gemm_pack_x(x, batch, w.cols, xp, begin, end);
    }
  };
  const auto gemm = bf16 ? t.gemm_bf16 : t.gemm;
  auto compute = [&](size_t begin, size_t end) {
    thread_local util::AlignedBuffer<float> scratch;
    gemm(args, begin, end, Reserve(scratch, t.gemm_kc * t.gemm_nc));
  };
  if (pool == nullptr) {
    pack(0, panels);
    compute(0, w.rows);
    return;
  }
  pool->ParallelFor(panels, pack);
  pool->ParallelFor(w.rows, compute, t.gemm_nr);
}

// Tile-order W on AMX (WeightView::amx_tiles): x rounded to bf16 rows, then
// the rows of W split over the pool in 32-row pairs of tiles.
void AmxTiled(const internal::KernelTable& t, const float* x, size_t batch, const WeightView& w,
              float* y, util::ThreadPool* pool) {
  using internal::kAmxTileCols, internal::kAmxTileRows;
  internal::AmxArgs args;
  args.kblocks = (w.cols + kAmxTileCols - 1) / kAmxTileCols;
  args.x_stride = args.kblocks * kAmxTileCols;
  args.m = batch;
  args.w = w.amx_tiles;
  args.rows = w.rows;
  args.y = y;
  const size_t mrows = (batch + kAmxTileRows - 1) / kAmxTileRows * kAmxTileRows;
  thread_local util::AlignedBuffer<uint16_t> xbuf;
  if (xbuf.size() < mrows * args.x_stride) xbuf.Resize(mrows * args.x_stride);
  uint16_t* xb = xbuf.data();  // (the workers must not name the thread_local)
  args.xb = xb;
  const bool parallel = pool != nullptr && w.rows * w.cols * 2 >= kMinParallelWeightBytes;
  if (parallel && batch >= 64) {
    pool->ParallelFor(
        batch, [&](size_t begin, size_t end) { t.amx_pack_x(x, batch, w.cols, xb, begin, end); },
        kAmxTileRows);
  } else {
    t.amx_pack_x(x, batch, w.cols, xb, 0, batch);
  }
  if (!parallel) {
    t.amx_matmul(args, 0, w.rows);
    return;
  }
  pool->ParallelFor(
      w.rows, [&](size_t begin, size_t end) { t.amx_matmul(args, begin, end); }, 2 * kAmxTileRows);
}

// Q8AmxMinBatch: CORTIQ_Q8_AMX_MIN_BATCH read once, else kQ8AmxMinBatch;
// 0 = not read yet (SetQ8AmxMinBatchForTesting stores over it).
std::atomic<size_t> g_q8_amx_min_batch{0};

// Whether table `t` runs a lane-order int8 MatMul of `batch` x rows on the
// AMX-INT8 tiles (Q8AmxUsed for the active table).
bool AmxTakes(const internal::KernelTable& t, size_t batch) {
  return t.q8_lanes_amx != nullptr && batch >= Q8AmxMinBatch() && Q8AmxVerified();
}

// int8 weights: x quantized per block (QuantizeActivationsQ8, in parallel
// for prefill-sized batches), then the rows of W split over the pool. On
// AMX-INT8 (batches from Q8AmxMinBatch) the quantized rows are padded to a
// whole A tile and the block corrections are formed here, once per call.
void Q8(const internal::KernelTable& t, const float* x, size_t batch, const WeightView& w, float* y,
        util::ThreadPool* pool) {
  const size_t blocks = w.cols / kQ8Block;
  const bool amx = w.q8_lanes != nullptr && AmxTakes(t, batch);
  const size_t qrows = amx ? (batch + 15) / 16 * 16 : batch;
  thread_local util::AlignedBuffer<int8_t> qbuf;
  thread_local util::AlignedBuffer<uint8_t> ubuf;
  thread_local util::AlignedBuffer<float> dbuf;
  thread_local util::AlignedBuffer<int32_t> cbuf;
  if (qbuf.size() < qrows * w.cols) qbuf.Resize(qrows * w.cols);
  if (!amx && ubuf.size() < batch * w.cols) ubuf.Resize(batch * w.cols);
  if (amx && cbuf.size() < batch * blocks) cbuf.Resize(batch * blocks);
  float* dx = Reserve(dbuf, batch * blocks);
  int8_t* qx = qbuf.data();  // (the workers must not name the thread_locals)
  uint8_t* ux = ubuf.data();
  int32_t* corr = amx ? cbuf.data() : nullptr;
  auto quantize = [&](size_t begin, size_t end) {
    // ux: the VPDPBUSD kernels' (the tiles take qx and corr)
    internal::QuantizeQ8Args(x + begin * w.cols, end - begin, w.cols, qx + begin * w.cols,
                             corr == nullptr ? ux + begin * w.cols : nullptr, dx + begin * blocks,
                             corr == nullptr ? nullptr : corr + begin * blocks);
  };
  const bool parallel =
      pool != nullptr && RowBytes(w.dtype, w.cols) * w.rows >= kMinParallelWeightBytes;
  if (parallel && batch >= 64) {
    pool->ParallelFor(batch, quantize, 16);
  } else {
    quantize(0, batch);
  }
  // The A tiles' rows past the batch: read, never stored (zeros, so no
  // uninitialised bytes reach the products).
  if (qrows > batch) std::memset(qx + batch * w.cols, 0, (qrows - batch) * w.cols);
  internal::Q8Args args;
  args.qx = qx;
  args.ux = ux;
  args.dx = dx;
  args.batch = batch;
  args.w = static_cast<const uint8_t*>(w.data);
  args.lanes = w.q8_lanes;
  args.rows = w.rows;
  args.cols = w.cols;
  args.y = y;
  args.corr = corr;
  // Lane order when the view has it (then `data` may be gone): natively from
  // AVX2 up, else the scalar reference of the same definition.
  void (*fn)(const internal::Q8Args&, size_t, size_t) = t.q8_matmul;
  size_t row_block = t.q8_row_block;
  if (w.q8_lanes != nullptr) {
    fn = amx                            ? t.q8_lanes_amx
         : t.q8_lanes_matmul != nullptr ? t.q8_lanes_matmul
                                        : internal::Q8LanesMatMulScalar;
    row_block = kQ8LaneRows;
  }
  if (!parallel) {
    fn(args, 0, w.rows);
    return;
  }
  pool->ParallelFor(
      w.rows, [&](size_t begin, size_t end) { fn(args, begin, end); }, row_block);
}

// nearbyint(v) as an int for |v| <= 127. glibc's nearbyintf is a call that
// saves and restores the floating-point environment (~15 ns, most of a
// decode step's quantization); CVTSS2SI rounds in the same current mode
// (MXCSR, nearest even by default) and touches nothing else.
int RoundToInt(float v) {
#if defined(__SSE2__)
  return _mm_cvtss_si32(_mm_set_ss(v));
#else
  return static_cast<int>(std::nearbyint(v));
#endif
}

#if defined(__SSE2__)
// One block with SSE2 (every x86-64 CPU): the same numbers as the scalar loop
// below. The finiteness test is separate from the max (MAXPS drops NaNs one
// way), the max is order-free once all are finite, and CVTPS2DQ rounds as
// CVTSS2SI does; |v·inv| <= 127 up to rounding, so the saturating packs never
// clip a value the scalar cast would keep.
bool QuantizeBlockSse2(const float* v, int8_t* q, float* d) {
  const __m128 abs_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
  const __m128 big = _mm_set1_ps(std::numeric_limits<float>::max());
  __m128 amax = _mm_setzero_ps();
  __m128 finite = _mm_castsi128_ps(_mm_set1_epi32(-1));
  for (size_t k = 0; k < kQ8Block / 4; ++k) {
    const __m128 a = _mm_and_ps(_mm_loadu_ps(v + 4 * k), abs_mask);
    finite = _mm_and_ps(finite, _mm_cmple_ps(a, big));  // false for NaN and inf
    amax = _mm_max_ps(amax, a);
  }
  if (_mm_movemask_ps(finite) != 0xf) return false;
  amax = _mm_max_ps(amax, _mm_shuffle_ps(amax, amax, _MM_SHUFFLE(1, 0, 3, 2)));
  amax = _mm_max_ps(amax, _mm_shuffle_ps(amax, amax, _MM_SHUFFLE(2, 3, 0, 1)));
  const float m = _mm_cvtss_f32(amax);
  const float inv_m = 127.0f / m;
  // Zero, or so small that 127/m overflows: the scalar loop's cases.
  if (m == 0.0f || !(inv_m <= std::numeric_limits<float>::max())) return false;
  *d = m / 127.0f;
  const __m128 inv = _mm_set1_ps(inv_m);
  for (size_t k = 0; k < kQ8Block / 16; ++k) {
    const float* s = v + 16 * k;
    const __m128i i0 = _mm_cvtps_epi32(_mm_mul_ps(_mm_loadu_ps(s), inv));
    const __m128i i1 = _mm_cvtps_epi32(_mm_mul_ps(_mm_loadu_ps(s + 4), inv));
    const __m128i i2 = _mm_cvtps_epi32(_mm_mul_ps(_mm_loadu_ps(s + 8), inv));
    const __m128i i3 = _mm_cvtps_epi32(_mm_mul_ps(_mm_loadu_ps(s + 12), inv));
    const __m128i packed = _mm_packs_epi16(_mm_packs_epi32(i0, i1), _mm_packs_epi32(i2, i3));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16 * k), packed);
  }
  return true;
}
#endif

}  // namespace

void QuantizeActivationsQ8(const float* x, size_t batch, size_t cols, int8_t* qx, float* dx) {
  for (size_t i = 0; i < batch * (cols / kQ8Block); ++i) {
    const float* v = x + i * kQ8Block;
    int8_t* q = qx + i * kQ8Block;
#if defined(__SSE2__)
    if (QuantizeBlockSse2(v, q, dx + i)) continue;  // else zero or not finite: below
#endif
    float amax = 0.0f;
    bool finite = true;
    for (size_t k = 0; k < kQ8Block; ++k) {
      const float a = std::fabs(v[k]);
      amax = a > amax ? a : amax;
      finite = finite && a <= std::numeric_limits<float>::max();  // false for NaN and inf
    }
    // A block below 127 / FLT_MAX (~3.7e-37: denormals) would scale by an
    // infinite inverse (inf -> int8 is undefined): it counts as zero, below
    // the resolution of any product.
    const float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
    if (!finite || !(inv != 0.0f && inv <= std::numeric_limits<float>::max())) {
      dx[i] = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
      std::memset(q, 0, kQ8Block);
      continue;
    }
    dx[i] = amax / 127.0f;
    for (size_t k = 0; k < kQ8Block; ++k) {
      q[k] = static_cast<int8_t>(RoundToInt(v[k] * inv));
    }
  }
}

namespace internal {

// Value i of lane `lane` in one block of a lane-order group (kernels.h).
static int8_t LaneValue(const uint8_t* blk, size_t lane, size_t i) {
  return static_cast<int8_t>(blk[i / 4 * 64 + lane * 4 + i % 4] ^ 0x80u);
}

// Lane order read back lane by lane: kernels.h's definition, as
// Q8MatMulScalar computes it from the rows.
void Q8LanesMatMulScalar(const Q8Args& a, size_t row_begin, size_t row_end) {
  const size_t blocks = a.cols / kQ8Block;
  for (size_t r = row_begin; r < row_end; ++r) {
    const uint8_t* group = a.lanes + r / kQ8LaneRows * blocks * kQ8LaneBlockBytes;
    const size_t lane = r % kQ8LaneRows;
    for (size_t b = 0; b < a.batch; ++b) {
      const int8_t* qx = a.qx + b * a.cols;
      const float* dx = a.dx + b * blocks;
      float acc = 0.0f;
      for (size_t j = 0; j < blocks; ++j) {
        const uint8_t* blk = group + j * kQ8LaneBlockBytes;
        const auto* scales = reinterpret_cast<const float*>(blk + kQ8LaneValueBytes);
        int32_t sum = 0;
        for (size_t i = 0; i < kQ8Block; ++i) {
          sum += int32_t{LaneValue(blk, lane, i)} * int32_t{qx[j * kQ8Block + i]};
        }
        const float s = scales[lane] * dx[j];
        acc = std::fma(static_cast<float>(sum), s, acc);
      }
      a.y[b * a.rows + r] = acc;
    }
  }
}

}  // namespace internal

size_t Q8LaneBytes(size_t rows, size_t cols) {
  return (rows + kQ8LaneRows - 1) / kQ8LaneRows * (cols / kQ8Block) * internal::kQ8LaneBlockBytes;
}

void PackQ8Lanes(const uint8_t* q8, size_t rows, size_t cols, uint8_t* out, size_t row_begin,
                 size_t row_end) {
  const size_t blocks = cols / kQ8Block, row_bytes = blocks * kQ8BlockBytes;
  for (size_t r0 = row_begin; r0 < row_end; r0 += kQ8LaneRows) {
    uint8_t* group = out + r0 / kQ8LaneRows * blocks * internal::kQ8LaneBlockBytes;
    for (size_t j = 0; j < blocks; ++j) {
      uint8_t* dst = group + j * internal::kQ8LaneBlockBytes;
      auto* scales = reinterpret_cast<float*>(dst + internal::kQ8LaneValueBytes);
      for (size_t l = 0; l < kQ8LaneRows; ++l) {
        const size_t r = r0 + l;
        const uint8_t* blk = r < rows ? q8 + r * row_bytes + j * kQ8BlockBytes : nullptr;
        for (size_t i = 0; i < kQ8Block; ++i) {
          dst[i / 4 * 64 + l * 4 + i % 4] = (blk != nullptr ? blk[2 + i] : 0) ^ 0x80u;
        }
        scales[l] = blk != nullptr ? F16ToF32(static_cast<uint16_t>(blk[0] | blk[1] << 8)) : 0.0f;
      }
    }
  }
}

void Q8LaneRowToF32(const uint8_t* lanes, size_t cols, size_t row, float* out) {
  const size_t blocks = cols / kQ8Block, lane = row % kQ8LaneRows;
  const uint8_t* group = lanes + row / kQ8LaneRows * blocks * internal::kQ8LaneBlockBytes;
  for (size_t j = 0; j < blocks; ++j) {
    const uint8_t* blk = group + j * internal::kQ8LaneBlockBytes;
    const float d = reinterpret_cast<const float*>(blk + internal::kQ8LaneValueBytes)[lane];
    for (size_t i = 0; i < kQ8Block; ++i) {
      out[j * kQ8Block + i] = d * static_cast<float>(internal::LaneValue(blk, lane, i));
    }
  }
}

bool Q8LanesUsed() { return internal::Active().q8_lanes_matmul != nullptr; }

size_t Q8AmxMinBatch() {
  size_t v = g_q8_amx_min_batch.load(std::memory_order_relaxed);
  if (v == 0) [[unlikely]] {
    v = kQ8AmxMinBatch;
    if (const char* env = std::getenv("CORTIQ_Q8_AMX_MIN_BATCH")) {
      char* end = nullptr;
      const unsigned long n = std::strtoul(env, &end, 10);
      if (end != env && *end == '\0' && n >= 1 && n <= 1u << 20) v = n;
    }
    g_q8_amx_min_batch.store(v, std::memory_order_relaxed);
  }
  return v;
}

size_t SetQ8AmxMinBatchForTesting(size_t n) {
  const size_t previous = Q8AmxMinBatch();
  g_q8_amx_min_batch.store(n == 0 ? 1 : n, std::memory_order_relaxed);
  return previous;
}

bool Q8AmxUsed(size_t batch) { return AmxTakes(internal::Active(), batch); }

bool Q8AmxVerified() {
  static const bool verified = [] {
    if (!IsaAvailable(Isa::kAmx)) return false;  // (its kernel would not even run)
    const auto fn = internal::TableFor(Isa::kAmx).q8_lanes_amx;
    return fn != nullptr && internal::Q8KernelAgreesWithDefinition(fn);
  }();
  return verified;
}

namespace internal {

void QuantizeQ8Args(const float* x, size_t batch, size_t cols, int8_t* qx, uint8_t* ux, float* dx,
                    int32_t* corr) {
  QuantizeActivationsQ8(x, batch, cols, qx, dx);
  if (ux != nullptr) {
    for (size_t i = 0; i < batch * cols; ++i) ux[i] = static_cast<uint8_t>(qx[i]) ^ 0x80u;
  }
  if (corr != nullptr) {
    for (size_t i = 0; i < batch * cols / kQ8Block; ++i) {
      int32_t sum = 0;
      for (size_t k = 0; k < kQ8Block; ++k) sum += qx[i * kQ8Block + k];
      corr[i] = -128 * sum;
    }
  }
}

bool Q8KernelAgreesWithDefinition(void (*fn)(const Q8Args&, size_t, size_t)) {
  // 40 W rows (two whole 16-row groups and a ragged one, a call each as the
  // pool would split them), 3 blocks, 17 x rows (a whole A tile and one row of
  // the next), every int8 weight value, scales of both signs.
  constexpr size_t kRows = 40, kCols = 96, kBatch = 17, kBlocks = kCols / kQ8Block;
  uint32_t state = 0x9e3779b9u;
  auto next = [&state] {
    state = state * 1664525u + 1013904223u;
    return state >> 8;
  };
  std::vector<uint8_t> rows(kRows * kBlocks * kQ8BlockBytes);
  for (size_t blk = 0; blk < kRows * kBlocks; ++blk) {
    uint8_t* b = rows.data() + blk * kQ8BlockBytes;
    const float scale = (1.0f + static_cast<float>(next() % 1000)) * 1e-5f;
    const uint16_t h = F32ToF16(blk % 3 == 0 ? -scale : scale);
    b[0] = static_cast<uint8_t>(h & 0xff);
    b[1] = static_cast<uint8_t>(h >> 8);
    for (size_t i = 0; i < kQ8Block; ++i) b[2 + i] = static_cast<uint8_t>(next());
  }
  util::AlignedBuffer<uint8_t> lanes(Q8LaneBytes(kRows, kCols));
  PackQ8Lanes(rows.data(), kRows, kCols, lanes.data(), 0, kRows);
  std::vector<float> x(kBatch * kCols);
  for (float& v : x) v = static_cast<float>(static_cast<int>(next() % 4001) - 2000) * 1e-3f;
  return Q8LanesKernelFirstMismatch(fn, lanes.data(), kRows, kCols, x.data(), kBatch, 16) ==
         kBatch * kRows;
}

size_t Q8LanesKernelFirstMismatch(void (*fn)(const Q8Args&, size_t, size_t), const uint8_t* lanes,
                                  size_t rows, size_t cols, const float* x, size_t batch,
                                  size_t split) {
  const size_t blocks = cols / kQ8Block;
  std::vector<int8_t> qx((batch + 15) / 16 * 16 * cols, 0);  // rows past the batch stay zero
  std::vector<uint8_t> ux(batch * cols);
  std::vector<float> dx(batch * blocks);
  std::vector<int32_t> corr(batch * blocks);
  QuantizeQ8Args(x, batch, cols, qx.data(), ux.data(), dx.data(), corr.data());
  Q8Args a;
  a.qx = qx.data();
  a.ux = ux.data();
  a.dx = dx.data();
  a.batch = batch;
  a.w = nullptr;  // (the lane kernels read only `lanes`)
  a.lanes = lanes;
  a.rows = rows;
  a.cols = cols;
  a.corr = corr.data();
  std::vector<float> want(batch * rows, -1.0f), got(batch * rows, -2.0f);
  a.y = want.data();
  Q8LanesMatMulScalar(a, 0, rows);
  a.y = got.data();
  for (size_t r0 = 0; r0 < rows; r0 += split) fn(a, r0, std::min(rows, r0 + split));
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) return i;
  }
  return got.size();
}

}  // namespace internal

size_t AmxTileElements(size_t rows, size_t cols) {
  using internal::kAmxTileCols, internal::kAmxTileElems, internal::kAmxTileRows;
  return (rows + kAmxTileRows - 1) / kAmxTileRows * ((cols + kAmxTileCols - 1) / kAmxTileCols) *
         kAmxTileElems;
}

void PackAmxTiles(const uint16_t* w, size_t rows, size_t cols, uint16_t* out, size_t row_begin,
                  size_t row_end) {
  using internal::kAmxTileCols, internal::kAmxTileElems, internal::kAmxTileRows;
  const size_t kblocks = (cols + kAmxTileCols - 1) / kAmxTileCols;
  for (size_t r0 = row_begin; r0 < row_end; r0 += kAmxTileRows) {
    uint16_t* block = out + r0 / kAmxTileRows * kblocks * kAmxTileElems;
    const size_t nr = rows - r0 < kAmxTileRows ? rows - r0 : kAmxTileRows;
    // Tile row p of block kb: the column pair (c, c + 1), c = 32 kb + 2p, of
    // each of the 16 rows, written contiguously; zero past rows and columns.
    for (size_t kb = 0; kb < kblocks; ++kb) {
      for (size_t p = 0; p < kAmxTileCols / 2; ++p) {
        const size_t c = kb * kAmxTileCols + 2 * p;
        uint16_t* dst = block + kb * kAmxTileElems + p * 2 * kAmxTileRows;
        for (size_t n = 0; n < kAmxTileRows; ++n) {
          const size_t at = (r0 + n) * cols + c;  // read only when it exists
          dst[2 * n] = n < nr && c < cols ? w[at] : 0;
          dst[2 * n + 1] = n < nr && c + 1 < cols ? w[at + 1] : 0;
        }
      }
    }
  }
}

size_t ChunkGemmMinRows(const WeightView& w) {
  const internal::KernelTable& t = internal::Active();
  const bool dpbf16 = w.bf16_activations && w.dtype == DType::kBF16 &&
                      !(w.amx_tiles != nullptr && t.amx_matmul != nullptr) &&
                      t.gemm_bf16 != nullptr && internal::GemmBf16Preferred();
  return dpbf16 ? kChunkGemmMinRowsBf16 : kMatMulGemmMinBatch;
}

bool AmxTilesUsed() { return internal::Active().amx_matmul != nullptr; }

namespace {

// Whether MatMul's rows are bit-equal at every batch size on table `t`.
bool BatchInvariant(const internal::KernelTable& t, const WeightView& w) {
  return w.dtype == DType::kQ8_0 || t.gemm == nullptr ||
         (w.bf16_activations && w.dtype == DType::kBF16 && w.amx_tiles != nullptr &&
          t.amx_matmul != nullptr);
}

// MatMul on f32 / bf16 / f16 weights (not int8) through the decode path
// (gemm false) or the GEMM (gemm true, the table has one).
void MatMulPath(const internal::KernelTable& t, const float* x, size_t batch, const WeightView& w,
                float* y, util::ThreadPool* pool, bool gemm) {
  if (w.bf16_activations && w.dtype == DType::kBF16) {
    if (w.amx_tiles != nullptr && t.amx_matmul != nullptr) {
      return AmxTiled(t, x, batch, w, y, pool);
    }
    if (!gemm && t.gemv_bf16 != nullptr) return Gemv(t, x, batch, w, y, pool, /*bf16=*/true);
    if (gemm && t.gemm_bf16 != nullptr && internal::GemmBf16Preferred()) {
      return Gemm(t, x, batch, w, y, pool, /*bf16=*/true);
    }
    // Every other path computes on the same rounded inputs in f32.
    thread_local util::AlignedBuffer<uint16_t> bits;
    thread_local util::AlignedBuffer<float> rounded;
    const size_t n = batch * w.cols;
    if (bits.size() < n) bits.Resize(n);
    ConvertFromF32(x, DType::kBF16, n, bits.data());
    ConvertToF32(bits.data(), DType::kBF16, n, Reserve(rounded, n));
    x = rounded.data();
  }
  if (gemm) {
    Gemm(t, x, batch, w, y, pool, /*bf16=*/false);
  } else {
    Gemv(t, x, batch, w, y, pool, /*bf16=*/false);
  }
}

}  // namespace

void MatMul(const float* x, size_t batch, const WeightView& w, float* y, util::ThreadPool* pool) {
  if (batch == 0 || w.rows == 0) return;
  if (w.cols == 0) {
    std::memset(y, 0, batch * w.rows * sizeof(float));
    return;
  }
  const internal::KernelTable& t = internal::Active();
  if (w.dtype == DType::kQ8_0) return Q8(t, x, batch, w, y, pool);
  MatMulPath(t, x, batch, w, y, pool, t.gemm != nullptr && batch >= kMatMulGemmMinBatch);
}

void MatMulSplit(const float* x, size_t batch, size_t gemv_rows, const WeightView& w, float* y,
                 util::ThreadPool* pool) {
  const internal::KernelTable& t = internal::Active();
  gemv_rows = std::min(gemv_rows, batch);
  if (batch == 0 || w.rows == 0 || w.cols == 0 || BatchInvariant(t, w)) {
    return MatMul(x, batch, w, y, pool);
  }
  if (gemv_rows > 0) MatMulPath(t, x, gemv_rows, w, y, pool, /*gemm=*/false);
  if (gemv_rows < batch) {
    MatMulPath(t, x + gemv_rows * w.cols, batch - gemv_rows, w, y + gemv_rows * w.rows, pool,
               /*gemm=*/true);
  }
}

}  // namespace cortiq::math
