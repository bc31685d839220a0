// MatMul driver: picks decode GEMV or packed GEMM, packs x into thread-local
// scratch, and splits the rows of W over the pool. The arithmetic lives in the
// per-ISA tables (kernels.cc, kernels_avx2.cc, kernels_avx512.cc).
#include <cstring>

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
  if (pool == nullptr || w.rows * w.cols * DTypeSize(w.dtype) < kMinParallelWeightBytes) {
    kernel(args, 0, w.rows);
    return;
  }
  // Chunk edges on whole row tiles (the same rows go through the same tiles
  // whatever the thread count).
  pool->ParallelFor(
      w.rows, [&](size_t begin, size_t end) { kernel(args, begin, end); },
      bf16 ? t.gemv_bf16_row_block : 8);
}

void Gemm(const internal::KernelTable& t, const float* x, size_t batch, const WeightView& w,
          float* y, util::ThreadPool* pool) {
  const size_t mr = t.gemm_mr;
  const size_t panels = (batch + mr - 1) / mr;
  thread_local util::AlignedBuffer<float> xbuf;
  float* xp = Reserve(xbuf, panels * w.cols * mr);

  internal::GemmArgs args;
  args.xp = xp;
  args.m = batch;
  args.w = w.data;
  args.dtype = w.dtype;
  args.n = w.rows;
  args.k = w.cols;
  args.y = y;

  auto pack = [&](size_t begin, size_t end) { t.gemm_pack_x(x, batch, w.cols, xp, begin, end); };
  auto compute = [&](size_t begin, size_t end) {
    thread_local util::AlignedBuffer<float> scratch;
    t.gemm(args, begin, end, Reserve(scratch, t.gemm_kc * t.gemm_nc));
  };
  if (pool == nullptr) {
    pack(0, panels);
    compute(0, w.rows);
    return;
  }
  pool->ParallelFor(panels, pack);
  pool->ParallelFor(w.rows, compute, t.gemm_nr);
}

}  // namespace

void MatMul(const float* x, size_t batch, const WeightView& w, float* y, util::ThreadPool* pool) {
  if (batch == 0 || w.rows == 0) return;
  if (w.cols == 0) {
    std::memset(y, 0, batch * w.rows * sizeof(float));
    return;
  }
  const internal::KernelTable& t = internal::Active();
  const bool gemm = t.gemm != nullptr && batch >= kMatMulGemmMinBatch;
  if (w.bf16_activations && w.dtype == DType::kBF16) {
    if (!gemm && t.gemv_bf16 != nullptr) return Gemv(t, x, batch, w, y, pool, /*bf16=*/true);
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
    Gemm(t, x, batch, w, y, pool);
  } else {
    Gemv(t, x, batch, w, y, pool, /*bf16=*/false);
  }
}

}  // namespace cortiq::math
