// The frame shared by the AVX-512 int8-weight MatMul kernels (q8_avx512.cc:
// VPMADDWD; q8_avx512vnni.cc: VPDPBUSD), both compiled with the AVX-512
// flags. Internal linkage only (static), as kernels_avx512_inl.h.
//
// Layout of the work: lanes are W rows. A group of 16 W rows is read in
// place (GGUF Q8_0 blocks, unaligned, 34 bytes apart) a k-chunk of blocks at
// a time, transposed in registers so that lane l of a vector holds 4 bytes
// of row l's block, and stored in the kernel's own form in a stack buffer
// (~18 KiB, L1) with the 16 widened block scales. Every x row then runs
// against the chunk with x broadcast from its row (no packing of x): the
// int32 block sum I_j of all 16 outputs of that x row lands in one vector,
// with no horizontal reduction, and
//   acc = fma(float(I_j), dw_j * dx_j, acc)
// runs in block order per lane: bit for bit Q8MatMulScalar (kernels.h's
// definition), whatever the batch, tile or row split. Accumulators go to y
// between k-chunks and come back for the next (same operations, same order).
//
// Costs: W is read once per group of x rows (Q8XGroup: 8192 / blocks rows,
// so one group, W streamed once, for batches up to 85 at 3072 columns and
// 256 at 1024); the transpose (~40 shuffles per 16 row-blocks) is shared by
// every x row of the group. Stack: ~64 KiB (Q8XGroup) + the chunk buffer.
// Thread-compatible: touches only its arguments and its own stack.
#pragma once

#include "core/math/kernels_avx512_inl.h"

namespace cortiq::math::internal {

// W rows per group: one per zmm lane.
static constexpr size_t kQ8Lanes = 16;
// x rows per register tile (accumulators + block sums stay in registers).
static constexpr int kQ8Tile = 8;

static CORTIQ_INLINE int32_t Q8LoadI32(const void* p) {
  int32_t v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

// The x side of one group of x rows [g0, g0 + rows), block-major ([block][x
// row - g0]) so that a tile finds its rows' values of block j at fixed
// offsets from one pointer (8 row-major streams would not fit the
// general-purpose registers beside the x rows themselves). 64 KiB, on the
// stack of the calling thread.
static constexpr size_t kQ8GroupCap = 8192;  // (x row, block) pairs
struct Q8XGroup {
  alignas(64) float dx[kQ8GroupCap];      // activation block scales
  alignas(64) int32_t corr[kQ8GroupCap];  // -128 * sum of the block's qx (kernels that use it)
  size_t g0;
  size_t rows;
};

// Fills `xg` for x rows [g0, g1): dx always, corr when `corr` (VPSADBW on
// ux = qx + 128: -128 * sum qx = 128 * (32 * 128 - sum ux)).
static void Q8PrepareGroup(const Q8Args& a, size_t g0, size_t g1, bool corr, Q8XGroup* xg) {
  const size_t blocks = a.cols / kQ8Block, rows = g1 - g0;
  xg->g0 = g0;
  xg->rows = rows;
  const __m256i zero = _mm256_setzero_si256();
  for (size_t b = g0; b < g1; ++b) {
    for (size_t j = 0; j < blocks; ++j) xg->dx[j * rows + b - g0] = a.dx[b * blocks + j];
    if (!corr) continue;
    const uint8_t* ux = a.ux + b * a.cols;
    for (size_t j = 0; j < blocks; ++j) {
      const __m256i s = _mm256_sad_epu8(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ux + j * kQ8Block)), zero);
      const __m128i h = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
      const int32_t sum = _mm_cvtsi128_si32(h) + _mm_extract_epi32(h, 2);
      xg->corr[j * rows + b - g0] = 128 * (32 * 128 - sum);
    }
  }
}

// One 16-row group of W over one k-chunk of blocks, as the tile kernels
// read it: the kernel's packed vectors (K::kVecs per block) and the f32
// block scales of the 16 rows (lane l: row l; rows past `mask` repeat the
// group's last row). Block jj is K::kVecs + 1 vectors at w + jj *
// (K::kVecs + 1): its packed vectors, then its scales (the lane order's
// form, which the stack chunk of Q8Run takes too).
struct Q8Chunk {
  const __m512i* w;  // block 0 of the chunk
  size_t c0;         // first block of the chunk
  size_t nb;         // blocks in the chunk
  size_t r0;         // first W row of the group
  __mmask16 mask;    // valid rows of the group
  bool first;        // c0 == 0: accumulators start at zero (else from y)
  // Lane order only: the W bytes ahead that the chunk's first x tile pulls
  // into L2, pf_step of them per block (nullptr: none).
  const char* pf = nullptr;
  size_t pf_step = 0;
};

// t[g], lane l: bytes 4g..4g+3 of the 32 int8 at base + off[l] (the block of
// row l). 8 256-bit loads into both halves of 8 zmm, then the in-lane 4x4
// dword transposes and one 128-bit shuffle per output. Rows are paired in
// the zmm halves as (h, h + 4), h = 0,1,2,3,8,9,10,11, which is the order
// that leaves lane l = row l after the last shuffle.
static CORTIQ_INLINE void Q8Transpose16(const uint8_t* base, const size_t* off, __m512i t[8]) {
  __m512i z[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    const int h = i < 4 ? i : i + 4;
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + off[h]));
    const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + off[h + 4]));
    z[i] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  }
  __m512i a[8];
#pragma GCC unroll 4
  for (int k = 0; k < 8; k += 2) {
    a[k] = _mm512_unpacklo_epi32(z[k], z[k + 1]);
    a[k + 1] = _mm512_unpackhi_epi32(z[k], z[k + 1]);
  }
  // u[c] (c < 4), 128-bit lane q: column c (q even) or c + 4 (q odd) of the
  // first four pairs; u[c + 4] the same for the last four.
  __m512i u[8];
#pragma GCC unroll 2
  for (int s = 0; s < 8; s += 4) {
    u[s / 4 * 4 + 0] = _mm512_unpacklo_epi64(a[s], a[s + 2]);
    u[s / 4 * 4 + 1] = _mm512_unpackhi_epi64(a[s], a[s + 2]);
    u[s / 4 * 4 + 2] = _mm512_unpacklo_epi64(a[s + 1], a[s + 3]);
    u[s / 4 * 4 + 3] = _mm512_unpackhi_epi64(a[s + 1], a[s + 3]);
  }
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    t[c] = _mm512_shuffle_i32x4(u[c], u[c + 4], 0x88);
    t[c + 4] = _mm512_shuffle_i32x4(u[c], u[c + 4], 0xDD);
  }
}

// Packs blocks [c0, c0 + nb) of the 16 rows at w + off[l] into `pack`,
// block jj at pack + jj * (K::kVecs + 1): K::PackBlock's vectors, then the
// 16 f32 scales. Prefetches the same blocks of the next group (rows past
// the end of W: prefetch is a no-op).
template <class K>
static CORTIQ_INLINE void Q8PackChunk(const uint8_t* w, const size_t* off, __m512i offv,
                                      size_t row_bytes, size_t c0, size_t nb, __m512i* pack) {
  for (size_t jj = 0; jj < nb; ++jj) {
    const uint8_t* blk = w + (c0 + jj) * kQ8BlockBytes;
    // The next group is one contiguous run of 16 rows: its bytes in order,
    // 16 blocks' worth per block here, so it is all requested by the time
    // this group's chunk ends.
    const char* ahead = reinterpret_cast<const char*>(w + kQ8Lanes * row_bytes) +
                        (c0 + jj) * kQ8Lanes * kQ8BlockBytes;
#pragma GCC unroll 9
    for (size_t p = 0; p < kQ8Lanes * kQ8BlockBytes; p += 64) _mm_prefetch(ahead + p, _MM_HINT_T0);
    __m512i t[8];
    Q8Transpose16(blk + 2, off, t);
    __m512i* out = pack + jj * (K::kVecs + 1);
    K::PackBlock(t, out);
    // The f16 scale is the low half of the dword at each block's start.
    const __m512i s = _mm512_i32gather_epi32(offv, blk, 1);
    _mm512_store_ps(reinterpret_cast<float*>(out + K::kVecs),
                    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(s)));
  }
}

// y[b][r0 + l] for x rows [b0, b0 + BT) over one chunk: accumulators from
// zero or y, K::Block adds block j's term to each, stored back (masked).
template <class K, int BT>
static void Q8Tile(const Q8Args& a, const Q8XGroup& xg, const Q8Chunk& ch, size_t b0) {
  __m512 acc[BT];
#pragma GCC unroll 8
  for (int b = 0; b < BT; ++b) {
    acc[b] = ch.first ? _mm512_setzero_ps()
                      : _mm512_maskz_loadu_ps(ch.mask, a.y + (b0 + b) * a.rows + ch.r0);
  }
  const int8_t* x[BT];
#pragma GCC unroll 8
  for (int b = 0; b < BT; ++b) x[b] = a.qx + (b0 + b) * a.cols + ch.c0 * kQ8Block;
  const size_t at = ch.c0 * xg.rows + b0 - xg.g0;
  const float* dx = xg.dx + at;
  const int32_t* corr = xg.corr + at;
  const char* pf = b0 == xg.g0 ? ch.pf : nullptr;
  for (size_t jj = 0; jj < ch.nb; ++jj) {
    if (pf != nullptr) {
      for (size_t k = 0; k < ch.pf_step; k += 64) _mm_prefetch(pf + k, _MM_HINT_T1);
      pf += ch.pf_step;
    }
    const __m512i* wb = ch.w + jj * (K::kVecs + 1);
    __m512i sum[BT];
    K::template Block<BT>(x, corr, wb, sum);
    const __m512 dw = _mm512_load_ps(reinterpret_cast<const float*>(wb + K::kVecs));
#pragma GCC unroll 8
    for (int b = 0; b < BT; ++b) {
      const __m512 s = _mm512_mul_ps(dw, _mm512_set1_ps(dx[b]));
      acc[b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[b]), s, acc[b]);
      x[b] += kQ8Block;
    }
    dx += xg.rows;
    corr += xg.rows;
  }
#pragma GCC unroll 8
  for (int b = 0; b < BT; ++b) {
    _mm512_mask_storeu_ps(a.y + (b0 + b) * a.rows + ch.r0, ch.mask, acc[b]);
  }
}

// x rows [b0, b1) over one chunk, in tiles of kQ8Tile and one of the rest.
template <class K>
static void Q8Tiles(const Q8Args& a, const Q8XGroup& xs, const Q8Chunk& ch, size_t b0, size_t b1) {
  size_t b = b0;
  for (; b + kQ8Tile <= b1; b += kQ8Tile) Q8Tile<K, kQ8Tile>(a, xs, ch, b);
  using TileFn = void (*)(const Q8Args&, const Q8XGroup&, const Q8Chunk&, size_t);
  static constexpr TileFn kRest[kQ8Tile] = {nullptr,      Q8Tile<K, 1>, Q8Tile<K, 2>, Q8Tile<K, 3>,
                                            Q8Tile<K, 4>, Q8Tile<K, 5>, Q8Tile<K, 6>, Q8Tile<K, 7>};
  if (b < b1) kRest[b1 - b](a, xs, ch, b);
}

// The whole kernel: groups of x rows (as many as Q8XGroup holds), 16-row
// W groups within them, k-chunks of K::kChunk blocks within those, x tiles
// within a chunk.
//
// K provides: kVecs (packed vectors per block), kChunk (blocks per chunk),
// kCorr (whether Block reads Q8XGroup::corr), PackBlock(t, out), and
// Block<BT>(x, corr, w, sum): the exact int32 block sums, for the 16 rows
// packed at w, of the x blocks at x[0 .. BT) (corr[0 .. BT) theirs).
template <class K>
static void Q8Run(const Q8Args& a, size_t row_begin, size_t row_end) {
  const size_t blocks = a.cols / kQ8Block;
  const size_t row_bytes = blocks * kQ8BlockBytes;
  // Beyond these the group would be empty or the gather's int32 offsets
  // overflow: the reference computes the same bits.
  if (blocks > kQ8GroupCap || (kQ8Lanes - 1) * row_bytes > 0x7fffffffu) {
    return Q8MatMulScalar(a, row_begin, row_end);
  }
  const size_t group = kQ8GroupCap / blocks;
  alignas(64) __m512i pack[K::kChunk * (K::kVecs + 1)];
  Q8XGroup xs;
  for (size_t g0 = 0; g0 < a.batch; g0 += group) {
    const size_t g1 = a.batch - g0 < group ? a.batch : g0 + group;
    Q8PrepareGroup(a, g0, g1, K::kCorr, &xs);
    for (size_t r0 = row_begin; r0 < row_end; r0 += kQ8Lanes) {
      const size_t nrows = MinSz(kQ8Lanes, row_end - r0);
      // Rows past the range read the group's last row (never past W).
      size_t off[kQ8Lanes];
      alignas(64) int32_t off32[kQ8Lanes];
      for (size_t l = 0; l < kQ8Lanes; ++l) {
        off[l] = MinSz(l, nrows - 1) * row_bytes;
        off32[l] = static_cast<int32_t>(off[l]);
      }
      const __m512i offv = _mm512_load_si512(off32);
      const uint8_t* w = a.w + r0 * row_bytes;
      Q8Chunk ch;
      ch.w = pack;
      ch.r0 = r0;
      ch.mask = Mask16(nrows);
      for (size_t c0 = 0; c0 < blocks; c0 += K::kChunk) {
        ch.c0 = c0;
        ch.nb = MinSz(K::kChunk, blocks - c0);
        ch.first = c0 == 0;
        Q8PackChunk<K>(w, off, offv, row_bytes, c0, ch.nb, pack);
        Q8Tiles<K>(a, xs, ch, g0, g1);
      }
    }
  }
}

}  // namespace cortiq::math::internal
