// The AMX-INT8 kernel (core/math/q8_amx.cc) compiled over a software model
// of its tile instructions, so that its schedule (block pairs on two C
// banks, one or two A tiles, ragged x and W edges, the x chunks, the row
// split) runs and is checked on any CPU with AVX-512, not only on an AMX
// Xeon. The model follows Intel's pseudo-code of TILELOADD, TILESTORED,
// TILEZERO and TDPBSUD (dst.row[m].dword[n] += sum over k < a.colsb / 4 of
// the 4 products SignExtend(a.row[m].byte[4k+i]) * ZeroExtend(b.row[k].
// byte[4n+i])) and enforces the shape rules whose breach is #UD on hardware
// (a.colsb / 4 == b.rows, b.colsb == dst.colsb, a.rows == dst.rows).
// On AMX hardware math_q8_test runs the real instructions on the same cases.
//
// Compiled with the AVX-512 flags only (tests/CMakeLists.txt), reached only
// after the test has checked the CPU; no std:: templates (kernels_internal.h).
#include <cstdlib>
#include <cstring>

#include "core/math/kernels_avx512_inl.h"
#include "core/math/kernels_internal.h"

namespace cortiq::math::testing::amx_model {
namespace {

struct Tile {
  uint8_t bytes[16][64];
  int rows;
  int colsb;
};
thread_local Tile g_tiles[8];

void Load(int t, const void* base, size_t stride) {
  for (int r = 0; r < g_tiles[t].rows; ++r) {
    std::memcpy(g_tiles[t].bytes[r], static_cast<const char*>(base) + r * stride, g_tiles[t].colsb);
  }
}

void Zero(int t) { std::memset(g_tiles[t].bytes, 0, sizeof g_tiles[t].bytes); }

void Store(int t, void* base, size_t stride) {
  for (int r = 0; r < g_tiles[t].rows; ++r) {
    std::memcpy(static_cast<char*>(base) + r * stride, g_tiles[t].bytes[r], g_tiles[t].colsb);
  }
}

void DpBsUd(int c, int a, int b) {
  const Tile &ta = g_tiles[a], &tb = g_tiles[b];
  Tile& tc = g_tiles[c];
  if (ta.colsb / 4 != tb.rows || tb.colsb != tc.colsb || ta.rows != tc.rows) std::abort();
  for (int m = 0; m < tc.rows; ++m) {
    for (int n = 0; n < tc.colsb / 4; ++n) {
      int32_t acc;
      std::memcpy(&acc, &tc.bytes[m][4 * n], 4);
      for (int k = 0; k < ta.colsb / 4; ++k) {
        for (int i = 0; i < 4; ++i) {
          acc += int32_t{static_cast<int8_t>(ta.bytes[m][4 * k + i])} *
                 int32_t{static_cast<uint8_t>(tb.bytes[k][4 * n + i])};
        }
      }
      std::memcpy(&tc.bytes[m][4 * n], &acc, 4);
    }
  }
}

}  // namespace

// The tile shapes AmxConfigure(kInt8) loads (kernels_amx.cc).
void Configure(internal::AmxTileShape shape) {
  if (shape != internal::AmxTileShape::kInt8) std::abort();
  for (Tile& t : g_tiles) {
    t.rows = 16;
    t.colsb = 64;
  }
  g_tiles[4].colsb = g_tiles[5].colsb = 32;
  g_tiles[6].rows = g_tiles[7].rows = 8;
}

}  // namespace cortiq::math::testing::amx_model

#undef _tile_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_dpbsud
#define _tile_loadd(t, base, stride) ::cortiq::math::testing::amx_model::Load(t, base, stride)
#define _tile_stored(t, base, stride) ::cortiq::math::testing::amx_model::Store(t, base, stride)
#define _tile_zero(t) ::cortiq::math::testing::amx_model::Zero(t)
#define _tile_dpbsud(c, a, b) ::cortiq::math::testing::amx_model::DpBsUd(c, a, b)
// The kernel's own names, moved aside so they cannot collide with the
// library's (which this binary links too).
#define AmxConfigure(shape) ::cortiq::math::testing::amx_model::Configure(shape)
#define Q8LanesMatMulAmx Q8LanesMatMulAmxModel
#include "core/math/q8_amx.cc"
