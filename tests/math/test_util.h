// Helpers shared by the core/math tests: the ISAs to sweep, seeded random
// data, and unit roundoff for error bounds.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/math/kernels.h"

namespace cortiq::math::testing {

// f32 unit roundoff (2^-24): one correctly rounded operation is within u * |result|.
inline constexpr double kU = 5.9604644775390625e-8;

// Every ISA this CPU can run, lowest first.
inline std::vector<Isa> SupportedIsas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvxVnni, Isa::kAvx512, Isa::kAvx512Vnni,
                  Isa::kAvx512Bf16, Isa::kAmx}) {
    if (IsaAvailable(isa)) out.push_back(isa);
  }
  return out;
}

inline std::string IsaParamName(Isa isa) { return IsaName(isa); }

// Sets the ISA for the duration of a test and restores the detected one.
class ScopedIsa {
 public:
  explicit ScopedIsa(Isa isa) { active_ = SetIsaForTesting(isa); }
  ~ScopedIsa() { SetIsaForTesting(DetectedIsa()); }
  ScopedIsa(const ScopedIsa&) = delete;
  ScopedIsa& operator=(const ScopedIsa&) = delete;
  Isa active() const { return active_; }

 private:
  Isa active_;
};

inline std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline std::vector<int8_t> RandomI8(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(-127, 127);
  std::vector<int8_t> v(n);
  for (auto& x : v) x = static_cast<int8_t>(dist(rng));
  return v;
}

inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace cortiq::math::testing
