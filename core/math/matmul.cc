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

void Gemv(const internal::KernelTable& t, const float* x, size_t batch, const WeightView& w,
          float* y, util::ThreadPool* pool) {
  internal::GemvArgs args;
  args.batch = batch;
  args.w = w.data;
  args.dtype = w.dtype;
  args.rows = w.rows;
  args.cols = w.cols;
  args.y = y;
  if (t.gemv_pack_x == nullptr) {
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
  if (pool == nullptr || w.rows * w.cols * DTypeSize(w.dtype) < kMinParallelWeightBytes) {
    t.gemv(args, 0, w.rows);
    return;
  }
  // Chunk edges on multiples of 8 rows keep every thread on whole row tiles.
  pool->ParallelFor(
      w.rows, [&](size_t begin, size_t end) { t.gemv(args, begin, end); }, 8);
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
  if (t.gemm != nullptr && batch >= kMatMulGemmMinBatch) {
    Gemm(t, x, batch, w, y, pool);
  } else {
    Gemv(t, x, batch, w, y, pool);
  }
}

}  // namespace cortiq::math
