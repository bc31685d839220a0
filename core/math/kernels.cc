// Portable scalar kernels, the run-time dispatcher and the public entry points
// of kernels.h. The scalar code is the reference the SIMD files must agree
// with (within rounding), and the fallback on CPUs without AVX2.
#include "core/math/kernels.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "core/math/kernels_internal.h"
#include "core/math/kernels_rows_inl.h"

namespace cortiq::math {
namespace {

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// ---- Level 1 ----
// Eight partial sums in a fixed order: the order depends on n only.
float ScalarDot(const float* a, const float* b, size_t n) {
  float acc[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  for (int j = 0; i < n; ++i, ++j) acc[j] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

void ScalarAxpy(float alpha, const float* x, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

void ScalarScale(float* x, float alpha, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] *= alpha;
}

float ScalarDotI8(const float* a, const int8_t* b, size_t n) {
  float acc[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * static_cast<float>(b[i + j]);
  }
  for (int j = 0; i < n; ++i, ++j) acc[j] += a[i] * static_cast<float>(b[i]);
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

void ScalarAxpyI8(float alpha, const int8_t* x, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += alpha * static_cast<float>(x[i]);
}

// Round half to even for |v| < 2^22 (what the SIMD conversions do).
float RoundEven(float v) { return (v + internal::kRoundMagic) - internal::kRoundMagic; }

float ScalarQuantizeRowI8(const float* x, int8_t* q, size_t n) {
  float amax = 0.0f;
  for (size_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  if (!(amax > 0.0f)) {
    for (size_t i = 0; i < n; ++i) q[i] = 0;
    return 0.0f;
  }
  float scale = amax / 127.0f;
  for (size_t i = 0; i < n; ++i) {
    float v = RoundEven(x[i] / scale);
    v = std::fmin(127.0f, std::fmax(-127.0f, v));
    q[i] = static_cast<int8_t>(v);
  }
  return scale;
}

// ---- Normalisation / activation ----
void ScalarRmsNorm(const float* x, const float* weight, float eps, size_t n, float* out) {
  if (n == 0) return;
  float acc[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += x[i + j] * x[i + j];
  }
  for (int j = 0; i < n; ++i, ++j) acc[j] += x[i] * x[i];
  float ss = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (size_t k = 0; k < n; ++k) out[k] = (x[k] * inv) * weight[k];
}

// exp(x) by the shared polynomial (kernels_internal.h).
float ExpPoly(float x) {
  using namespace internal;      // NOLINT(google-build-using-namespace): constants
  if (x < kExpMin) return 0.0f;  // written so NaN falls through unchanged
  if (x > kExpMax) x = kExpMax;
  float n = (x * kExpLog2e + kRoundMagic) - kRoundMagic;
  float r = x - n * kExpLn2Hi;
  r = r - n * kExpLn2Lo;
  float p = kExpP0;
  p = p * r + kExpP1;
  p = p * r + kExpP2;
  p = p * r + kExpP3;
  p = p * r + kExpP4;
  p = p * r + kExpP5;
  p = p * (r * r) + r + 1.0f;
  if (std::isnan(p)) return p;
  int ni = static_cast<int>(n);
  int n1 = ni >> 1;  // arithmetic shift: floor(n / 2)
  int n2 = ni - n1;
  float s1 = BitsFloat(static_cast<uint32_t>(n1 + 127) << 23);
  float s2 = BitsFloat(static_cast<uint32_t>(n2 + 127) << 23);
  return (p * s1) * s2;
}

void ScalarSoftmax(float* x, size_t n) {
  if (n == 0) return;
  float mx = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < n; ++i) mx = std::fmax(mx, x[i]);
  if (mx == -std::numeric_limits<float>::infinity()) {
    for (size_t i = 0; i < n; ++i) x[i] = 1.0f / static_cast<float>(n);
    return;
  }
  float acc[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) {
      x[i + j] = ExpPoly(x[i + j] - mx);
      acc[j] += x[i + j];
    }
  }
  for (int j = 0; i < n; ++i, ++j) {
    x[i] = ExpPoly(x[i] - mx);
    acc[j] += x[i];
  }
  float sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  float inv = 1.0f / sum;
  for (size_t k = 0; k < n; ++k) x[k] *= inv;
}

void ScalarSwiGlu(const float* gate, const float* up, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) {
    float g = gate[i];
    out[i] = g / (1.0f + ExpPoly(-g)) * up[i];
  }
}

void ScalarRope(float* x, size_t head_dim, const float* cos, const float* sin) {
  size_t half = head_dim / 2;
  float* x1 = x + half;
  for (size_t i = 0; i < half; ++i) {
    float a = x[i], b = x1[i];
    x[i] = a * cos[i] - b * sin[i];
    x1[i] = b * cos[i] + a * sin[i];
  }
}

void ScalarConvertToF32(const void* src, DType dtype, size_t n, float* dst) {
  if (n == 0) return;  // pointers may be null then; memmove would not allow it
  switch (dtype) {
    case DType::kF32:
      std::memmove(dst, src, n * sizeof(float));
      return;
    case DType::kBF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = Bf16ToF32(s[i]);
      return;
    }
    case DType::kF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = F16ToF32(s[i]);
      return;
    }
    case DType::kQ8_0:
      return DequantizeQ8_0(src, n, dst);
  }
}

void ScalarConvertFromF32(const float* src, DType dtype, size_t n, void* dst) {
  if (n == 0) return;
  switch (dtype) {
    case DType::kF32:
      std::memmove(dst, src, n * sizeof(float));
      return;
    case DType::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = F32ToBf16(src[i]);
      return;
    }
    case DType::kF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = F32ToF16(src[i]);
      return;
    }
    case DType::kQ8_0:
      return QuantizeQ8_0(src, n, dst);
  }
}

// ---- int8 weights (Q8_0): the reference every ISA equals bit-for-bit ----
uint16_t LoadU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }

}  // namespace

namespace internal {
void Q8MatMulScalar(const Q8Args& a, size_t row_begin, size_t row_end) {
  const size_t blocks = a.cols / kQ8Block;
  for (size_t r = row_begin; r < row_end; ++r) {
    const uint8_t* row = a.w + r * blocks * kQ8BlockBytes;
    for (size_t b = 0; b < a.batch; ++b) {
      const int8_t* qx = a.qx + b * a.cols;
      const float* dx = a.dx + b * blocks;
      float acc = 0.0f;
      for (size_t j = 0; j < blocks; ++j) {
        const uint8_t* blk = row + j * kQ8BlockBytes;
        const int8_t* qw = reinterpret_cast<const int8_t*>(blk + 2);
        int32_t sum = 0;
        for (size_t i = 0; i < kQ8Block; ++i) sum += int32_t{qw[i]} * int32_t{qx[j * kQ8Block + i]};
        const float s = F16ToF32(LoadU16(blk)) * dx[j];
        acc = std::fma(static_cast<float>(sum), s, acc);
      }
      a.y[b * a.rows + r] = acc;
    }
  }
}
}  // namespace internal

namespace {

// ---- Decode MatMul ----
// Converts W a block of columns at a time into a stack buffer and accumulates
// per-block dot products into y, so a row's result never depends on batch.
void ScalarGemv(const internal::GemvArgs& a, size_t row_begin, size_t row_end) {
  constexpr size_t kBlock = 256;
  float wbuf[kBlock];
  const size_t esize = DTypeSize(a.dtype);
  const char* w = static_cast<const char*>(a.w);
  for (size_t r = row_begin; r < row_end; ++r) {
    for (size_t b = 0; b < a.batch; ++b) a.y[b * a.rows + r] = 0.0f;
    for (size_t c0 = 0; c0 < a.cols; c0 += kBlock) {
      size_t len = a.cols - c0 < kBlock ? a.cols - c0 : kBlock;
      ScalarConvertToF32(w + (r * a.cols + c0) * esize, a.dtype, len, wbuf);
      for (size_t b = 0; b < a.batch; ++b) {
        a.y[b * a.rows + r] += ScalarDot(wbuf, a.x + b * a.x_stride + c0, len);
      }
    }
  }
}

uint64_t ScalarReadStream(const void* p, size_t bytes) {
  const uint64_t* q = static_cast<const uint64_t*>(p);
  uint64_t acc[4] = {};
  for (size_t i = 0; i + 4 <= bytes / 8; i += 4) {
    for (int j = 0; j < 4; ++j) acc[j] ^= q[i + j];
  }
  return acc[0] ^ acc[1] ^ acc[2] ^ acc[3];
}

double ScalarFmaLoop(uint64_t iters) {
  float acc[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  const float m = 0.999f, c = 0.001f;
  for (uint64_t it = 0; it < iters; ++it) {
    for (int j = 0; j < 8; ++j) acc[j] = acc[j] * m + c;
  }
  volatile float sink = acc[0] + acc[1] + acc[2] + acc[3] + acc[4] + acc[5] + acc[6] + acc[7];
  (void)sink;
  return 2.0 * 8.0 * static_cast<double>(iters);
}

const internal::KernelTable kScalar = {
    .isa = Isa::kScalar,
    .dot = ScalarDot,
    .axpy = ScalarAxpy,
    .dot_rows = internal::DotRowsT<ScalarDot>,
    .axpy_rows = internal::AxpyRowsT<ScalarAxpy>,
    .scale = ScalarScale,
    .dot_i8 = ScalarDotI8,
    .axpy_i8 = ScalarAxpyI8,
    .dot_rows_i8 = internal::DotRowsI8T<ScalarDotI8>,
    .axpy_rows_i8 = internal::AxpyRowsI8T<ScalarAxpyI8>,
    .quantize_row_i8 = ScalarQuantizeRowI8,
    .rms_norm = ScalarRmsNorm,
    .softmax = ScalarSoftmax,
    .swiglu = ScalarSwiGlu,
    .rope_rotate_half = ScalarRope,
    .convert_to_f32 = ScalarConvertToF32,
    .convert_from_f32 = ScalarConvertFromF32,
    .gemv_col_block = 1,
    .gemv_bf16_even_odd = false,
    .gemv_pack_x = nullptr,
    .gemv = ScalarGemv,
    .gemv_bf16_pack_size = nullptr,
    .gemv_bf16_pack_x = nullptr,
    .gemv_bf16_row_block = 0,
    .gemv_bf16 = nullptr,
    .amx_pack_x = nullptr,
    .amx_matmul = nullptr,
    .q8_row_block = 1,
    .q8_matmul = internal::Q8MatMulScalar,
    .q8_lanes_matmul = nullptr,
    .q8_lanes_amx = nullptr,
    .gemm_mr = 0,
    .gemm_nr = 0,
    .gemm_kc = 0,
    .gemm_nc = 0,
    .gemm_pack_x = nullptr,
    .gemm = nullptr,
    .gemm_bf16_pack_x = nullptr,
    .gemm_bf16 = nullptr,
    .read_stream = ScalarReadStream,
    .fma_loop = ScalarFmaLoop,
};

// ---- Dispatch ----
// AVX-VNNI (CPUID leaf 7 subleaf 1 EAX bit 4), read once.
bool HasAvxVnni() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = [] {
    unsigned a0 = 0, b0 = 0, c0 = 0, d0 = 0, a1 = 0, b1 = 0, c1 = 0, d1 = 0;
    return __get_cpuid_count(7, 0, &a0, &b0, &c0, &d0) != 0 && a0 >= 1 &&
           __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1) != 0 && (a1 >> 4 & 1u) &&
           internal::AvxVnniTable() != nullptr;
  }();
  return has;
#else
  return false;
#endif
}

Isa Detect() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  // AVX512_BF16 and AMX straight from CPUID leaf 7 (clang 14's
  // __builtin_cpu_supports knows neither): subleaf 1 EAX bit 5 = AVX512_BF16;
  // subleaf 0 EDX bit 22 = AMX-BF16, bit 24 = AMX-TILE.
  unsigned a0 = 0, b0 = 0, c0 = 0, d0 = 0, a1 = 0, b1 = 0, c1 = 0, d1 = 0;
  const bool leaf7 = __get_cpuid_count(7, 0, &a0, &b0, &c0, &d0) != 0;
  const bool avx512bf16 =
      leaf7 && a0 >= 1 && __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1) != 0 && (a1 >> 5 & 1u);
  // subleaf 0 ECX bit 11 = AVX512_VNNI, EDX bit 25 = AMX-INT8.
  const bool amx = leaf7 && (d0 >> 22 & 1u) && (d0 >> 24 & 1u) && (d0 >> 25 & 1u);
  const bool vnni = leaf7 && (c0 >> 11 & 1u);
  if (internal::AmxTable() != nullptr && avx512 && vnni && avx512bf16 && amx &&
      internal::EnableAmxForProcess()) {
    return Isa::kAmx;
  }
  if (internal::Avx512Bf16Table() != nullptr && avx512 && vnni && avx512bf16) {
    return Isa::kAvx512Bf16;
  }
  if (internal::Avx512VnniTable() != nullptr && avx512 && vnni) return Isa::kAvx512Vnni;
  if (internal::Avx512Table() != nullptr && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx2") &&
      __builtin_cpu_supports("fma")) {
    return Isa::kAvx512;
  }
  // F16C has no __builtin_cpu_supports name in GCC 12; every CPU with AVX2
  // and FMA (Haswell, Zen and later) has it.
  if (internal::Avx2Table() != nullptr && __builtin_cpu_supports("avx2") &&
      __builtin_cpu_supports("fma")) {
    return HasAvxVnni() ? Isa::kAvxVnni : Isa::kAvx2;
  }
#endif
  return Isa::kScalar;
}

// The preference GemmBf16Used applies: the CPUID vendor, unless
// CORTIQ_BF16_GEMM says.
bool DefaultGemmBf16() {
  const char* env = std::getenv("CORTIQ_BF16_GEMM");
  if (env != nullptr && std::strcmp(env, "dpbf16") == 0) return true;
  if (env != nullptr && std::strcmp(env, "fma") == 0) return false;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d) == 0) return false;
  char vendor[13];
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  vendor[12] = '\0';
  return std::strcmp(vendor, "AuthenticAMD") == 0;
#else
  return false;
#endif
}

// -1: not read yet; 0 / 1: internal::GemmBf16Preferred.
std::atomic<int> g_gemm_bf16{-1};

Isa CapFromEnv(Isa detected) {
  const char* env = std::getenv("CORTIQ_ISA");
  if (env == nullptr || *env == '\0') return detected;
  Isa want = detected;
  if (std::strcmp(env, "scalar") == 0) want = Isa::kScalar;
  if (std::strcmp(env, "avx2") == 0) want = Isa::kAvx2;
  if (std::strcmp(env, "avxvnni") == 0) want = Isa::kAvxVnni;
  if (std::strcmp(env, "avx512") == 0) want = Isa::kAvx512;
  if (std::strcmp(env, "avx512vnni") == 0) want = Isa::kAvx512Vnni;
  if (std::strcmp(env, "avx512bf16") == 0) want = Isa::kAvx512Bf16;
  if (std::strcmp(env, "amx") == 0) want = Isa::kAmx;
  return static_cast<int>(want) < static_cast<int>(detected) ? want : detected;
}

std::atomic<const internal::KernelTable*> g_active{nullptr};

const internal::KernelTable& InitActive() {
  const internal::KernelTable* t = &internal::TableFor(CapFromEnv(DetectedIsa()));
  g_active.store(t, std::memory_order_release);
  return *t;
}

}  // namespace

namespace internal {

const KernelTable& ScalarTable() { return kScalar; }

const KernelTable& TableFor(Isa isa) {
  if (isa == Isa::kAvxVnni) {
    if (HasAvxVnni()) return *AvxVnniTable();
    isa = Isa::kAvx2;
  }
  if (isa == Isa::kAmx && AmxTable() != nullptr) return *AmxTable();
  if ((isa == Isa::kAvx512Bf16 || isa == Isa::kAmx) && Avx512Bf16Table() != nullptr) {
    return *Avx512Bf16Table();
  }
  if (isa != Isa::kScalar && isa != Isa::kAvx2 && isa != Isa::kAvx512 &&
      Avx512VnniTable() != nullptr) {
    return *Avx512VnniTable();
  }
  if (isa != Isa::kScalar && isa != Isa::kAvx2 && Avx512Table() != nullptr) return *Avx512Table();
  if (isa != Isa::kScalar && Avx2Table() != nullptr) return *Avx2Table();
  return kScalar;
}

bool GemmBf16Preferred() {
  int v = g_gemm_bf16.load(std::memory_order_relaxed);
  if (v < 0) [[unlikely]] {
    v = DefaultGemmBf16() ? 1 : 0;
    g_gemm_bf16.store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

const KernelTable& Active() {
  const KernelTable* t = g_active.load(std::memory_order_acquire);
  if (t != nullptr) [[likely]]
    return *t;
  return InitActive();
}

}  // namespace internal

Isa DetectedIsa() {
  static const Isa detected = Detect();
  return detected;
}

Isa ActiveIsa() { return internal::Active().isa; }

Isa SetIsaForTesting(Isa isa) {
  Isa capped = static_cast<int>(isa) < static_cast<int>(DetectedIsa()) ? isa : DetectedIsa();
  const internal::KernelTable* t = &internal::TableFor(capped);
  g_active.store(t, std::memory_order_release);
  return t->isa;
}

bool IsaAvailable(Isa isa) {
  if (static_cast<int>(isa) > static_cast<int>(DetectedIsa())) return false;
  return isa != Isa::kAvxVnni || HasAvxVnni();
}

bool GemmBf16Used() {
  const internal::KernelTable& t = internal::Active();
  return t.gemm_bf16 != nullptr && t.amx_matmul == nullptr && internal::GemmBf16Preferred();
}

bool SetGemmBf16ForTesting(bool use) {
  const bool previous = internal::GemmBf16Preferred();
  g_gemm_bf16.store(use ? 1 : 0, std::memory_order_relaxed);
  return previous;
}

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvxVnni:
      return "avxvnni";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx512Vnni:
      return "avx512vnni";
    case Isa::kAvx512Bf16:
      return "avx512bf16";
    case Isa::kAmx:
      return "amx";
  }
  return "unknown";
}

size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kQ8_0:
      return 0;
  }
  return 0;
}

size_t RowBytes(DType t, size_t cols) {
  return t == DType::kQ8_0 ? cols / kQ8Block * kQ8BlockBytes : cols * DTypeSize(t);
}

void QuantizeQ8_0(const float* x, size_t n, void* out) {
  uint8_t* o = static_cast<uint8_t*>(out);
  for (size_t b = 0; b < n / kQ8Block; ++b, x += kQ8Block, o += kQ8BlockBytes) {
    float amax = 0.0f;  // as ggml: fmaxf ignores NaN, so a NaN block keeps its finite max
    bool finite = true;
    for (size_t i = 0; i < kQ8Block; ++i) {
      amax = std::fmax(amax, std::fabs(x[i]));
      finite = finite && std::isfinite(x[i]);
    }
    const float d = finite ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
    // d below 1 / FLT_MAX (a block of denormals; its f16 scale is 0 anyway):
    // an infinite inverse would make inf -> int8 (undefined), so 0.
    const float inv = d != 0.0f ? 1.0f / d : 0.0f;
    const float id = inv <= std::numeric_limits<float>::max() ? inv : 0.0f;
    const uint16_t h = F32ToF16(d);
    o[0] = static_cast<uint8_t>(h & 0xff);
    o[1] = static_cast<uint8_t>(h >> 8);
    for (size_t i = 0; i < kQ8Block; ++i) {
      const float v = finite ? std::round(x[i] * id) : 0.0f;
      o[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(v));
    }
  }
}

void DequantizeQ8_0(const void* src, size_t n, float* out) {
  const uint8_t* s = static_cast<const uint8_t*>(src);
  for (size_t b = 0; b < n / kQ8Block; ++b, s += kQ8BlockBytes, out += kQ8Block) {
    const float d = F16ToF32(LoadU16(s));
    for (size_t i = 0; i < kQ8Block; ++i)
      out[i] = d * static_cast<float>(static_cast<int8_t>(s[2 + i]));
  }
}

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kQ8_0:
      return "q8_0";
  }
  return "unknown";
}

float Dot(const float* a, const float* b, size_t n) { return internal::Active().dot(a, b, n); }
void Axpy(float alpha, const float* x, float* y, size_t n) {
  internal::Active().axpy(alpha, x, y, n);
}
void Scale(float* x, float alpha, size_t n) { internal::Active().scale(x, alpha, n); }
void DotRows(const float* q, size_t nq, size_t q_stride, const float* rows, size_t n,
             size_t row_stride, size_t d, float* out, size_t out_stride) {
  internal::Active().dot_rows(q, nq, q_stride, rows, n, row_stride, d, out, out_stride);
}
void AxpyRows(const float* p, size_t nq, size_t p_stride, const float* rows, size_t n,
              size_t row_stride, size_t d, float* out, size_t out_stride) {
  internal::Active().axpy_rows(p, nq, p_stride, rows, n, row_stride, d, out, out_stride);
}
float DotI8(const float* a, const int8_t* b, size_t n) {
  return internal::Active().dot_i8(a, b, n);
}
void AxpyI8(float alpha, const int8_t* x, float* y, size_t n) {
  internal::Active().axpy_i8(alpha, x, y, n);
}
void DotRowsI8(const float* q, size_t nq, size_t q_stride, const int8_t* rows, size_t n,
               size_t row_stride, size_t d, float* out, size_t out_stride) {
  internal::Active().dot_rows_i8(q, nq, q_stride, rows, n, row_stride, d, out, out_stride);
}
void AxpyRowsI8(const float* p, size_t nq, size_t p_stride, const float* row_scale,
                const int8_t* rows, size_t n, size_t row_stride, size_t d, float* out,
                size_t out_stride) {
  internal::Active().axpy_rows_i8(p, nq, p_stride, row_scale, rows, n, row_stride, d, out,
                                  out_stride);
}
float QuantizeRowI8(const float* x, int8_t* q, size_t n) {
  return internal::Active().quantize_row_i8(x, q, n);
}
void RmsNorm(const float* x, const float* weight, float eps, size_t n, float* out) {
  internal::Active().rms_norm(x, weight, eps, n, out);
}
void Softmax(float* x, size_t n) { internal::Active().softmax(x, n); }
void SwiGlu(const float* gate, const float* up, size_t n, float* out) {
  internal::Active().swiglu(gate, up, n, out);
}
void RopeRotateHalf(float* x, size_t head_dim, const float* cos, const float* sin) {
  internal::Active().rope_rotate_half(x, head_dim, cos, sin);
}
void ConvertToF32(const void* src, DType dtype, size_t n, float* dst) {
  if (dtype == DType::kQ8_0) return DequantizeQ8_0(src, n, dst);
  internal::Active().convert_to_f32(src, dtype, n, dst);
}
void ConvertFromF32(const float* src, DType dtype, size_t n, void* dst) {
  if (dtype == DType::kQ8_0) return QuantizeQ8_0(src, n, dst);
  internal::Active().convert_from_f32(src, dtype, n, dst);
}

// ---- Scalar conversions (exact; the SIMD paths match them bit for bit) ----
float Bf16ToF32(uint16_t h) { return BitsFloat(static_cast<uint32_t>(h) << 16); }

uint16_t F32ToBf16(float f) {
  uint32_t b = FloatBits(f);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u)
    return static_cast<uint16_t>((b >> 16) | 0x40u);  // quiet NaN
  b += 0x7FFFu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}

float RoundToBf16(float x) { return Bf16ToF32(F32ToBf16(x)); }

float F16ToF32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1Fu;
  uint32_t m = h & 0x3FFu;
  if (e == 0) {
    // Zero or subnormal: m * 2^-24, exact in f32.
    float v = static_cast<float>(m) * 5.9604644775390625e-8f;
    return BitsFloat(FloatBits(v) | sign);
  }
  if (e == 31) {  // inf, or NaN made quiet (as F16C does)
    return BitsFloat(sign | 0x7F800000u | (m << 13) | (m != 0 ? 0x400000u : 0u));
  }
  return BitsFloat(sign | ((e + 112u) << 23) | (m << 13));
}

uint16_t F32ToF16(float f) {
  uint32_t b = FloatBits(f);
  uint32_t sign = (b >> 16) & 0x8000u;
  uint32_t a = b & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520: inf
  if (a < 0x38800000u) {                                               // below 2^-14
    if (a <= 0x33000000u) return static_cast<uint16_t>(sign);          // <= 2^-25: 0
    uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 126u - (a >> 23);  // 14..24
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t t = a - 0x38000000u;  // rebias the exponent from 127 to 15
  t += 0xFFFu + ((t >> 13) & 1u);
  return static_cast<uint16_t>(sign | (t >> 13));
}

}  // namespace cortiq::math
