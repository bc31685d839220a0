// Sampler implementation. See sampler.h for the pipeline and its contract.
#include "core/model/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <queue>

#include "absl/strings/str_cat.h"

namespace cortiq::model {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr char kMagic[4] = {'C', 'Q', 'S', 'M'};

uint64_t SplitMix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Explicit little-endian encoding, independent of the host's byte order.
void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutF32(std::string& out, float v) { PutU32(out, std::bit_cast<uint32_t>(v)); }

uint32_t GetU32(std::string_view b, size_t off) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) {
    v |= static_cast<uint32_t>(static_cast<uint8_t>(b[off + i])) << (8 * i);
  }
  return v;
}
uint64_t GetU64(std::string_view b, size_t off) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) {
    v |= static_cast<uint64_t>(static_cast<uint8_t>(b[off + i])) << (8 * i);
  }
  return v;
}
float GetF32(std::string_view b, size_t off) { return std::bit_cast<float>(GetU32(b, off)); }

}  // namespace

// ---- SamplingParams ----

absl::Status SamplingParams::Validate() const {
  if (!std::isfinite(temperature) || temperature < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature: must be finite and >= 0 (0 = greedy), got ", temperature));
  }
  if (top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("top_k: must be >= 0 (0 = off), got ", top_k));
  }
  // 0 keeps only the most likely token (OpenAI accepts it: greedy).
  if (!(top_p >= 0 && top_p <= 1)) {  // also rejects NaN
    return absl::InvalidArgumentError(absl::StrCat("top_p: must be in [0, 1], got ", top_p));
  }
  if (!(min_p >= 0 && min_p <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("min_p: must be in [0, 1], got ", min_p));
  }
  if (!std::isfinite(repetition_penalty) || repetition_penalty <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "repetition_penalty: must be finite and > 0 (1 = off), got ", repetition_penalty));
  }
  if (!(presence_penalty >= -kMaxPenalty && presence_penalty <= kMaxPenalty)) {
    return absl::InvalidArgumentError(absl::StrCat("presence_penalty: must be in [-", kMaxPenalty,
                                                   ", ", kMaxPenalty, "], got ", presence_penalty));
  }
  if (!(frequency_penalty >= -kMaxPenalty && frequency_penalty <= kMaxPenalty)) {
    return absl::InvalidArgumentError(absl::StrCat("frequency_penalty: must be in [-", kMaxPenalty,
                                                   ", ", kMaxPenalty, "], got ",
                                                   frequency_penalty));
  }
  if (logit_bias.size() > kMaxLogitBias) {
    return absl::InvalidArgumentError(absl::StrCat("logit_bias: ", logit_bias.size(),
                                                   " entries, at most ", kMaxLogitBias));
  }
  for (size_t i = 0; i < logit_bias.size(); ++i) {
    const auto [id, bias] = logit_bias[i];
    if (id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("logit_bias: token id ", id, " is negative (ids are >= 0)"));
    }
    if (i > 0 && id <= logit_bias[i - 1].first) {
      return absl::InvalidArgumentError(absl::StrCat(
          "logit_bias: token id ", id, id == logit_bias[i - 1].first ? " appears twice" : " out of order",
          " (ids distinct, ascending)"));
    }
    if (!(bias >= -kMaxBias && bias <= kMaxBias)) {
      return absl::InvalidArgumentError(absl::StrCat("logit_bias[", id, "]: bias must be in [-",
                                                     kMaxBias, ", ", kMaxBias, "], got ", bias));
    }
  }
  return absl::OkStatus();
}

// ---- Rng ----

Rng::Rng(uint64_t seed) {
  for (uint64_t& w : s_) w = SplitMix64(seed);
}

uint64_t Rng::Next() {
  const uint64_t result = std::rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = std::rotl(s_[3], 45);
  return result;
}

double Rng::Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

// ---- Logprobs ----

absl::StatusOr<Logprobs> ComputeLogprobs(std::span<const float> logits, float temperature,
                                         int32_t chosen, int top_n) {
  const size_t n = logits.size();
  if (n == 0) return absl::InvalidArgumentError("logits: empty");
  if (chosen < 0 || static_cast<size_t>(chosen) >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("chosen: token id ", chosen, " outside [0, ", n, ")"));
  }
  if (top_n < 0) {
    return absl::InvalidArgumentError(absl::StrCat("top_n: must be >= 0, got ", top_n));
  }
  if (!std::isfinite(temperature) || temperature < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature: must be finite and >= 0, got ", temperature));
  }
  const float t = temperature == 0 ? 1.0f : temperature;
  auto y = [&](size_t i) -> float {
    float v = logits[i];
    return std::isnan(v) ? kNegInf : v / t;
  };

  float maxv = kNegInf;
  size_t num_max_inf = 0;
  for (size_t i = 0; i < n; ++i) {
    float v = y(i);
    maxv = std::max(maxv, v);
    num_max_inf += v == std::numeric_limits<float>::infinity();
  }
  // logprob(i) for the three regimes: normal; some +inf (they share the mass);
  // all -inf (uniform, by convention).
  double lse = 0;
  if (std::isfinite(maxv)) {
    double sum = 0;
    for (size_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(y(i)) - maxv);
    lse = maxv + std::log(sum);
  }
  auto logprob = [&](size_t i) -> float {
    float v = y(i);
    if (num_max_inf > 0) {
      return v == maxv ? static_cast<float>(-std::log(static_cast<double>(num_max_inf))) : kNegInf;
    }
    if (maxv == kNegInf) return static_cast<float>(-std::log(static_cast<double>(n)));
    return static_cast<float>(static_cast<double>(v) - lse);
  };

  Logprobs out;
  out.chosen = {chosen, logprob(static_cast<size_t>(chosen))};
  const size_t k = std::min(static_cast<size_t>(top_n), n);
  if (k > 0) {
    // Min-heap on (value, -id) of the best k so far: its top is the worst kept.
    auto better = [&](int32_t a, int32_t b) {
      float ya = y(a), yb = y(b);
      return ya > yb || (ya == yb && a < b);
    };
    std::vector<int32_t> heap;
    heap.reserve(k + 1);
    for (size_t i = 0; i < n; ++i) {
      const int32_t id = static_cast<int32_t>(i);
      if (heap.size() < k) {
        heap.push_back(id);
        std::push_heap(heap.begin(), heap.end(), better);
      } else if (better(id, heap.front())) {
        std::pop_heap(heap.begin(), heap.end(), better);
        heap.back() = id;
        std::push_heap(heap.begin(), heap.end(), better);
      }
    }
    std::sort(heap.begin(), heap.end(), better);
    out.top.reserve(k);
    for (int32_t id : heap) out.top.push_back({id, logprob(static_cast<size_t>(id))});
  }
  return out;
}

// ---- Sampler ----

absl::StatusOr<Sampler> Sampler::Create(const SamplingParams& params) {
  if (absl::Status s = params.Validate(); !s.ok()) return s;
  return Sampler(params);
}

absl::StatusOr<Sampler> Sampler::WithParams(const SamplingParams& params) const {
  if (absl::Status s = params.Validate(); !s.ok()) return s;
  Sampler out(params);
  out.params_.seed = params_.seed;
  out.rng_ = rng_;
  out.samples_drawn_ = samples_drawn_;
  return out;
}

// One per thread that samples (the engine's thread, a tool's main thread),
// sized to the largest vocabulary it has seen: a session keeps no scratch
// between its calls, and a new call faults nothing in.
Sampler::Scratch& Sampler::ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

Sampler::Scratch& Sampler::EnsureScratch(size_t vocab) {
  Scratch& s = ThreadScratch();
  if (s.x.size() == vocab) return s;
  s.x.assign(vocab, 0.0f);
  s.w.assign(vocab, 0.0f);
  s.idx.assign(vocab, 0);
  s.seen.assign(vocab, 0);
  s.count.assign(vocab, 0);
  return s;
}

bool Sampler::Before(const Scratch& s, int32_t a, int32_t b) {
  return s.x[a] > s.x[b] || (s.x[a] == s.x[b] && a < b);
}

void Sampler::AdjustLogits(Scratch& s, std::span<const int32_t> completion) const {
  const size_t n = s.x.size();
  auto in_vocab = [n](int32_t id) { return id >= 0 && static_cast<size_t>(id) < n; };
  // 1. logit_bias.
  for (const auto& [id, bias] : params_.logit_bias) {
    if (in_vocab(id)) s.x[id] += bias;
  }
  // 2. Presence / frequency penalties: count each id of the completion, then
  //    adjust each distinct id once and clear its count (s.count is all-zero
  //    between calls).
  if (params_.presence_penalty == 0 && params_.frequency_penalty == 0) return;
  for (int32_t id : completion) {
    if (in_vocab(id)) ++s.count[id];
  }
  for (int32_t id : completion) {
    if (!in_vocab(id) || s.count[id] == 0) continue;
    s.x[id] -=
        params_.frequency_penalty * static_cast<float>(s.count[id]) + params_.presence_penalty;
    s.count[id] = 0;
  }
}

int32_t Sampler::Sample(std::span<const float> logits, std::span<const int32_t> history,
                        std::span<const int32_t> completion, std::span<const int32_t> masked) {
  ++samples_drawn_;
  const size_t n = logits.size();
  if (n == 0) return -1;
  Scratch& s = EnsureScratch(n);
  for (size_t i = 0; i < n; ++i) s.x[i] = std::isnan(logits[i]) ? kNegInf : logits[i];

  // 1-2. logit_bias, presence / frequency penalties.
  if (params_.AdjustsLogits()) AdjustLogits(s, completion);

  // 3. Repetition penalty, once per distinct id (s.seen is all-zero between calls).
  if (params_.repetition_penalty != 1.0f) {
    const float p = params_.repetition_penalty;
    for (int32_t id : history) {
      if (id < 0 || static_cast<size_t>(id) >= n || s.seen[id]) continue;
      s.seen[id] = 1;
      s.x[id] = s.x[id] > 0 ? s.x[id] / p : s.x[id] * p;
    }
    for (int32_t id : history) {
      if (id >= 0 && static_cast<size_t>(id) < n) s.seen[id] = 0;
    }
  }

  // 4. Masked ids.
  for (int32_t id : masked) {
    if (id >= 0 && static_cast<size_t>(id) < n) s.x[id] = kNegInf;
  }

  // 5. Argmax (lowest id on ties): the greedy answer, and the top of every
  //    candidate order below.
  int32_t best = 0;
  for (size_t i = 1; i < n; ++i) {
    if (s.x[i] > s.x[best]) best = static_cast<int32_t>(i);
  }
  if (params_.temperature == 0 || !std::isfinite(s.x[best])) return best;

  // 6. Temperature. Division by a positive number keeps the order; if it
  //    overflows the top to +inf the distribution is a point mass anyway.
  const float t = params_.temperature;
  for (size_t i = 0; i < n; ++i) s.x[i] /= t;
  const float maxx = s.x[best];
  if (!std::isfinite(maxx)) return best;

  // 7. Top-k: s.idx[0, count) holds the candidates; s.idx[0, sorted) of them are
  //    in final order (x descending, then id ascending).
  size_t count = n;
  size_t sorted = 0;
  std::iota(s.idx.begin(), s.idx.end(), 0);
  auto before = [&s](int32_t a, int32_t b) { return Before(s, a, b); };
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n) {
    count = static_cast<size_t>(params_.top_k);
    std::nth_element(s.idx.begin(), s.idx.begin() + count, s.idx.end(), before);
    std::sort(s.idx.begin(), s.idx.begin() + count, before);
    sorted = count;
  }

  double total = 0;
  for (size_t c = 0; c < count; ++c) {
    const int32_t id = s.idx[c];
    s.w[id] = std::exp(s.x[id] - maxx);
    total += s.w[id];
  }

  // 8. Top-p: sort only as far as the nucleus needs, in growing chunks.
  if (params_.top_p < 1.0f) {
    const double target = static_cast<double>(params_.top_p) * total;
    double cum = 0;
    size_t keep = count;
    size_t done = 0;  // s.idx[0, done) accumulated
    while (done < count) {
      if (done == sorted) {
        size_t next = std::min(count, std::max<size_t>(64, 2 * sorted));
        if (next < count) {
          std::nth_element(s.idx.begin() + sorted, s.idx.begin() + next, s.idx.begin() + count,
                           before);
        }
        std::sort(s.idx.begin() + sorted, s.idx.begin() + next, before);
        sorted = next;
      }
      cum += s.w[s.idx[done++]];
      if (cum >= target) {
        keep = done;
        break;
      }
    }
    count = keep;
  }

  // 9. Min-p: relative to the top token, whose weight is exactly 1.
  if (params_.min_p > 0.0f) {
    size_t out = 0;
    total = 0;
    for (size_t c = 0; c < count; ++c) {
      const int32_t id = s.idx[c];
      if (s.w[id] >= params_.min_p) {
        s.idx[out++] = id;
        total += s.w[id];
      }
    }
    count = out;
  } else if (params_.top_p < 1.0f) {
    total = 0;
    for (size_t c = 0; c < count; ++c) total += s.w[s.idx[c]];
  }

  // 10. Inverse CDF over the kept candidates, in their (deterministic) order.
  const double target = rng_.Uniform() * total;
  double cum = 0;
  int32_t last_positive = best;
  for (size_t c = 0; c < count; ++c) {
    const int32_t id = s.idx[c];
    if (s.w[id] <= 0) continue;
    cum += s.w[id];
    last_positive = id;
    if (target < cum) return id;
  }
  return last_positive;  // only reached through rounding at u -> 1
}

std::string Sampler::SerializeState() const {
  // A sampler without the version-2 parameters is written as version 1,
  // byte for byte what earlier builds wrote: its sessions still move to a
  // node that reads only version 1 (a rolling upgrade).
  const bool v2 = params_.AdjustsLogits();
  std::string out;
  out.reserve(kStateBytesV1 + (v2 ? kStateV2FixedBytes + 8 * params_.logit_bias.size() : 0));
  out.append(kMagic, 4);
  PutU32(out, v2 ? 2 : 1);
  PutF32(out, params_.temperature);
  PutU32(out, static_cast<uint32_t>(params_.top_k));
  PutF32(out, params_.top_p);
  PutF32(out, params_.min_p);
  PutF32(out, params_.repetition_penalty);
  PutU64(out, params_.seed);
  for (uint64_t w : rng_.state()) PutU64(out, w);
  PutU64(out, samples_drawn_);
  if (!v2) return out;
  PutF32(out, params_.presence_penalty);
  PutF32(out, params_.frequency_penalty);
  PutU32(out, static_cast<uint32_t>(params_.logit_bias.size()));
  for (const auto& [id, bias] : params_.logit_bias) {
    PutU32(out, static_cast<uint32_t>(id));
    PutF32(out, bias);
  }
  return out;
}

absl::StatusOr<Sampler> Sampler::Deserialize(std::string_view blob) {
  if (blob.size() < 8 || std::memcmp(blob.data(), kMagic, 4) != 0) {
    return absl::DataLossError("sampler state: bad magic (not a sampler state)");
  }
  const uint32_t version = GetU32(blob, 4);
  if (version < 1 || version > kStateVersion) {
    return absl::FailedPreconditionError(absl::StrCat("sampler state: version ", version,
                                                      " not supported (this build reads 1..",
                                                      kStateVersion, ")"));
  }
  // The length the version (and a version-2 blob's count) implies.
  size_t expected = kStateBytesV1;
  size_t bias_count = 0;
  if (version >= 2) {
    expected += kStateV2FixedBytes;
    if (blob.size() >= expected) {
      bias_count = GetU32(blob, kStateBytesV1 + 8);
      if (bias_count > kMaxLogitBias) {
        return absl::DataLossError(absl::StrCat("sampler state: ", bias_count,
                                                " logit_bias entries, at most ", kMaxLogitBias));
      }
      expected += 8 * bias_count;
    }
  }
  if (blob.size() != expected) {
    return absl::DataLossError(absl::StrCat("sampler state: ", blob.size(), " bytes, expected ",
                                            expected, " for version ", version,
                                            " (truncated or corrupt)"));
  }
  SamplingParams p;
  p.temperature = GetF32(blob, 8);
  p.top_k = static_cast<int32_t>(GetU32(blob, 12));
  p.top_p = GetF32(blob, 16);
  p.min_p = GetF32(blob, 20);
  p.repetition_penalty = GetF32(blob, 24);
  p.seed = GetU64(blob, 28);
  if (version >= 2) {
    p.presence_penalty = GetF32(blob, kStateBytesV1);
    p.frequency_penalty = GetF32(blob, kStateBytesV1 + 4);
    p.logit_bias.reserve(bias_count);
    for (size_t i = 0; i < bias_count; ++i) {
      const size_t off = kStateBytesV1 + kStateV2FixedBytes + 8 * i;
      p.logit_bias.emplace_back(static_cast<int32_t>(GetU32(blob, off)), GetF32(blob, off + 4));
    }
  }
  if (absl::Status s = p.Validate(); !s.ok()) {
    return absl::DataLossError(absl::StrCat("sampler state: invalid parameters: ", s.message()));
  }
  std::array<uint64_t, 4> state;
  for (size_t i = 0; i < 4; ++i) state[i] = GetU64(blob, 36 + 8 * i);
  if ((state[0] | state[1] | state[2] | state[3]) == 0) {
    return absl::DataLossError("sampler state: all-zero RNG state");
  }
  Sampler s(p);
  s.rng_ = Rng(state);
  s.samples_drawn_ = GetU64(blob, 68);
  return s;
}

}  // namespace cortiq::model
