// core/math/kernels_internal.h: the per-ISA dispatch table behind kernels.h.
// Internal to core/math (and its tests); callers use kernels.h.
//
// One KernelTable per ISA, each a constant with static storage: the scalar one
// in kernels.cc, the AVX2 one in kernels_avx2.cc, the AVX-512 one in
// kernels_avx512.cc. kernels.cc picks one at first use (CPUID, capped by
// CORTIQ_ISA) and every public function forwards through it.
//
// Why this header holds only declarations, plain aggregates and constants: it
// is included by translation units compiled with -mavx2 / -mavx512f. An inline
// function (or an implicit constructor) defined here and emitted out of line in
// such a unit is a weak symbol the linker may pick for the whole program, and
// the AVX-512 copy would then run on a CPU without AVX-512. So: no inline code
// here, and the ISA files use no std:: templates (containers, algorithms).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/math/kernels.h"

namespace cortiq::math::internal {

// Decode-path matrix product over a range of W rows. x has been packed by the
// table's gemv_pack_x (zero-padded to x_stride, possibly permuted: see there).
struct GemvArgs {
  const float* x;      // [batch][x_stride], packed (gemv)
  const uint16_t* xb;  // [batch][x_stride] bf16, packed by gemv_bf16_pack_x (gemv_bf16)
  size_t x_stride;     // elements between batch rows of x (a multiple of gemv_col_block)
  size_t batch;
  const void* w;  // [rows][cols] of dtype, row-major, unaligned
  DType dtype;
  size_t rows;
  size_t cols;
  float* y;  // [batch][rows]
};

// Prefill-path matrix product (blocked GEMM) over a range of W rows (N).
struct GemmArgs {
  const float* xp;  // x packed by gemm_pack_x: [ceil(m / mr)][k][mr], zero-padded
  size_t m;         // batch rows of x and y
  const void* w;    // [n][k] of dtype
  DType dtype;
  size_t n;  // rows of W = columns of y
  size_t k;  // cols of W = cols of x
  float* y;  // [m][n]
};

// Matrix product on int8 weights (DType::kQ8_0, kernels.h) over a range of W
// rows: y[b][r] for r in [row_begin, row_end), every b < batch, computed
// exactly as kernels.h defines it (exact int32 block sums, block-order f32
// fma), so every ISA's result is bit-identical to the scalar one.
struct Q8Args {
  const int8_t* qx;   // [batch][cols] activations, QuantizeActivationsQ8
  const uint8_t* ux;  // [batch][cols] the same plus 128 (uint8: qx ^ 0x80), for u8·s8 products
                      // (not formed for q8_lanes_amx, which reads qx and corr)
  const float* dx;    // [batch][cols / 32] activation block scales
  size_t batch;
  const uint8_t* w;  // [rows][cols / 32] Q8_0 blocks of 34 bytes, unaligned
  // The same in lane order (PackQ8Lanes), for q8_lanes_matmul; else null.
  const uint8_t* lanes = nullptr;
  size_t rows;
  size_t cols;  // a multiple of 32
  float* y;     // [batch][rows]
  // q8_lanes_amx only: -128 · (sum of qx over block j) at [b][j], and qx
  // readable (any values) up to batch rounded up to 16 rows.
  const int32_t* corr = nullptr;
};

// Geometry of the AMX tile order (kernels.h PackAmxTiles): blocks of 16 rows
// x 32 bf16 columns, 512 elements (1 KiB) each.
inline constexpr size_t kAmxTileRows = 16;
inline constexpr size_t kAmxTileCols = 32;
inline constexpr size_t kAmxTileElems = kAmxTileRows * kAmxTileCols;

// Matrix product on tile-order bf16 weights (PackAmxTiles), kAmx only.
struct AmxArgs {
  // x in bf16, [round16(m)][x_stride], row-major. Rows >= m may hold anything
  // (an earlier call's data): row i of y depends on row i of x only, and no
  // row >= m is stored; AMX raises no floating-point exceptions.
  const uint16_t* xb;
  size_t x_stride;    // elements per row of xb: cols rounded up to 32
  size_t m;           // rows of x and y
  const uint16_t* w;  // tile-order W: [ceil(rows / 16)][kblocks] tiles of 512 bf16
  size_t kblocks;     // ceil(cols / 32)
  size_t rows;        // rows of W = columns of y
  float* y;           // [m][rows]
};

struct KernelTable {
  Isa isa;

  // Level 1 and friends: exactly the kernels.h contracts.
  float (*dot)(const float* a, const float* b, size_t n);
  void (*axpy)(float alpha, const float* x, float* y, size_t n);
  // DotRows / AxpyRows of kernels.h (kernels_rows_inl.h builds them from dot/axpy).
  void (*dot_rows)(const float* q, size_t nq, size_t q_stride, const float* rows, size_t n,
                   size_t row_stride, size_t d, float* out, size_t out_stride);
  void (*axpy_rows)(const float* p, size_t nq, size_t p_stride, const float* rows, size_t n,
                    size_t row_stride, size_t d, float* out, size_t out_stride);
  void (*scale)(float* x, float alpha, size_t n);
  float (*dot_i8)(const float* a, const int8_t* b, size_t n);
  void (*axpy_i8)(float alpha, const int8_t* x, float* y, size_t n);
  // DotRowsI8 / AxpyRowsI8 of kernels.h.
  void (*dot_rows_i8)(const float* q, size_t nq, size_t q_stride, const int8_t* rows, size_t n,
                      size_t row_stride, size_t d, float* out, size_t out_stride);
  void (*axpy_rows_i8)(const float* p, size_t nq, size_t p_stride, const float* row_scale,
                       const int8_t* rows, size_t n, size_t row_stride, size_t d, float* out,
                       size_t out_stride);
  float (*quantize_row_i8)(const float* x, int8_t* q, size_t n);
  void (*rms_norm)(const float* x, const float* weight, float eps, size_t n, float* out);
  void (*softmax)(float* x, size_t n);
  void (*swiglu)(const float* gate, const float* up, size_t n, float* out);
  void (*rope_rotate_half)(float* x, size_t head_dim, const float* cos, const float* sin);
  void (*convert_to_f32)(const void* src, DType dtype, size_t n, float* dst);
  void (*convert_from_f32)(const float* src, DType dtype, size_t n, void* dst);

  // ---- Decode (GEMV over a small batch) ----
  // x rows are packed into blocks of gemv_col_block floats, zero-padded at the
  // end. For bf16 weights with gemv_bf16_even_odd, each block holds first the
  // even-indexed then the odd-indexed elements of its columns, so the kernel
  // widens bf16 pairs with one shift and one AND instead of a shuffle.
  size_t gemv_col_block;
  bool gemv_bf16_even_odd;
  // Packs x [batch][cols] into out [batch][stride] (stride: cols rounded up to
  // gemv_col_block), with the even/odd split when `even_odd`. nullptr (scalar
  // table): the kernel reads x as is, stride = cols.
  void (*gemv_pack_x)(const float* x, size_t batch, size_t cols, bool even_odd, size_t stride,
                      float* out);
  void (*gemv)(const GemvArgs& a, size_t row_begin, size_t row_end);
  // bf16 activations on bf16 weights (WeightView::bf16_activations): the
  // AVX512_BF16 and AMX tables only; nullptr elsewhere, where MatMul rounds x
  // to bf16 values and runs gemv / gemm on them. gemv_bf16_pack_x rounds x
  // [batch][cols] to bf16 into the kernel's own layout (gemv_bf16_pack_size
  // elements); gemv_bf16 reads it as GemvArgs::xb (x_stride: cols rounded
  // up to gemv_col_block). Row ranges handed to gemv_bf16 start on multiples
  // of gemv_bf16_row_block.
  size_t (*gemv_bf16_pack_size)(size_t batch, size_t cols);
  void (*gemv_bf16_pack_x)(const float* x, size_t batch, size_t cols, uint16_t* out);
  size_t gemv_bf16_row_block;
  void (*gemv_bf16)(const GemvArgs& a, size_t row_begin, size_t row_end);

  // ---- Tile-order bf16 weights (WeightView::amx_tiles): kAmx only, every
  // batch (decode and prefill alike); nullptr elsewhere ----
  // Rounds x [m][cols] to bf16 (nearest even) into rows [row_begin,
  // min(row_end, m)) of out ([round16(m)][round32(cols)], zero past cols).
  void (*amx_pack_x)(const float* x, size_t m, size_t cols, uint16_t* out, size_t row_begin,
                     size_t row_end);
  // y[:, row_begin:row_end] = x . W^T; row_begin is a multiple of 16.
  void (*amx_matmul)(const AmxArgs& a, size_t row_begin, size_t row_end);

  // ---- int8 weights (DType::kQ8_0), every batch ----
  // Row ranges handed to q8_matmul start on multiples of q8_row_block.
  size_t q8_row_block;
  void (*q8_matmul)(const Q8Args& a, size_t row_begin, size_t row_end);
  // The same product from Q8Args::lanes (row ranges start on multiples of
  // 16); nullptr: MatMul runs Q8LanesMatMulScalar.
  void (*q8_lanes_matmul)(const Q8Args& a, size_t row_begin, size_t row_end);
  // The same again on AMX-INT8 tiles (kAmx only, else nullptr), for batches
  // of at least Q8AmxMinBatch() x rows; it reads Q8Args::corr.
  void (*q8_lanes_amx)(const Q8Args& a, size_t row_begin, size_t row_end);

  // ---- Prefill (packed GEMM); gemm == nullptr: use gemv for every batch ----
  size_t gemm_mr;  // x rows per micro-tile (broadcast operand)
  size_t gemm_nr;  // W rows per micro-tile (vector operand); row_begin multiple of it
  size_t gemm_kc;  // k-block
  size_t gemm_nc;  // W rows packed at once into the per-thread scratch
  // Packs x panels [panel_begin, panel_end) into xp (layout in GemmArgs).
  void (*gemm_pack_x)(const float* x, size_t m, size_t k, float* xp, size_t panel_begin,
                      size_t panel_end);
  // y[:, row_begin:row_end] = x . W[row_begin:row_end]^T. scratch holds at
  // least gemm_kc * gemm_nc floats, 64-byte aligned, owned by the calling thread.
  void (*gemm)(const GemmArgs& a, size_t row_begin, size_t row_end, float* scratch);
  // bf16 activations on bf16 weights (WeightView::bf16_activations), prefill:
  // the AVX512_BF16 and AMX tables only (VDPBF16PS); nullptr elsewhere, where
  // MatMul rounds x to bf16 values and runs gemm. gemm_bf16_pack_x rounds x
  // to bf16 and packs it as pairs of columns, one 32-bit word per (row, pair):
  // [ceil(m / mr)][ceil(k / 2)][mr], zero-padded; gemm_bf16 reads that as
  // GemmArgs::xp (reinterpreted) with the same blocking and scratch as gemm.
  void (*gemm_bf16_pack_x)(const float* x, size_t m, size_t k, uint32_t* xp, size_t panel_begin,
                           size_t panel_end);
  void (*gemm_bf16)(const GemmArgs& a, size_t row_begin, size_t row_end, float* scratch);

  // ---- Benchmark helpers (bench_util.h) ----
  // Reads [p, p + bytes) with full-width loads; returns a value that depends
  // on every byte so the loads cannot be optimised away. bytes % 256 == 0.
  uint64_t (*read_stream)(const void* p, size_t bytes);
  // Runs `iters` iterations of a register-only FMA loop; returns the flops done.
  double (*fma_loop)(uint64_t iters);
};

const KernelTable& ScalarTable();
// Int8-weight kernels (Q8Args), one per ISA file: q8_avx2.cc, q8_avx512.cc
// (AVX-512 without VNNI), q8_avx512vnni.cc (VPDPBUSD; the kAvx512Vnni,
// kAvx512Bf16 and kAmx tables). Q8MatMulScalar is the reference (kernels.cc).
void Q8MatMulScalar(const Q8Args& a, size_t row_begin, size_t row_end);
// q8_avx2.cc; the kAvx2 table's, with q8_row_block kQ8Avx2RowBlock.
void Q8MatMulAvx2(const Q8Args& a, size_t row_begin, size_t row_end);
inline constexpr size_t kQ8Avx2RowBlock = 8;
// AVX-512 (VPMADDWD) and AVX512_VNNI (VPDPBUSD): 16 W rows per zmm, so their
// tables hand them row ranges starting on multiples of 16 (q8_row_block).
// Below kQ8FrameMinBatch x rows both hand the call to Q8MatMulAvx2 (the
// same numbers, bit for bit): their in-register transpose of W is shared by
// the x rows, and with fewer than 4 it costs more than W's stream (2 threads
// of a Zen 4, cortiq-bench-math Q8 at 3072 x 1024: VNNI 243 / 227 / 237 us
// at batch 1 / 2 / 4, AVX2 127 / 149 / 231 us; at batch 8 VNNI 264, AVX2 350).
inline constexpr size_t kQ8FrameMinBatch = 4;
void Q8MatMulAvx512(const Q8Args& a, size_t row_begin, size_t row_end);
void Q8MatMulVnni(const Q8Args& a, size_t row_begin, size_t row_end);
// Lane-order W (Q8Args::lanes): the reference (matmul.cc), VPDPBUSD
// (q8_avx512vnni.cc; the kAvx512Vnni, kAvx512Bf16 and kAmx tables') and
// VPMADDUBSW (q8_avx2.cc; the kAvx2 and kAvx512 tables').
void Q8LanesMatMulScalar(const Q8Args& a, size_t row_begin, size_t row_end);
void Q8LanesMatMulVnni(const Q8Args& a, size_t row_begin, size_t row_end);
void Q8LanesMatMulAvx2(const Q8Args& a, size_t row_begin, size_t row_end);
// q8_avxvnni.cc: the AVX2 lane kernel on VPDPBUSD (the kAvxVnni table's).
void Q8LanesMatMulAvxVnni(const Q8Args& a, size_t row_begin, size_t row_end);
// q8_amx.cc: lane order on TDPBSUD tiles (the kAmx table's q8_lanes_amx).
void Q8LanesMatMulAmx(const Q8Args& a, size_t row_begin, size_t row_end);
// The x side of Q8Args for `batch` rows of x [batch][cols], as MatMul forms
// it (matmul.cc): qx and dx (QuantizeActivationsQ8), then ux and corr where
// not null.
void QuantizeQ8Args(const float* x, size_t batch, size_t cols, int8_t* qx, uint8_t* ux, float* dx,
                    int32_t* corr);
// Whether `fn` (a q8_lanes_amx-style kernel: reads qx, dx, corr, lanes)
// gives Q8LanesMatMulScalar's bits on a fixed 40 x 96 product at 17 x rows,
// in calls of 16 rows (matmul.cc; Q8AmxVerified runs it on the AMX kernel).
bool Q8KernelAgreesWithDefinition(void (*fn)(const Q8Args&, size_t, size_t));
// The comparison behind it, on any lane-order W [rows][cols] and x
// [batch][cols] (prepared as MatMul prepares them for the tiles), `fn` called
// on `split` rows at a time (a multiple of 16): the index into y [batch][rows]
// of the first output whose bits differ from Q8LanesMatMulScalar's, or
// batch * rows when none does.
size_t Q8LanesKernelFirstMismatch(void (*fn)(const Q8Args&, size_t, size_t), const uint8_t* lanes,
                                  size_t rows, size_t cols, const float* x, size_t batch,
                                  size_t split);
// Bytes of one block of a 16-row lane-order group (kernels.h): its values
// (kQ8LaneValueBytes), then its 16 f32 scales. A group is `blocks` of these.
inline constexpr size_t kQ8LaneValueBytes = 16 * 32;
inline constexpr size_t kQ8LaneBlockBytes = kQ8LaneValueBytes + 16 * 4;
// Defined in kernels_avx2.cc / kernels_avx512.cc / kernels_avx512bf16.cc
// (always built on x86-64); the dispatcher treats nullptr as "not available".
const KernelTable* Avx2Table();
const KernelTable* AvxVnniTable();
// Whether this CPU prefers the VDPBF16PS prefill GEMM where a table has one
// (kernels.h GemmBf16Used; CORTIQ_BF16_GEMM, SetGemmBf16ForTesting).
bool GemmBf16Preferred();
const KernelTable* Avx512Table();
const KernelTable* Avx512VnniTable();
const KernelTable* Avx512Bf16Table();
const KernelTable* AmxTable();
// The kAvx512Bf16 table's decode kernels (kernels_avx512bf16.cc).
size_t GemvBf16PackedSize(size_t batch, size_t cols);
void GemvBf16PackX(const float* x, size_t batch, size_t cols, uint16_t* out);
void GemvBf16(const GemvArgs& a, size_t row_begin, size_t row_end);
// Its prefill GEMM (the gemm_bf16 fields; the same kMr / kNr / kKc / kNc
// blocking as the f32 GEMM, kKc counting pairs of columns).
void GemmBf16PackX(const float* x, size_t m, size_t k, uint32_t* xp, size_t panel_begin,
                   size_t panel_end);
void GemmBf16(const GemmArgs& a, size_t row_begin, size_t row_end, float* scratch);
// The kAmx table's (kernels_amx.cc). EnableAmxForProcess asks the OS for the
// tile state (Linux arch_prctl); false: AMX is unusable in this process.
bool EnableAmxForProcess();
// The tile shapes the AMX kernels use (kernels_amx.cc documents them).
// AmxConfigure loads one into this thread's tile configuration unless it is
// already there; every AMX kernel calls it before its first tile instruction.
enum class AmxTileShape : uint8_t { kNone, kBf16, kInt8 };
void AmxConfigure(AmxTileShape shape);
size_t GemvAmxPackedSize(size_t batch, size_t cols);
void GemvAmxPackX(const float* x, size_t batch, size_t cols, uint16_t* out);
void GemvAmx(const GemvArgs& a, size_t row_begin, size_t row_end);
void AmxPackX(const float* x, size_t m, size_t cols, uint16_t* out, size_t row_begin,
              size_t row_end);
void AmxTiledMatMul(const AmxArgs& a, size_t row_begin, size_t row_end);

// The table for an ISA (falls back to the next lower compiled one).
const KernelTable& TableFor(Isa isa);
// The table in use (ActiveIsa()).
const KernelTable& Active();

// Shared polynomial for exp (Cephes expf, |rel err| < 2 ulp on the reduced
// range), so every ISA computes Softmax / SwiGlu the same way.
inline constexpr float kExpLog2e = 1.44269504088896341f;
inline constexpr float kExpLn2Hi = 0.693359375f;
inline constexpr float kExpLn2Lo = -2.12194440e-4f;
inline constexpr float kExpP0 = 1.9875691500e-4f;
inline constexpr float kExpP1 = 1.3981999507e-3f;
inline constexpr float kExpP2 = 8.3334519073e-3f;
inline constexpr float kExpP3 = 4.1665795894e-2f;
inline constexpr float kExpP4 = 1.6666665459e-1f;
inline constexpr float kExpP5 = 5.0000001201e-1f;
// Below kExpMin = ln(FLT_MIN) the result is exactly 0: no subnormal outputs,
// which cost a microcode assist per operation on Intel cores and happen a lot
// in softmax over masked / far-below-max scores. Above kExpMax the result
// overflows to +inf; the scale 2^n is applied as two factors so n up to 129
// never needs an out-of-range exponent field.
inline constexpr float kExpMin = -87.33654475f;
inline constexpr float kExpMax = 89.0f;
// Adding then subtracting 1.5 * 2^23 rounds to nearest-even on every ISA.
inline constexpr float kRoundMagic = 12582912.0f;

}  // namespace cortiq::math::internal
