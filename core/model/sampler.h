// Sampler: turns one step's logits into a token id -- logit bias, OpenAI's
// presence / frequency penalties, repetition penalty, masked ids, greedy,
// temperature, top-k, top-p, min-p -- deterministically for a seed, with its
// whole state (parameters, RNG words, sample count) serialisable so that a
// continued or migrated session samples exactly what it would have.
//
// Pipeline of Sample(), in this order (OpenAI's logit adjustments first, as
// vLLM applies them, then Hugging Face's warpers); steps 1-4 apply in greedy
// mode too:
//   1. logit_bias: x[id] = logit[id] + bias, for each (id, bias) entry;
//   2. presence / frequency penalties (OpenAI's definition) over the ids of
//      `completion` (the tokens this call sampled so far), with c = count of
//      id in it: x[id] -= frequency_penalty x c + presence_penalty x (c > 0);
//   3. repetition penalty, once per distinct id in `history` (HF: x > 0 ->
//      x / penalty, else x * penalty);
//   4. masked ids (a call under its min_tokens: EOS and stop ids) -> -inf;
//   5. temperature == 0 -> greedy: argmax, lowest id on ties; no RNG draw;
//   6. x = x / temperature;
//   7. top-k: keep the k largest (ties broken by lower id);
//   8. top-p: keep the shortest prefix of the kept tokens, in descending order
//      (ties by lower id), whose probability mass reaches top_p (always >= 1
//      token);
//   9. min-p: of those, keep tokens whose probability is >= min_p x the top
//      token's probability;
//  10. draw u in [0, 1) (one RNG word) and pick by inverse CDF over the kept
//      tokens (unnormalised weights exp(x - max), summed in double).
// Non-finite logits: NaN counts as -inf; if any logit is +inf the lowest such
// id is returned; if every logit is -inf/NaN, id 0 is returned.
//
// Determinism: the RNG is xoshiro256** seeded through splitmix64 (both fully
// specified, see Rng) and the uniform is u = (word >> 11) * 2^-53, so the random
// stream is bit-identical on every machine and compiler. The token chosen also
// depends on the logits (which the math kernels may compute differently on
// different ISAs) and on std::exp, so bit-identical *tokens* across machines
// need bit-identical logits; on one build and CPU they are exact.
//
// Cost: O(vocab + history + completion + logit_bias + masked) per call plus
// O(k log k) for top-k and O(m log m) for top-p where m is the number of
// tokens the nucleus needed. After the first call (or a vocabulary size
// change) Sample allocates nothing: scratch buffers sized to the vocabulary
// are reused (the penalties' counts live in one, kept all-zero between calls).
//
// Thread-safety: a Sampler is mutable state owned by one session; not
// thread-safe. Move-only (its scratch is vocab-sized).
//
// Example:
//   CORTIQ_ASSIGN_OR_RETURN(Sampler s, Sampler::Create(params));
//   int32_t tok = s.Sample(logits, history);
//   std::string blob = s.SerializeState();   // ... later, elsewhere:
//   CORTIQ_ASSIGN_OR_RETURN(Sampler s2, Sampler::Deserialize(blob));
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace cortiq::model {

// Most logit_bias entries a SamplingParams may hold (OpenAI allows 300; the
// HTTP front and gRPC share this bound: session::kMaxLogitBias).
inline constexpr size_t kMaxLogitBias = 1024;

struct SamplingParams {
  float temperature = 1.0f;         // >= 0, finite; 0 = greedy
  int32_t top_k = 0;                // >= 0; 0 = off
  float top_p = 1.0f;               // (0, 1]; 1 = off
  float min_p = 0.0f;               // [0, 1]; 0 = off
  float repetition_penalty = 1.0f;  // > 0, finite; 1 = off
  uint64_t seed = 0;
  // OpenAI's penalties over this call's completion tokens, finite, in
  // [-2, 2]; 0 = off.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // (token id, bias) added to the raw logits: at most kMaxLogitBias entries,
  // ids >= 0, distinct and ascending, bias finite in [-100, 100]. Ids must be
  // in the vocabulary; that is the request plan's check (the vocabulary is
  // the model's) -- Sample ignores an id outside the logits.
  std::vector<std::pair<int32_t, float>> logit_bias{};

  static constexpr float kMaxPenalty = 2.0f;
  static constexpr float kMaxBias = 100.0f;

  // INVALID_ARGUMENT naming the field and its limit (every field but the
  // logit_bias ids' upper bound, see above).
  absl::Status Validate() const;
  // Whether steps 1-2 of the pipeline do anything.
  bool AdjustsLogits() const {
    return presence_penalty != 0 || frequency_penalty != 0 || !logit_bias.empty();
  }
  bool operator==(const SamplingParams&) const = default;
};

// xoshiro256** 1.0 (Blackman & Vigna, https://prng.di.unimi.it/), state seeded
// with four successive outputs of splitmix64(seed). Fully specified, portable.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  // Restores a saved state; the all-zero state is invalid (the generator would
  // stay at zero) -- Deserialize refuses it.
  explicit Rng(const std::array<uint64_t, 4>& state) : s_(state) {}

  uint64_t Next();
  // (Next() >> 11) * 2^-53: uniform on [0, 1) with 53 random bits, exact in
  // IEEE double on any platform.
  double Uniform();
  const std::array<uint64_t, 4>& state() const { return s_; }

 private:
  std::array<uint64_t, 4> s_;
};

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
};

struct Logprobs {
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;  // descending logprob, ties by lower id
};

// Log-probabilities of the *model's* distribution at `temperature`:
// log_softmax(logits / temperature) (temperature 0 is taken as 1, i.e. raw
// logits), before repetition penalty and before any top-k/top-p/min-p
// truncation -- so they describe the model, not the sampler's filters.
// Returns the chosen token's entry and the `top_n` most likely tokens.
// INVALID_ARGUMENT when logits is empty, chosen is out of range, top_n < 0 or
// temperature is negative/non-finite. O(vocab log top_n).
absl::StatusOr<Logprobs> ComputeLogprobs(std::span<const float> logits, float temperature,
                                         int32_t chosen, int top_n);

class Sampler {
 public:
  // INVALID_ARGUMENT when params.Validate() fails.
  static absl::StatusOr<Sampler> Create(const SamplingParams& params);

  Sampler(Sampler&&) noexcept = default;
  Sampler& operator=(Sampler&&) noexcept = default;
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  // One token id in [0, logits.size()), or -1 when logits is empty (see the
  // banner for the pipeline). `history`: every token of the conversation
  // (the repetition penalty's); `completion`: the tokens this call sampled
  // so far, a suffix of history (the presence / frequency penalties');
  // `masked`: ids that must not be sampled now (logit -> -inf: the engine's
  // EOS and stop ids while a call is under its min_tokens). Ids outside the
  // vocabulary are ignored; the spans are read during the call only. If
  // every logit ends at -inf, id 0 is returned.
  int32_t Sample(std::span<const float> logits, std::span<const int32_t> history,
                 std::span<const int32_t> completion = {}, std::span<const int32_t> masked = {});

  // A copy of this sampler with new parameters and the same random stream:
  // the RNG words and samples_drawn() carry over, so the copy draws exactly
  // the words this sampler would have drawn next (a continued conversation
  // that changes its temperature keeps its stream). The seed stays the one
  // the stream started from (params.seed is ignored). INVALID_ARGUMENT, as
  // from Create, when params.Validate() fails. O(1).
  absl::StatusOr<Sampler> WithParams(const SamplingParams& params) const;

  const SamplingParams& params() const { return params_; }
  uint64_t samples_drawn() const { return samples_drawn_; }
  const Rng& rng() const { return rng_; }

  // Versioned little-endian blob. Version 2 (kStateVersion) has a variable
  // length: kStateBytesV1 + kStateV2FixedBytes + 8 x logit_bias entries, at
  // most kMaxStateBytes. A sampler whose penalties and logit_bias are all
  // off is written as version 1 (the first 76 bytes, version field 1),
  // byte for byte what a version-1 build writes, so its session still moves
  // to such a node:
  //   off  0  "CQSM"              magic
  //   off  4  u32 version         (2)
  //   off  8  f32 temperature     (IEEE-754 bits)
  //   off 12  i32 top_k
  //   off 16  f32 top_p
  //   off 20  f32 min_p
  //   off 24  f32 repetition_penalty
  //   off 28  u64 seed
  //   off 36  u64 rng[4]          xoshiro256** state
  //   off 68  u64 samples_drawn
  //   off 76  f32 presence_penalty            (version 2 from here on)
  //   off 80  f32 frequency_penalty
  //   off 84  u32 count                       logit_bias entries, <= kMaxLogitBias
  //   off 88  count x { i32 id, f32 bias }    ascending ids
  // A version-1 blob is read as a sampler with penalties and bias off.
  // Scratch buffers are not state and are not serialised.
  std::string SerializeState() const;
  // DATA_LOSS on a wrong length for the version and count, bad magic,
  // invalid parameters or the all-zero RNG state; FAILED_PRECONDITION on an
  // unknown version. O(blob).
  static absl::StatusOr<Sampler> Deserialize(std::string_view blob);

  static constexpr uint32_t kStateVersion = 2;
  static constexpr size_t kStateBytesV1 = 76;
  static constexpr size_t kStateV2FixedBytes = 12;  // penalties + count
  static constexpr size_t kMaxStateBytes =
      kStateBytesV1 + kStateV2FixedBytes + 8 * kMaxLogitBias;

 private:
  explicit Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

  // Scratch, sized to the vocabulary (not state): the sampling thread's
  // (ThreadScratch), so an idle session's sampler holds none of it (2.6 MB
  // at a 152k vocabulary that no session gauge counted) and a new call's
  // first token faults nothing in.
  struct Scratch {
    std::vector<float> x;         // (vocab) processed logits
    std::vector<float> w;         // (vocab) exp(x - max) for candidates
    std::vector<int32_t> idx;     // (vocab) candidate ids
    std::vector<uint8_t> seen;    // (vocab) repetition-penalty dedup marks, kept all-zero
    std::vector<uint32_t> count;  // (vocab) completion counts (penalties), kept all-zero
  };
  static Scratch& ThreadScratch();
  // This thread's scratch, sized to `vocab`.
  static Scratch& EnsureScratch(size_t vocab);
  // Pipeline steps 1-2 on s.x: logit_bias, presence / frequency penalties.
  void AdjustLogits(Scratch& s, std::span<const int32_t> completion) const;
  // Index order used everywhere: larger x first, then lower id.
  static bool Before(const Scratch& s, int32_t a, int32_t b);

  SamplingParams params_;
  Rng rng_;
  uint64_t samples_drawn_ = 0;
};

}  // namespace cortiq::model
