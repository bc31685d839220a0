// core/math: the numeric kernels every layer of the engine uses.
//
// Each function dispatches at run time (first call reads CPUID) to the best
// implementation this CPU supports: AVX-512 with AMX tiles, AVX-512 with BF16
// dot products, AVX-512 with VNNI, AVX-512, AVX2+FMA, or portable scalar.
// CORTIQ_ISA=scalar|avx2|avxvnni|avx512|avx512vnni|avx512bf16|amx in the environment caps the
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

// kAvxVnni is kAvx2 plus AVX-VNNI (the VEX VPDPBUSD on ymm: Intel client
// cores, the E-core Xeons without AVX-512): every kernel is the AVX2 one
// except MatMul on int8 weights. kAvx512Vnni is kAvx512 plus AVX512_VNNI
// (VPDPBUSD: int8 weights), kAvx512Bf16 that plus AVX512_BF16 (VDPBF16PS),
// kAmx that plus AMX-BF16 and AMX-INT8 (tiles, granted by the OS): every
// kernel is the AVX-512 one except MatMul on int8 weights (from kAvx512Vnni)
// and with bf16 activations on bf16 weights. The order is the caps' order;
// a CPU with AVX-512 need not have AVX-VNNI (Zen 4, Ice Lake): capped at
// kAvxVnni it runs kAvx2 (IsaAvailable).
enum class Isa {
  kScalar = 0,
  kAvx2 = 1,
  kAvxVnni = 2,
  kAvx512 = 3,
  kAvx512Vnni = 4,
  kAvx512Bf16 = 5,
  kAmx = 6
};
// The ISA the dispatcher selected for this process.
Isa ActiveIsa();
// The best ISA this CPU supports (ignores CORTIQ_ISA).
Isa DetectedIsa();
const char* IsaName(Isa isa);
// Whether this CPU (and OS) can run `isa`'s table: isa <= DetectedIsa(), and
// for kAvxVnni the AVX-VNNI bit itself.
bool IsaAvailable(Isa isa);
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
// kQ8_0: int8 weights in GGUF's Q8_0 blocks (below); the others are element
// types. DTypeSize is the element size (0 for kQ8_0: use RowBytes).
enum class DType : uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2, kQ8_0 = 3 };
size_t DTypeSize(DType t);
const char* DTypeName(DType t);
// Bytes of one row of `cols` elements (kQ8_0: cols / 32 blocks of 34 bytes;
// cols must be a multiple of 32).
size_t RowBytes(DType t, size_t cols);

// ---- int8 weights: GGUF Q8_0 blocks ----
// A kQ8_0 row of `cols` values (a multiple of 32) is cols / 32 blocks of 34
// bytes, exactly ggml's block_q8_0: a little-endian f16 scale d, then 32
// int8 values q; value i of the block is d · q[i]. No alignment. So a GGUF
// Q8_0 tensor is read in place, and a row is quantized here bit-for-bit as
// llama.cpp quantizes it (quantize_row_q8_0_ref): amax = max |x|, d = amax /
// 127, id = d ? 1 / d : 0, q = roundf(x · id) (ties away from zero), and d
// stored rounded to f16 (nearest even). A block holding NaN or inf gets a NaN
// scale and q = 0.
inline constexpr size_t kQ8Block = 32;
inline constexpr size_t kQ8BlockBytes = 34;
// Quantizes x[0..n) (n a multiple of 32) into n / 32 blocks at out.
void QuantizeQ8_0(const float* x, size_t n, void* out);
// out[i] = d · q[i] for n values (n a multiple of 32) of Q8_0 blocks at src.
void DequantizeQ8_0(const void* src, size_t n, float* out);

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
//
// kQ8_0 weights (cols a multiple of 32): MatMul quantizes each row of x per
// block of 32 to int8 (QuantizeActivationsQ8) and computes every output from
// exact integer block sums, accumulated in block order in f32:
//   acc = 0; for each block j: acc = fma(float(I_j), dw_j · dx_j, acc)
// where I_j = sum of qw·qx over the block (an exact int32), dw_j the weight
// block's scale (f16 widened), dx_j the activation block's scale, and
// dw_j · dx_j one f32 product. Every ISA computes exactly this, so on int8
// weights MatMul is bit-identical across ISAs, batch sizes (decode and
// prefill alike), row splits and thread counts.
struct WeightView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  size_t rows = 0;
  size_t cols = 0;
  bool bf16_activations = false;
  const uint16_t* amx_tiles = nullptr;
  // kQ8_0 only (optional): the same matrix in lane order (PackQ8Lanes),
  // owned by whoever made the view. When set, MatMul reads it and never
  // `data` (which may then be null): every ISA computes the same bits from
  // it (a VPDPBUSD stream on AVX512_VNNI, VPMADDUBSW on AVX2 and AVX-512
  // without VNNI, a scalar loop elsewhere).
  const uint8_t* q8_lanes = nullptr;
};

// Lane order of a Q8_0 matrix [rows][cols / 32 blocks], 64-byte aligned:
// groups of 16 rows (group g: rows 16g .. 16g + 15) of blocks · 576 bytes
// each, block j at 576 j: 8 vectors of 64 bytes (vector v, lane l: bytes
// 4v .. 4v + 3 of row 16g + l's block j, each XOR 0x80: unsigned w + 128),
// then 16 f32 (lane l: row 16g + l's scale, widened from f16). Each block's
// scales follow its values, so a group is one forward stream: with the
// scales at the group's end instead (two interleaved streams), Zen 5's
// prefetchers left a batch-1 product at ~70 % of memory speed
// (docs/PERFORMANCE.md). Rows past `rows`: zero values, zero scale. Q8LaneBytes is the size of the
// whole; PackQ8Lanes writes the groups of rows [row_begin, row_end) (row_begin a multiple of 16;
// row_end a multiple of 16 or `rows`) from Q8_0 rows `q8` (34-byte blocks).
inline constexpr size_t kQ8LaneRows = 16;
size_t Q8LaneBytes(size_t rows, size_t cols);
void PackQ8Lanes(const uint8_t* q8, size_t rows, size_t cols, uint8_t* out, size_t row_begin,
                 size_t row_end);
// Row `row` of a lane-order matrix dequantized to f32 (scale · value, as
// DequantizeQ8_0): an embedding lookup on a tied lm_head's copy.
void Q8LaneRowToF32(const uint8_t* lanes, size_t cols, size_t row, float* out);
// True when the active ISA multiplies lane-order int8 weights natively
// (every x86-64 tier from AVX2 up): model loaders pack them only then.
bool Q8LanesUsed();
// On the kAmx ISA, lane-order int8 weights run on AMX-INT8 tiles (TDPBSUD)
// for batches of at least Q8AmxMinBatch() x rows, the VPDPBUSD kernel below
// that (the same bits either way). Default kQ8AmxMinBatch: from 8 x rows the
// VPDPBUSD kernel is bound by its integer products on Intel cores (batch 8
// at ~2x a batch-1 call on Emerald Rapids), below it W's stream bounds both.
// Not yet tuned on AMX hardware (docs/PERFORMANCE.md);
// CORTIQ_Q8_AMX_MIN_BATCH=N in the environment overrides it.
// Q8AmxUsed(batch): whether a MatMul of that batch runs on the tiles.
inline constexpr size_t kQ8AmxMinBatch = 8;
size_t Q8AmxMinBatch();
bool Q8AmxUsed(size_t batch);
// On an AMX-INT8 CPU: whether the tile kernel passed its one-time check
// against the definition (run at first use: a small product compared bit for
// bit with the scalar reference). If it did not, int8 weights stay on
// VPDPBUSD (Q8AmxUsed is false) and the server logs a warning at start.
// False where the CPU or OS has no AMX-INT8.
bool Q8AmxVerified();
// Tests and benchmarks only: sets the threshold (>= 1) for the process;
// returns the previous one. Not synchronised with running kernels.
size_t SetQ8AmxMinBatchForTesting(size_t n);

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

// Whether prefill (the GEMM) with bf16 activations on bf16 weights runs the
// VDPBF16PS GEMM: the active ISA has it, MatMul is not on AMX tiles, and this
// CPU prefers it. Otherwise x is rounded to bf16 and the f32 FMA GEMM runs on
// the same rounded inputs (the sums differ in order only). Which is faster depends on the core,
// not the ISA: VDPBF16PS does twice an FMA's multiply-adds where the FMA units
// are 256 bits wide (AMD Zen 4, 2 threads: 378 against 149 GFLOP/s), but on
// Intel cores with two 512-bit FMA ports it is the slower (Emerald Rapids:
// ~140 against ~200). Default: true on AMD (the CPUID vendor), false
// elsewhere; CORTIQ_BF16_GEMM=dpbf16|fma in the environment overrides it.
bool GemmBf16Used();
// Tests and benchmarks only: sets that preference for the process (where the
// ISA has the VDPBF16PS GEMM); returns the previous preference. Not
// synchronised with kernels running on other threads.
bool SetGemmBf16ForTesting(bool use);

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

// The shortest prefill chunk an engine step runs on the GEMM
// (Transformer::Step; shorter chunks go with the decode rows through the
// decode kernels, as MatMulSplit's first rows). The GEMM's rows do not
// depend on the other rows, so any threshold keeps a chunk's bits whatever
// shares its step; this one is where the GEMM of that many rows alone
// costs no more than the decode kernels, measured per path
// (docs/PERFORMANCE.md): kChunkGemmMinRowsBf16 where bf16 activations on
// bf16 W take the VDPBF16PS GEMM, whose packing is cheap, and
// kMatMulGemmMinBatch on every other path. The step's chunks then share one
// GEMM of all their rows (a burst of short prompts: 3-4 chunks of 32).
inline constexpr size_t kChunkGemmMinRowsBf16 = 32;
size_t ChunkGemmMinRows(const WeightView& w);

// MatMul of a mixed batch (an engine step: decode rows and prefill chunks in
// one call): rows [0, gemv_rows) are each bit-equal to a batch-1 MatMul of
// that row (the decode path), rows [gemv_rows, batch) bit-equal to what
// MatMul gives them in any batch of at least kMatMulGemmMinBatch rows (the
// GEMM, whose rows do not depend on the other rows). Where MatMul is
// batch-invariant at every size (int8 weights, AMX tile order, the scalar
// ISA) this is one MatMul of the whole batch, W read once; on f32 / bf16 /
// f16 weights with a GEMM it is one decode pass over the first rows and one
// GEMM over the rest (W read twice when both are non-empty).
void MatMulSplit(const float* x, size_t batch, size_t gemv_rows, const WeightView& w, float* y,
                 util::ThreadPool* pool);

// Activation quantization for int8 weights: each row of x [batch][cols] (cols
// a multiple of 32) per block of 32: amax = max |x|; dx = amax / 127 and
// qx = nearbyint(x · (127 / amax)) (ties to even; in [-127, 127]); dx = 0 and
// qx = 0 for an all-zero block; a block holding NaN or inf gets dx = NaN and
// qx = 0 (its outputs become NaN). qx [batch][cols], dx [batch][cols / 32].
// The same portable code on every ISA.
void QuantizeActivationsQ8(const float* x, size_t batch, size_t cols, int8_t* qx, float* dx);

// Conversions.
float Bf16ToF32(uint16_t h);
// x rounded to the nearest bf16 value (even on ties; NaN stays NaN), as f32.
float RoundToBf16(float x);
uint16_t F32ToBf16(float f);  // round to nearest even
float F16ToF32(uint16_t h);
uint16_t F32ToF16(float f);  // round to nearest even
// kQ8_0: DequantizeQ8_0 (n a multiple of 32, src at a block boundary).
void ConvertToF32(const void* src, DType dtype, size_t n, float* dst);
// dst[i] = src[i] in dtype (round to nearest even; NaN stays NaN); kQ8_0:
// QuantizeQ8_0.
void ConvertFromF32(const float* src, DType dtype, size_t n, void* dst);

}  // namespace cortiq::math
