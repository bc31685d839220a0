// core/math: the numeric kernels every layer of the engine uses.
//
// Each function dispatches at run time (first call reads CPUID) to the best
// implementation this CPU supports: AVX-512 with AMX tiles, AVX-512 with BF16
// dot products, AVX-512, AVX2+FMA, or portable scalar.
// CORTIQ_ISA=scalar|avx2|avx512|avx512bf16|amx in the environment caps the
// choice (tests use it to check every path against the float64 reference).
//
// All functions are thread-compatible: they touch only their arguments.
// Pointers need no particular alignment. Lengths are element counts.
//
// Determinism: for a given ISA every kernel is a pure function of its input
// values: the order of floating-point operations depends on the lengths only,
// never on pointer alignment or thread count, so two code paths that call the
// same kernel on equal inputs get bit-equal results. (MatMul: see there for
// how the batch size enters.)
#pragma once

#include <cstddef>
#include <cstdint>

namespace cortiq::util {
class ThreadPool;
}

namespace cortiq::math {

// kAvx512Bf16 is kAvx512 plus AVX512_BF16 (VDPBF16PS), kAmx that plus AMX-BF16
// (TDPBF16PS tiles, granted by the OS): every kernel is the AVX-512 one except
// decode MatMul with bf16 activations on bf16 weights (WeightView).
enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3, kAmx = 4 };
// The ISA the dispatcher selected for this process.
Isa ActiveIsa();
// The best ISA this CPU supports (ignores CORTIQ_ISA).
Isa DetectedIsa();
const char* IsaName(Isa isa);
// Tests and benchmarks only: switches every kernel to min(isa, DetectedIsa())
// and returns the ISA now active. Not synchronised with kernels running on
// other threads (they may finish on the old ISA); results of a kernel are
// deterministic only for a fixed ISA.
Isa SetIsaForTesting(Isa isa);

// ---- Level 1 (f32) ----
// sum_i a[i] * b[i], f32 accumulation.
float Dot(const float* a, const float* b, size_t n);
// y[i] += alpha * x[i]
void Axpy(float alpha, const float* x, float* y, size_t n);
// x[i] *= alpha
void Scale(float* x, float alpha, size_t n);

// ---- Attention rows (one dispatch for many rows; bit-for-bit the loops) ----
// out[j·out_stride + t] = Dot(q + j·q_stride, rows + t·row_stride, d) for
// t < n, j < nq: the scores of nq query heads against n cached rows, one
// pass over the rows. Each value is bit-identical to that Dot call.
void DotRows(const float* q, size_t nq, size_t q_stride, const float* rows, size_t n,
             size_t row_stride, size_t d, float* out, size_t out_stride);
// For t = 0 .. n-1 (in order), for j < nq: Axpy(p[j·p_stride + t],
// rows + t·row_stride, out + j·out_stride, d). Bit-identical to those calls.
void AxpyRows(const float* p, size_t nq, size_t p_stride, const float* rows, size_t n,
              size_t row_stride, size_t d, float* out, size_t out_stride);

// ---- int8 rows (KV cache) ----
// sum_i a[i] * float(b[i]), f32 accumulation (caller applies the row scale).
float DotI8(const float* a, const int8_t* b, size_t n);
// y[i] += alpha * float(x[i])
void AxpyI8(float alpha, const int8_t* x, float* y, size_t n);
// Row-batched forms, one dispatch for a whole pass (bit-for-bit the loops):
// out[j·out_stride + t] = DotI8(q + j·q_stride, rows + t·row_stride, d).
void DotRowsI8(const float* q, size_t nq, size_t q_stride, const int8_t* rows, size_t n,
               size_t row_stride, size_t d, float* out, size_t out_stride);
// For t = 0 .. n-1 (in order), for j < nq: AxpyI8(p[j·p_stride + t] ·
// row_scale[t], rows + t·row_stride, out + j·out_stride, d).
void AxpyRowsI8(const float* p, size_t nq, size_t p_stride, const float* row_scale,
                const int8_t* rows, size_t n, size_t row_stride, size_t d, float* out,
                size_t out_stride);
// Symmetric per-row quantisation: scale = max|x| / 127, q[i] = round(x[i] / scale)
// (round half to even, so q is in [-127, 127]). Returns the scale (0 for an
// all-zero row, with q all zero).
float QuantizeRowI8(const float* x, int8_t* q, size_t n);

// ---- Normalisation / activation ----
// out[i] = x[i] / sqrt(mean(x^2) + eps) * weight[i]; out may alias x.
void RmsNorm(const float* x, const float* weight, float eps, size_t n, float* out);
// In-place numerically stable softmax over x[0..n). -inf entries (masked
// scores) get exactly 0; a row that is all -inf becomes uniform 1/n.
void Softmax(float* x, size_t n);
// out[i] = silu(gate[i]) * up[i]; out may alias gate or up.
void SwiGlu(const float* gate, const float* up, size_t n, float* out);

// ---- RoPE (rotate-half / NeoX layout, as Qwen and Llama use) ----
// x is [head_dim]; pairs (i, i + head_dim/2) rotate by angle pos * inv_freq[i].
// cos/sin are [head_dim / 2] tables for this position.
void RopeRotateHalf(float* x, size_t head_dim, const float* cos, const float* sin);

// ---- Matrix products ----
enum class DType : uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2 };
size_t DTypeSize(DType t);
const char* DTypeName(DType t);

// A weight matrix in the nn.Linear layout: [rows = out_features][cols =
// in_features], row-major, dense (row stride == cols). Not owned (typically a
// view into a memory-mapped checkpoint).
//
// bf16_activations (meaningful for kBF16 weights only; ignored otherwise):
// MatMul first rounds x to bf16 (round to nearest even) and then computes the
// exact products with f32 accumulation, as bf16 inference does elsewhere
// (PyTorch autocast, llama.cpp). With AMX the decode path then runs on
// TDPBF16PS tiles at ~6x a core's FMA rate, with AVX512_BF16 on VDPBF16PS (no
// widening of W): that is what makes batched decode weight-bandwidth-bound
// instead of compute-bound. Every ISA computes on the same rounded inputs
// (sums may differ in order; the bf16 instructions read subnormals as zero).
//
// amx_tiles (optional, bf16 weights with bf16_activations): the same matrix in
// tile order (PackAmxTiles), owned by whoever made the view. On the kAmx ISA
// MatMul then runs every batch, decode and prefill alike, on TDPBF16PS tiles
// streaming W sequentially, and each output value is bit-identical whatever
// the batch or chunk it is computed in. Other ISAs ignore it and read `data`.
struct WeightView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  size_t rows = 0;
  size_t cols = 0;
  bool bf16_activations = false;
  const uint16_t* amx_tiles = nullptr;
};

// Tile order of a bf16 matrix [rows][cols] for AMX: blocks of 16 rows x 32
// columns, one contiguous KiB each, block (i, j) at tile index
// i · ceil(cols / 32) + j; within a block, element (pair p, row n, e) at
// p·32 + n·2 + e holds W[16i + n][32j + 2p + e] (zero past rows / cols).
// AmxTileElements is the element count of the whole (ceil(rows/16) ·
// ceil(cols/32) · 512). PackAmxTiles writes the blocks of rows
// [row_begin, row_end) (row_begin a multiple of 16; row_end a multiple of 16
// or `rows`), so callers can split the work over threads.
size_t AmxTileElements(size_t rows, size_t cols);
void PackAmxTiles(const uint16_t* w, size_t rows, size_t cols, uint16_t* out, size_t row_begin,
                  size_t row_end);
// True when MatMul would use WeightView::amx_tiles (the kAmx ISA is active):
// model loaders pack their bf16 weights only then.
bool AmxTilesUsed();

// y[b][r] = sum_c x[b][c] * W[r][c] for b < batch: x is [batch][W.cols], y is
// [batch][W.rows]. Reads W once for the whole batch (decode of B sequences);
// for large batches (prefill) it runs a blocked GEMM. Parallel over rows of W
// on `pool` (nullptr = single-threaded). x and y must not overlap.
//
// Cost: decode (batch < kMatMulGemmMinBatch) streams W once, converting
// bf16/f16 in registers, at close to memory bandwidth for small batches; the
// packed GEMM (AVX2/AVX-512 only) runs at ~75% of FMA peak per core. Scratch
// lives in thread-local buffers that grow to the largest call and are then
// reused (no allocation per call after warm-up), so concurrent calls from
// different threads are safe.
//
// Batch invariance: below kMatMulGemmMinBatch (and at any batch on the scalar
// ISA), row y[b] is bit-equal to what a batch-1 call on x[b] returns, so a
// sequence decodes the same tokens alone or in a continuous batch. The GEMM
// sums in another order: its rows differ from decode in the last bits. On
// AMX tile-order weights (WeightView::amx_tiles) there is no GEMM: every
// batch size gives each row bit-equal to a batch-1 call.
void MatMul(const float* x, size_t batch, const WeightView& w, float* y, util::ThreadPool* pool);
// Batches of at least this many rows take the packed GEMM path (measured
// crossover on AVX-512: below it, packing W costs more than the GEMM saves).
inline constexpr size_t kMatMulGemmMinBatch = 64;

// Conversions.
float Bf16ToF32(uint16_t h);
// x rounded to the nearest bf16 value (even on ties; NaN stays NaN), as f32.
float RoundToBf16(float x);
uint16_t F32ToBf16(float f);  // round to nearest even
float F16ToF32(uint16_t h);
uint16_t F32ToF16(float f);  // round to nearest even
void ConvertToF32(const void* src, DType dtype, size_t n, float* dst);
// dst[i] = src[i] in dtype (round to nearest even; NaN stays NaN).
void ConvertFromF32(const float* src, DType dtype, size_t n, void* dst);

}  // namespace cortiq::math
