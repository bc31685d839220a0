// Sampler: greedy, top-k, top-p, min-p, repetition penalty, logit_bias,
// presence / frequency penalties and masked ids (against a reference written
// here), determinism, state serialisation (versions 1 and 2), distribution
// (fixed seeds: nothing here can flake), logprobs, validation, and no
// per-call allocation.
#include "core/model/sampler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <new>
#include <numeric>
#include <set>
#include <vector>

// Counts heap allocations made by this test binary, so the test can check that
// Sample() allocates nothing once warm.
namespace {
std::atomic<int64_t> g_allocations{0};
}  // namespace

// GCC 12 flags free() inside a replaced operator delete as mismatched with the
// (replaced) operator new once both are inlined; they do match here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace cortiq::model {
namespace {

using ::testing::HasSubstr;

constexpr float kInf = std::numeric_limits<float>::infinity();

Sampler Make(SamplingParams p) {
  auto s = Sampler::Create(p);
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(s).value();
}

// Deterministic pseudo-random logits for tests (values in [-4, 4)).
std::vector<float> RandomLogits(size_t n, uint64_t seed) {
  Rng r(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(r.Uniform() * 8.0 - 4.0);
  return v;
}

int32_t Argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// ---- RNG ----

TEST(RngTest, MatchesPublishedReferenceOutputs) {
  // xoshiro256** from state {1, 2, 3, 4} (reference C code by Blackman & Vigna).
  Rng r(std::array<uint64_t, 4>{1, 2, 3, 4});
  EXPECT_EQ(r.Next(), 11520u);
  EXPECT_EQ(r.Next(), 0u);
  EXPECT_EQ(r.Next(), 1509978240u);
  EXPECT_EQ(r.Next(), 1215971899390074240u);
  // splitmix64(1234567) -> 6457827717110365317, 3203168211198807973, ...: the
  // seeded state is those four words.
  Rng s(1234567);
  EXPECT_EQ(s.state(), (std::array<uint64_t, 4>{6457827717110365317u, 3203168211198807973u,
                                                9817491932198370423u, 4593380528125082431u}));
}

TEST(RngTest, UniformIsInUnitIntervalWith53Bits) {
  Rng r(std::array<uint64_t, 4>{1, 2, 3, 4});
  const double u = r.Uniform();  // first word 11520
  EXPECT_EQ(u, static_cast<double>(11520u >> 11) * 0x1.0p-53);
  Rng q(7);
  for (int i = 0; i < 10000; ++i) {
    double x = q.Uniform();
    ASSERT_GE(x, 0.0);
    ASSERT_LT(x, 1.0);
  }
}

// ---- Validate ----

TEST(SamplingParamsTest, ValidateNamesTheField) {
  struct Case {
    SamplingParams p;
    const char* field;
  };
  auto with = [](auto f) {
    SamplingParams p;
    f(p);
    return p;
  };
  const Case cases[] = {
      {with([](SamplingParams& p) { p.temperature = -0.1f; }), "temperature"},
      {with([](SamplingParams& p) { p.temperature = kInf; }), "temperature"},
      {with([](SamplingParams& p) { p.temperature = std::nanf(""); }), "temperature"},
      {with([](SamplingParams& p) { p.top_k = -1; }), "top_k"},
      {with([](SamplingParams& p) { p.top_p = -0.01f; }), "top_p"},
      {with([](SamplingParams& p) { p.top_p = 1.01f; }), "top_p"},
      {with([](SamplingParams& p) { p.top_p = std::nanf(""); }), "top_p"},
      {with([](SamplingParams& p) { p.min_p = -0.01f; }), "min_p"},
      {with([](SamplingParams& p) { p.min_p = 1.5f; }), "min_p"},
      {with([](SamplingParams& p) { p.repetition_penalty = 0.0f; }), "repetition_penalty"},
      {with([](SamplingParams& p) { p.repetition_penalty = kInf; }), "repetition_penalty"},
      {with([](SamplingParams& p) { p.presence_penalty = 2.01f; }), "presence_penalty"},
      {with([](SamplingParams& p) { p.presence_penalty = -kInf; }), "presence_penalty"},
      {with([](SamplingParams& p) { p.presence_penalty = std::nanf(""); }), "presence_penalty"},
      {with([](SamplingParams& p) { p.frequency_penalty = -2.5f; }), "frequency_penalty"},
      {with([](SamplingParams& p) { p.frequency_penalty = std::nanf(""); }), "frequency_penalty"},
      {with([](SamplingParams& p) {
         p.logit_bias = {{-1, 1.0f}};
       }),
       "logit_bias"},
      {with([](SamplingParams& p) {
         p.logit_bias = {{3, 1.0f}, {3, 2.0f}};
       }),
       "logit_bias"},
      {with([](SamplingParams& p) {
         p.logit_bias = {{4, 1.0f}, {3, 2.0f}};
       }),
       "logit_bias"},
      {with([](SamplingParams& p) {
         p.logit_bias = {{3, 100.5f}};
       }),
       "logit_bias[3]"},
      {with([](SamplingParams& p) {
         p.logit_bias = {{3, std::nanf("")}};
       }),
       "logit_bias[3]"},
      {with([](SamplingParams& p) { p.logit_bias.resize(kMaxLogitBias + 1); }), "at most 1024"},
  };
  for (const Case& c : cases) {
    absl::Status s = c.p.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.field));
    auto created = Sampler::Create(c.p);
    EXPECT_FALSE(created.ok()) << c.field;
  }
  EXPECT_TRUE(SamplingParams{}.Validate().ok());
  SamplingParams edge;
  edge.temperature = 0;
  edge.top_p = 1;
  edge.min_p = 1;
  edge.presence_penalty = -2;
  edge.frequency_penalty = 2;
  edge.logit_bias = {{0, -100.0f}, {7, 100.0f}};
  EXPECT_TRUE(edge.Validate().ok());
  for (size_t i = 0; i < kMaxLogitBias; ++i) {
    edge.logit_bias.resize(kMaxLogitBias);
    edge.logit_bias[i] = {static_cast<int32_t>(i), 1.0f};
  }
  EXPECT_TRUE(edge.Validate().ok());
}

// ---- Greedy and filters ----

TEST(SamplerTest, GreedyPicksArgmaxLowestIdOnTies) {
  Sampler s = Make({.temperature = 0});
  EXPECT_EQ(s.Sample(std::vector<float>{0.1f, 3.0f, -2.0f, 2.9f}, {}), 1);
  EXPECT_EQ(s.Sample(std::vector<float>{1.0f, 5.0f, 5.0f, 5.0f}, {}), 1);
  EXPECT_EQ(s.Sample(std::vector<float>{-kInf, -kInf, -1e30f}, {}), 2);
  // Greedy draws nothing from the RNG.
  EXPECT_EQ(s.rng().state(), Rng(0).state());
  EXPECT_EQ(s.samples_drawn(), 3u);
}

// A session keeps its sampler between calls (its random stream continues),
// and the store may hold thousands of idle sessions: the vocabulary-sized
// scratch is the sampling thread's, so a sampler holds none of it and a new
// one's first draw allocates nothing once the thread has sampled.
TEST(SamplerTest, ScratchIsTheThreadsNotTheSamplers) {
  const std::vector<float> logits = RandomLogits(50000, 7);
  const std::vector<int32_t> history = {3, 17, 3, 4096, 49999};
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 40;
  p.top_p = 0.9f;
  p.repetition_penalty = 1.1f;
  p.presence_penalty = 0.5f;
  Make(p).Sample(logits, history);  // sizes this thread's scratch
  std::vector<Sampler> kept;
  for (int i = 0; i < 50; ++i) kept.push_back(Make(p));
  const size_t before = g_allocations.load();
  for (Sampler& s : kept) s.Sample(logits, history, std::span(history).subspan(3));
  EXPECT_EQ(g_allocations.load(), before) << "a new sampler's first draw allocated";
}

TEST(SamplerTest, NonFiniteLogits) {
  Sampler s = Make({.temperature = 1.0f, .seed = 3});
  EXPECT_EQ(s.Sample(std::vector<float>{std::nanf(""), 0.0f, std::nanf("")}, {}), 1);
  EXPECT_EQ(s.Sample(std::vector<float>{1.0f, kInf, kInf}, {}), 1);
  EXPECT_EQ(s.Sample(std::vector<float>{-kInf, -kInf}, {}), 0);
  EXPECT_EQ(s.Sample(std::vector<float>{}, {}), -1);
  // A temperature so small that x / t overflows: still the argmax.
  Sampler cold = Make({.temperature = 1e-38f});
  EXPECT_EQ(cold.Sample(std::vector<float>{1.0f, 2.0f, 0.0f}, {}), 1);
}

TEST(SamplerTest, TopK1EqualsGreedy) {
  for (uint64_t seed = 0; seed < 50; ++seed) {
    std::vector<float> logits = RandomLogits(1000, seed);
    Sampler s = Make({.temperature = 1.5f, .top_k = 1, .seed = seed});
    EXPECT_EQ(s.Sample(logits, {}), Argmax(logits)) << seed;
  }
}

TEST(SamplerTest, TinyTopPEqualsGreedy) {
  for (uint64_t seed = 0; seed < 50; ++seed) {
    std::vector<float> logits = RandomLogits(1000, seed + 100);
    Sampler s = Make({.temperature = 1.0f, .top_p = 1e-6f, .seed = seed});
    EXPECT_EQ(s.Sample(logits, {}), Argmax(logits)) << seed;
  }
}

TEST(SamplerTest, MinPOneEqualsGreedy) {
  std::vector<float> logits = RandomLogits(500, 9);
  Sampler s = Make({.temperature = 2.0f, .min_p = 1.0f, .seed = 1});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s.Sample(logits, {}), Argmax(logits));
}

std::map<int32_t, int> Histogram(Sampler& s, const std::vector<float>& logits, int n,
                                 std::span<const int32_t> history = {}) {
  std::map<int32_t, int> h;
  for (int i = 0; i < n; ++i) ++h[s.Sample(logits, history)];
  return h;
}

std::set<int32_t> Keys(const std::map<int32_t, int>& h) {
  std::set<int32_t> k;
  for (const auto& [id, n] : h) k.insert(id);
  return k;
}

TEST(SamplerTest, TopKKeepsTheKLargest) {
  const std::vector<float> logits = {0.0f, 2.0f, 1.0f, 3.0f, 2.5f, -1.0f};
  Sampler s = Make({.temperature = 1.0f, .top_k = 3, .seed = 5});
  EXPECT_EQ(Keys(Histogram(s, logits, 3000)), (std::set<int32_t>{1, 3, 4}));
}

TEST(SamplerTest, TopPKeepsTheNucleus) {
  // Probabilities 0.5, 0.3, 0.15, 0.05.
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f),
                                     std::log(0.05f)};
  Sampler a = Make({.temperature = 1.0f, .top_p = 0.75f, .seed = 1});
  EXPECT_EQ(Keys(Histogram(a, logits, 3000)), (std::set<int32_t>{0, 1}));
  Sampler b = Make({.temperature = 1.0f, .top_p = 0.85f, .seed = 1});
  EXPECT_EQ(Keys(Histogram(b, logits, 3000)), (std::set<int32_t>{0, 1, 2}));
  Sampler c = Make({.temperature = 1.0f, .top_p = 0.4f, .seed = 1});
  EXPECT_EQ(Keys(Histogram(c, logits, 300)), (std::set<int32_t>{0}));
  // 0 (OpenAI's range is [0, 1]): the most likely token only.
  Sampler d = Make({.temperature = 1.0f, .top_p = 0.0f, .seed = 1});
  EXPECT_EQ(Keys(Histogram(d, logits, 300)), (std::set<int32_t>{0}));
}

TEST(SamplerTest, MinPFilters) {
  // Relative to the top (0.5): 0.3 -> 0.6, 0.15 -> 0.3, 0.05 -> 0.1.
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f),
                                     std::log(0.05f)};
  Sampler a = Make({.temperature = 1.0f, .min_p = 0.25f, .seed = 2});
  EXPECT_EQ(Keys(Histogram(a, logits, 3000)), (std::set<int32_t>{0, 1, 2}));
  Sampler b = Make({.temperature = 1.0f, .min_p = 0.5f, .seed = 2});
  EXPECT_EQ(Keys(Histogram(b, logits, 3000)), (std::set<int32_t>{0, 1}));
  Sampler c = Make({.temperature = 1.0f, .min_p = 0.05f, .seed = 2});
  EXPECT_EQ(Keys(Histogram(c, logits, 5000)), (std::set<int32_t>{0, 1, 2, 3}));
}

TEST(SamplerTest, RepetitionPenaltyChangesTheChoice) {
  Sampler s = Make({.temperature = 0, .repetition_penalty = 1.2f});
  // Positive logits are divided: 2.0 / 1.2 = 1.67 < 1.9.
  EXPECT_EQ(s.Sample(std::vector<float>{2.0f, 1.9f, 0.0f}, std::vector<int32_t>{0}), 1);
  // Negative logits are multiplied: -1.0 * 1.2 = -1.2 < -1.1.
  EXPECT_EQ(s.Sample(std::vector<float>{-1.0f, -1.1f}, std::vector<int32_t>{0}), 1);
  // Without the token in history: unchanged.
  EXPECT_EQ(s.Sample(std::vector<float>{2.0f, 1.9f}, std::vector<int32_t>{1}), 0);
  // Once per distinct id: 2.0 / 1.2 = 1.67 > 1.5 (three times would be 1.16).
  EXPECT_EQ(s.Sample(std::vector<float>{2.0f, 1.5f}, std::vector<int32_t>{0, 0, 0}), 0);
  // Out-of-vocabulary history ids are ignored.
  EXPECT_EQ(s.Sample(std::vector<float>{2.0f, 1.9f}, std::vector<int32_t>{-1, 7}), 0);
  // A penalty below 1 encourages repetition.
  Sampler enc = Make({.temperature = 0, .repetition_penalty = 0.5f});
  EXPECT_EQ(enc.Sample(std::vector<float>{2.0f, 1.5f}, std::vector<int32_t>{1}), 1);
}

// ---- Determinism and state ----

std::vector<int32_t> RunSteps(Sampler& s, int steps, size_t vocab = 300) {
  std::vector<int32_t> out;
  for (int i = 0; i < steps; ++i) {
    std::vector<float> logits = RandomLogits(vocab, 1000 + i);
    out.push_back(s.Sample(logits, out));
  }
  return out;
}

const SamplingParams kRich = {.temperature = 0.9f,
                              .top_k = 50,
                              .top_p = 0.9f,
                              .min_p = 0.02f,
                              .repetition_penalty = 1.1f,
                              .seed = 12345};

TEST(SamplerTest, SameSeedSameSequence) {
  Sampler a = Make(kRich), b = Make(kRich);
  EXPECT_EQ(RunSteps(a, 200), RunSteps(b, 200));
  SamplingParams other = kRich;
  other.seed = 54321;
  Sampler c = Make(kRich), d = Make(other);
  EXPECT_NE(RunSteps(c, 200), RunSteps(d, 200));
}

// Pins the exact token stream, so a change in any step of the pipeline (or in
// the RNG) that would break migrated sessions shows up here.
TEST(SamplerTest, SequenceIsPinned) {
  Sampler s = Make(kRich);
  EXPECT_EQ(RunSteps(s, 12),
            std::vector<int32_t>({23, 68, 117, 285, 287, 166, 212, 63, 141, 183, 119, 128}));
}

TEST(SamplerTest, SerializeMidSequenceContinuesIdentically) {
  Sampler whole = Make(kRich);
  std::vector<int32_t> expected = RunSteps(whole, 100);

  Sampler first = Make(kRich);
  std::vector<int32_t> got;
  for (int i = 0; i < 40; ++i) {
    std::vector<float> logits = RandomLogits(300, 1000 + i);
    got.push_back(first.Sample(logits, got));
  }
  const std::string blob = first.SerializeState();
  EXPECT_EQ(blob.size(), Sampler::kStateBytesV1);  // no version-2 parameters
  auto resumed = Sampler::Deserialize(blob);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->params(), kRich);
  EXPECT_EQ(resumed->samples_drawn(), 40u);
  EXPECT_EQ(resumed->SerializeState(), blob);
  for (int i = 40; i < 100; ++i) {
    std::vector<float> logits = RandomLogits(300, 1000 + i);
    got.push_back(resumed->Sample(logits, got));
  }
  EXPECT_EQ(got, expected);
}

// A continued conversation that changes its parameters: the copy draws the
// very RNG words the original would have drawn next, under the new params.
TEST(SamplerTest, WithParamsKeepsTheRandomStreamAndChangesTheParams) {
  Sampler first = Make(kRich);
  const std::vector<int32_t> head = RunSteps(first, 40);
  SamplingParams changed = {.temperature = 1.3f, .top_k = 0, .top_p = 0.95f, .seed = 777};
  auto next = first.WithParams(changed);
  ASSERT_TRUE(next.ok()) << next.status();
  // The new parameters, the stream's seed, the RNG words and the count carry over.
  changed.seed = kRich.seed;
  EXPECT_EQ(next->params(), changed);
  EXPECT_EQ(next->rng().state(), first.rng().state());
  EXPECT_EQ(next->samples_drawn(), 40u);
  EXPECT_EQ(first.params(), kRich);  // the original is untouched

  // Reference: a sampler created with the new parameters whose RNG has
  // advanced by the same 40 words (each non-greedy Sample draws one).
  Sampler ref = Make(changed);
  const std::vector<float> flat(300, 0.0f);
  for (int i = 0; i < 40; ++i) ref.Sample(flat, {});
  ASSERT_EQ(ref.rng().state(), next->rng().state());
  std::vector<int32_t> a = head, b = head;
  for (int i = 40; i < 120; ++i) {
    const std::vector<float> logits = RandomLogits(300, 1000 + i);
    a.push_back(next->Sample(logits, a));
    b.push_back(ref.Sample(logits, b));
  }
  EXPECT_EQ(a, b);
  // ... and it is not the stream a fresh sampler with those parameters draws.
  Sampler fresh = Make(changed);
  std::vector<int32_t> c = head;
  for (int i = 40; i < 120; ++i) {
    const std::vector<float> logits = RandomLogits(300, 1000 + i);
    c.push_back(fresh.Sample(logits, c));
  }
  EXPECT_NE(a, c);
}

TEST(SamplerTest, WithParamsRejectsWhatCreateRejects) {
  Sampler s = Make(kRich);
  s.Sample(RandomLogits(300, 1), {});
  SamplingParams bad = kRich;
  bad.top_p = -0.5f;
  auto refused = s.WithParams(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status(), Sampler::Create(bad).status());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("top_p"));
  bad = kRich;
  bad.temperature = -1.0f;
  EXPECT_EQ(s.WithParams(bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.samples_drawn(), 1u);  // nothing changed
}

TEST(SamplerTest, SerializedLayoutIsLittleEndianAndVersioned) {
  Sampler s = Make(kRich);
  const std::string b = s.SerializeState();
  EXPECT_EQ(b.substr(0, 4), "CQSM");
  // No version-2 parameter: written as version 1, 76 bytes.
  EXPECT_EQ(static_cast<uint8_t>(b[4]), 1);
  EXPECT_EQ(b[5], 0);
  EXPECT_EQ(b.size(), 76u);
  // top_k = 50 at offset 12; seed 12345 = 0x3039 at offset 28.
  EXPECT_EQ(static_cast<uint8_t>(b[12]), 50);
  EXPECT_EQ(static_cast<uint8_t>(b[28]), 0x39);
  EXPECT_EQ(static_cast<uint8_t>(b[29]), 0x30);

  SamplingParams p = kRich;
  p.presence_penalty = 0.5f;   // 0x3f000000
  p.frequency_penalty = -1.0f;  // 0xbf800000
  p.logit_bias = {{7, 2.0f}, {300, -100.0f}};
  const std::string v2 = Make(p).SerializeState();
  EXPECT_EQ(static_cast<uint8_t>(v2[4]), Sampler::kStateVersion);
  EXPECT_EQ(Sampler::kStateVersion, 2u);
  ASSERT_EQ(v2.size(), 76u + 12u + 2u * 8u);
  EXPECT_EQ(v2.substr(0, 4), b.substr(0, 4));
  EXPECT_EQ(v2.substr(8, 68), b.substr(8, 68));  // the version-1 fields, unchanged
  auto u32 = [&](size_t off) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t(uint8_t(v2[off + i])) << (8 * i);
    return v;
  };
  EXPECT_EQ(u32(76), 0x3f000000u);
  EXPECT_EQ(u32(80), 0xbf800000u);
  EXPECT_EQ(u32(84), 2u);
  EXPECT_EQ(u32(88), 7u);
  EXPECT_EQ(u32(92), 0x40000000u);  // 2.0f
  EXPECT_EQ(u32(96), 300u);
  EXPECT_EQ(u32(100), 0xc2c80000u);  // -100.0f
}

// A version-1 blob written by hand, byte by byte (what a version-1 build
// exported), reads as a sampler with the penalties and bias off, and
// continues its stream exactly.
TEST(SamplerTest, Version1BlobStillDeserializes) {
  Sampler ref = Make(kRich);
  const std::vector<int32_t> head = RunSteps(ref, 25);
  std::string v1 = "CQSM";
  auto put = [&](uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) v1.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  auto bits = [](float f) { return uint64_t{std::bit_cast<uint32_t>(f)}; };
  put(1, 4);
  put(bits(kRich.temperature), 4);
  put(static_cast<uint32_t>(kRich.top_k), 4);
  put(bits(kRich.top_p), 4);
  put(bits(kRich.min_p), 4);
  put(bits(kRich.repetition_penalty), 4);
  put(kRich.seed, 8);
  for (uint64_t w : ref.rng().state()) put(w, 8);
  put(ref.samples_drawn(), 8);
  ASSERT_EQ(v1.size(), Sampler::kStateBytesV1);
  auto s = Sampler::Deserialize(v1);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->params(), kRich);
  EXPECT_EQ(s->params().presence_penalty, 0.0f);
  EXPECT_EQ(s->params().frequency_penalty, 0.0f);
  EXPECT_TRUE(s->params().logit_bias.empty());
  EXPECT_EQ(s->SerializeState(), v1);  // still written as version 1
  std::vector<int32_t> a = head, b = head;
  for (int i = 25; i < 60; ++i) {
    std::vector<float> logits = RandomLogits(300, 1000 + i);
    a.push_back(ref.Sample(logits, a));
    b.push_back(s->Sample(logits, b));
  }
  EXPECT_EQ(a, b);
  // A version-1 blob must be exactly 76 bytes.
  EXPECT_EQ(Sampler::Deserialize(v1 + std::string(12, '\0')).status().code(),
            absl::StatusCode::kDataLoss);
}

// Version 2 carries the penalties and the bias: a sampler resumed from its
// blob mid-call samples exactly what the original would have.
TEST(SamplerTest, Version2RoundTripContinuesWithThePenalties) {
  SamplingParams p = kRich;
  p.presence_penalty = 0.7f;
  p.frequency_penalty = 1.3f;
  p.logit_bias = {{3, 5.0f}, {17, -3.5f}, {250, 2.25f}};
  auto run = [&](Sampler& s, std::vector<int32_t>& out, int from, int to) {
    for (int i = from; i < to; ++i) {
      std::vector<float> logits = RandomLogits(300, 2000 + i);
      out.push_back(s.Sample(logits, out, out));
    }
  };
  Sampler whole = Make(p);
  std::vector<int32_t> want;
  run(whole, want, 0, 80);
  Sampler first = Make(p);
  std::vector<int32_t> got;
  run(first, got, 0, 30);
  const std::string blob = first.SerializeState();
  EXPECT_EQ(blob.size(), Sampler::kStateBytesV1 + Sampler::kStateV2FixedBytes + 3 * 8);
  auto resumed = Sampler::Deserialize(blob);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->params(), p);
  EXPECT_EQ(resumed->SerializeState(), blob);
  run(*resumed, got, 30, 80);
  EXPECT_EQ(got, want);
  // The penalties did something: without them the stream differs.
  Sampler plain = Make(kRich);
  std::vector<int32_t> other;
  run(plain, other, 0, 80);
  EXPECT_NE(other, want);

  // The largest blob: kMaxLogitBias entries.
  SamplingParams full = kRich;
  for (size_t i = 0; i < kMaxLogitBias; ++i) {
    full.logit_bias.emplace_back(static_cast<int32_t>(3 * i), static_cast<float>(i % 200) - 100);
  }
  const std::string big = Make(full).SerializeState();
  EXPECT_EQ(big.size(), Sampler::kMaxStateBytes);
  auto back = Sampler::Deserialize(big);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->params(), full);
}

TEST(SamplerTest, DeserializeRejectsBadVersion2Input) {
  SamplingParams p = kRich;
  p.presence_penalty = 0.5f;
  p.logit_bias = {{3, 5.0f}, {17, -3.5f}};
  const std::string good = Make(p).SerializeState();
  ASSERT_EQ(good.size(), 76u + 12u + 16u);
  auto code = [](const std::string& b) { return Sampler::Deserialize(b).status().code(); };
  EXPECT_EQ(code(good.substr(0, 76)), absl::StatusCode::kDataLoss);  // v2 without its fields
  EXPECT_EQ(code(good.substr(0, 87)), absl::StatusCode::kDataLoss);
  EXPECT_EQ(code(good.substr(0, good.size() - 1)), absl::StatusCode::kDataLoss);
  EXPECT_EQ(code(good + "12345678"), absl::StatusCode::kDataLoss);
  std::string count = good;
  count[84] = 3;  // says three entries, holds two
  EXPECT_EQ(code(count), absl::StatusCode::kDataLoss);
  count[84] = 0;
  count[85] = 0x10;  // 4096 entries: more than kMaxLogitBias, refused before any read
  auto huge = Sampler::Deserialize(count);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(huge.status().message()), HasSubstr("at most 1024"));
  std::string order = good;
  order[88] = 17;  // ids 17, 17: not distinct
  auto dup = Sampler::Deserialize(order);
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(dup.status().message()), HasSubstr("logit_bias"));
  std::string penalty = good;
  penalty[79] = 0x7f;  // presence_penalty's top byte -> a huge value
  EXPECT_EQ(code(penalty), absl::StatusCode::kDataLoss);
  std::string bias = good;
  bias[95] = static_cast<char>(0x7f);  // the first bias -> NaN / huge
  bias[94] = static_cast<char>(0xff);
  EXPECT_EQ(code(bias), absl::StatusCode::kDataLoss);
}

TEST(SamplerTest, DeserializeRejectsBadInput) {
  Sampler s = Make(kRich);
  const std::string good = s.SerializeState();

  auto short_blob = Sampler::Deserialize(good.substr(0, 40));
  EXPECT_EQ(short_blob.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(short_blob.status().message()), HasSubstr("bytes"));

  EXPECT_EQ(Sampler::Deserialize(good + "x").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(Sampler::Deserialize("").status().code(), absl::StatusCode::kDataLoss);

  std::string bad_magic = good;
  bad_magic[0] = 'X';
  EXPECT_EQ(Sampler::Deserialize(bad_magic).status().code(), absl::StatusCode::kDataLoss);

  std::string future = good;
  future[4] = 3;
  auto v = Sampler::Deserialize(future);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("version 3"));
  future[4] = 0;
  EXPECT_EQ(Sampler::Deserialize(future).status().code(), absl::StatusCode::kFailedPrecondition);

  std::string bad_param = good;
  bad_param[19] = static_cast<char>(0xff);  // top_p's top byte -> NaN
  auto p = Sampler::Deserialize(bad_param);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("top_p"));

  std::string zero_rng = good;
  std::fill(zero_rng.begin() + 36, zero_rng.begin() + 68, '\0');
  EXPECT_EQ(Sampler::Deserialize(zero_rng).status().code(), absl::StatusCode::kDataLoss);
}

// ---- Distribution ----

// Pearson chi-square of observed counts against expected probabilities.
double ChiSquare(const std::map<int32_t, int>& h, const std::vector<double>& p, int n) {
  double chi = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0) continue;
    auto it = h.find(static_cast<int32_t>(i));
    const double o = it == h.end() ? 0 : it->second;
    const double e = n * p[i];
    chi += (o - e) * (o - e) / e;
  }
  return chi;
}

std::vector<double> Softmax(const std::vector<float>& logits, float t) {
  std::vector<double> p(logits.size());
  double m = *std::max_element(logits.begin(), logits.end()) / t, z = 0;
  for (size_t i = 0; i < p.size(); ++i) z += p[i] = std::exp(logits[i] / t - m);
  for (double& x : p) x /= z;
  return p;
}

TEST(SamplerTest, TemperatureSamplingFollowsSoftmax) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, 3.0f, -1.0f};
  const int n = 50000;
  for (float t : {0.7f, 1.0f, 2.0f}) {
    Sampler s = Make({.temperature = t, .seed = 777});
    std::map<int32_t, int> h = Histogram(s, logits, n);
    // 4 degrees of freedom: P(chi2 > 18.47) = 0.001. The seed is fixed, so
    // this is a deterministic check that the sampler follows the law.
    EXPECT_LT(ChiSquare(h, Softmax(logits, t), n), 18.47) << "t=" << t;
  }
}

TEST(SamplerTest, TopKSamplingFollowsRenormalisedSoftmax) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, 3.0f, -1.0f};
  const int n = 40000;
  Sampler s = Make({.temperature = 1.0f, .top_k = 3, .seed = 4242});
  std::map<int32_t, int> h = Histogram(s, logits, n);
  std::vector<double> p = Softmax(logits, 1.0f);
  p[2] = p[4] = 0;
  const double z = p[0] + p[1] + p[3];
  for (double& x : p) x /= z;
  EXPECT_EQ(Keys(h), (std::set<int32_t>{0, 1, 3}));
  EXPECT_LT(ChiSquare(h, p, n), 13.82);  // 2 dof, p = 0.001
}

// The pipeline's exact choice, recomputed naively (full sort), on a large
// vocabulary where top-p needs several growing chunks.
int32_t Reference(const std::vector<float>& logits, const SamplingParams& p, Rng& rng) {
  const size_t n = logits.size();
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = logits[i] / p.temperature;
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
  size_t count = p.top_k > 0 ? std::min<size_t>(p.top_k, n) : n;
  const float maxx = x[order[0]];
  std::vector<float> w(n);
  double total = 0;
  for (size_t c = 0; c < count; ++c) total += w[order[c]] = std::exp(x[order[c]] - maxx);
  if (p.top_p < 1) {
    double cum = 0;
    for (size_t c = 0; c < count; ++c) {
      cum += w[order[c]];
      if (cum >= p.top_p * total) {
        count = c + 1;
        break;
      }
    }
  }
  std::vector<int32_t> kept;
  for (size_t c = 0; c < count; ++c) {
    if (w[order[c]] >= p.min_p) kept.push_back(order[c]);
  }
  // Without top-k/top-p the sampler never sorts: it walks ids in order.
  if (p.top_p == 1 && p.top_k == 0) std::sort(kept.begin(), kept.end());
  total = 0;
  for (int32_t id : kept) total += w[id];
  const double target = rng.Uniform() * total;
  double cum = 0;
  for (int32_t id : kept) {
    cum += w[id];
    if (target < cum) return id;
  }
  return kept.back();
}

TEST(SamplerTest, MatchesNaiveReferenceOnLargeVocabulary) {
  const std::vector<SamplingParams> params = {
      {.temperature = 1.0f, .top_p = 0.95f, .seed = 1},
      {.temperature = 0.6f, .top_p = 0.8f, .seed = 2},
      {.temperature = 1.3f, .top_k = 40, .top_p = 0.9f, .seed = 3},
      {.temperature = 1.0f, .top_k = 2000, .seed = 4},
      {.temperature = 0.8f, .top_p = 0.99f, .min_p = 0.001f, .seed = 5},
      {.temperature = 2.0f, .seed = 6},
  };
  for (const SamplingParams& p : params) {
    Sampler s = Make(p);
    Rng ref_rng(p.seed);
    for (int step = 0; step < 30; ++step) {
      std::vector<float> logits = RandomLogits(20000, 50 + step);
      ASSERT_EQ(s.Sample(logits, {}), Reference(logits, p, ref_rng))
          << "seed " << p.seed << " step " << step;
    }
  }
}

// ---- logit_bias, presence / frequency penalties, masked ids ----

// The definitions, written out independently of the sampler: OpenAI's
// logit_bias (added) and penalties (x -= f * count + p * (count > 0)) over the
// completion, then HF's repetition penalty once per distinct history id, then
// the masked ids at -inf.
std::vector<float> ReferenceAdjusted(const std::vector<float>& logits, const SamplingParams& p,
                                     const std::vector<int32_t>& history,
                                     const std::vector<int32_t>& completion,
                                     const std::vector<int32_t>& masked) {
  const int32_t n = static_cast<int32_t>(logits.size());
  std::vector<float> x = logits;
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < n) x[id] = x[id] + bias;
  }
  std::map<int32_t, int> count;
  for (int32_t id : completion) {
    if (id >= 0 && id < n) ++count[id];
  }
  for (const auto& [id, c] : count) {
    x[id] = x[id] - (p.frequency_penalty * static_cast<float>(c) +
                     p.presence_penalty * (c > 0 ? 1.0f : 0.0f));
  }
  std::set<int32_t> distinct;
  for (int32_t id : history) {
    if (id >= 0 && id < n) distinct.insert(id);
  }
  for (int32_t id : distinct) {
    x[id] = x[id] > 0 ? x[id] / p.repetition_penalty : x[id] * p.repetition_penalty;
  }
  for (int32_t id : masked) {
    if (id >= 0 && id < n) x[id] = -kInf;
  }
  return x;
}

int32_t ReferenceGreedy(const std::vector<float>& x) {
  int32_t best = 0;  // the first maximum: lowest id on ties
  for (int32_t i = 1; i < static_cast<int32_t>(x.size()); ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

// Random controls for one case: a completion with repeats (and ids outside
// the vocabulary), a bias over a few ids, penalties of either sign, masked ids.
struct Controls {
  SamplingParams params;
  std::vector<int32_t> history, completion, masked;
};

Controls RandomControls(uint64_t seed, size_t vocab, float temperature) {
  Rng r(seed);
  auto pick = [&](size_t k) { return static_cast<int32_t>(r.Next() % k); };
  auto uniform = [&](double lo, double hi) { return static_cast<float>(lo + (hi - lo) * r.Uniform()); };
  Controls c;
  c.params.temperature = temperature;
  c.params.seed = seed;
  c.params.top_k = seed % 3 == 0 ? 40 : 0;
  c.params.top_p = seed % 4 == 1 ? 0.9f : 1.0f;
  c.params.min_p = seed % 5 == 2 ? 0.01f : 0.0f;
  c.params.repetition_penalty = seed % 2 == 0 ? 1.15f : 1.0f;
  c.params.presence_penalty = uniform(-2, 2);
  c.params.frequency_penalty = uniform(-2, 2);
  std::map<int32_t, float> bias;
  for (int i = pick(12); i > 0; --i) bias[pick(vocab)] = uniform(-100, 100);
  c.params.logit_bias.assign(bias.begin(), bias.end());
  for (int i = 0, len = 5 + pick(30); i < len; ++i) c.history.push_back(pick(vocab));
  // The completion draws from few ids so that counts exceed one.
  for (int i = 0, len = pick(40); i < len; ++i) c.completion.push_back(pick(vocab / 10 + 1));
  if (seed % 7 == 0) c.completion.push_back(static_cast<int32_t>(vocab) + 3);
  c.history.insert(c.history.end(), c.completion.begin(), c.completion.end());
  for (int i = pick(5); i > 0; --i) c.masked.push_back(pick(vocab));
  return c;
}

TEST(SamplerTest, GreedyAdjustmentsMatchTheDefinitions) {
  for (uint64_t seed = 1; seed <= 400; ++seed) {
    const size_t vocab = 50 + seed % 300;
    const Controls c = RandomControls(seed, vocab, /*temperature=*/0);
    std::vector<float> logits = RandomLogits(vocab, 9000 + seed);
    Sampler s = Make(c.params);
    ASSERT_EQ(s.Sample(logits, c.history, c.completion, c.masked),
              ReferenceGreedy(ReferenceAdjusted(logits, c.params, c.history, c.completion,
                                                c.masked)))
        << "seed " << seed;
  }
}

TEST(SamplerTest, SampledAdjustmentsMatchTheDefinitions) {
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    const size_t vocab = 50 + seed % 300;
    const Controls c = RandomControls(seed, vocab, 0.5f + static_cast<float>(seed % 4) * 0.4f);
    SamplingParams plain = c.params;  // the warpers alone, for Reference
    plain.presence_penalty = plain.frequency_penalty = 0;
    plain.logit_bias.clear();
    Sampler s = Make(c.params);
    Rng ref_rng(seed);
    for (int step = 0; step < 5; ++step) {
      std::vector<float> logits = RandomLogits(vocab, 7000 + 10 * seed + step);
      const std::vector<float> x =
          ReferenceAdjusted(logits, c.params, c.history, c.completion, c.masked);
      ASSERT_EQ(s.Sample(logits, c.history, c.completion, c.masked), Reference(x, plain, ref_rng))
          << "seed " << seed << " step " << step;
    }
  }
}

TEST(SamplerTest, AdjustmentsByHand) {
  const std::vector<float> logits = {1.0f, 0.9f, 0.8f, 0.0f};
  // logit_bias moves the argmax.
  Sampler bias = Make({.temperature = 0, .logit_bias = {{2, 0.5f}}});
  EXPECT_EQ(bias.Sample(logits, {}), 2);
  // Frequency: 1.0 - 0.06 x 2 = 0.88 < 0.9; presence counts once: 1.0 - 0.05 = 0.95.
  Sampler freq = Make({.temperature = 0, .frequency_penalty = 0.06f});
  EXPECT_EQ(freq.Sample(logits, {}, std::vector<int32_t>{0, 0}), 1);
  EXPECT_EQ(freq.Sample(logits, {}, std::vector<int32_t>{0}), 0);  // 0.94 > 0.9
  Sampler pres = Make({.temperature = 0, .presence_penalty = 0.05f});
  EXPECT_EQ(pres.Sample(logits, {}, std::vector<int32_t>{0, 0, 0, 0}), 0);  // 0.95
  // Only the completion counts, not the history before it.
  EXPECT_EQ(freq.Sample(logits, std::vector<int32_t>{0, 0, 0}, {}), 0);
  // A negative penalty encourages repetition.
  Sampler neg = Make({.temperature = 0, .presence_penalty = -1.0f});
  EXPECT_EQ(neg.Sample(logits, {}, std::vector<int32_t>{3}), 0);  // 0.0 + 1.0 ties 1.0: lowest id
  EXPECT_EQ(neg.Sample(logits, {}, std::vector<int32_t>{2}), 2);  // 1.8
  // Masked ids are never chosen, in greedy and sampled mode.
  Sampler g = Make({.temperature = 0});
  EXPECT_EQ(g.Sample(logits, {}, {}, std::vector<int32_t>{0, 1}), 2);
  Sampler t = Make({.temperature = 1.0f, .seed = 3});
  const std::vector<int32_t> masked = {0, 2};
  for (int i = 0; i < 500; ++i) {
    const int32_t id = t.Sample(logits, {}, {}, masked);
    ASSERT_TRUE(id == 1 || id == 3) << id;
  }
  // A bias of +100 on a masked id does not bring it back.
  Sampler bm = Make({.temperature = 0, .logit_bias = {{3, 100.0f}}});
  EXPECT_EQ(bm.Sample(logits, {}, {}, std::vector<int32_t>{3}), 0);
}

TEST(SamplerTest, NoHeapAllocationAfterFirstCall) {
  Sampler s = Make(kRich);
  std::vector<float> logits = RandomLogits(50000, 3);
  std::vector<int32_t> history = {1, 2, 3, 4, 5, 2, 1};
  s.Sample(logits, history);  // sizes the scratch
  SamplingParams nucleus = kRich;
  nucleus.top_k = 0;
  nucleus.top_p = 0.999f;  // needs many chunks of the partial sort
  Sampler t = Make(nucleus);
  t.Sample(logits, history);
  SamplingParams adjusted = kRich;
  adjusted.presence_penalty = 0.5f;
  adjusted.frequency_penalty = 0.25f;
  adjusted.logit_bias = {{2, 3.0f}, {40, -1.0f}};
  Sampler u = Make(adjusted);
  const std::vector<int32_t> masked = {2, 9};
  u.Sample(logits, history, history, masked);
  const int64_t before = g_allocations.load();
  for (int i = 0; i < 20; ++i) {
    s.Sample(logits, history);
    t.Sample(logits, history);
    u.Sample(logits, history, history, masked);
  }
  EXPECT_EQ(g_allocations.load(), before);
}

// ---- Logprobs ----

TEST(LogprobsTest, LogSoftmaxOfScaledLogits) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -5.0f};
  auto r = ComputeLogprobs(logits, 0.5f, /*chosen=*/2, /*top_n=*/3);
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<double> p = Softmax(logits, 0.5f);
  EXPECT_EQ(r->chosen.id, 2);
  EXPECT_NEAR(r->chosen.logprob, std::log(p[2]), 1e-5);
  ASSERT_EQ(r->top.size(), 3u);
  EXPECT_EQ(r->top[0].id, 1);  // tie with 3: lower id first
  EXPECT_EQ(r->top[1].id, 3);
  EXPECT_EQ(r->top[2].id, 2);
  EXPECT_NEAR(r->top[0].logprob, std::log(p[1]), 1e-5);

  // Temperature 0 means raw logits; the full top list sums to 1.
  auto all = ComputeLogprobs(logits, 0.0f, 0, 10);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->top.size(), logits.size());
  double sum = 0;
  for (const TokenLogprob& t : all->top) sum += std::exp(t.logprob);
  EXPECT_NEAR(sum, 1.0, 1e-5);
  EXPECT_NEAR(all->chosen.logprob, std::log(Softmax(logits, 1.0f)[0]), 1e-5);
}

TEST(LogprobsTest, RejectsBadArguments) {
  const std::vector<float> logits = {1.0f, 2.0f};
  EXPECT_EQ(ComputeLogprobs({}, 1.0f, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  auto r = ComputeLogprobs(logits, 1.0f, 2, 1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("chosen"));
  EXPECT_THAT(std::string(ComputeLogprobs(logits, 1.0f, 0, -1).status().message()),
              HasSubstr("top_n"));
  EXPECT_THAT(std::string(ComputeLogprobs(logits, -1.0f, 0, 1).status().message()),
              HasSubstr("temperature"));
}

TEST(LogprobsTest, NonFinite) {
  auto r = ComputeLogprobs(std::vector<float>{kInf, 0.0f, kInf}, 1.0f, 0, 3);
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->chosen.logprob, -std::log(2.0), 1e-6);
  EXPECT_EQ(r->top[2].logprob, -kInf);
  auto nan = ComputeLogprobs(std::vector<float>{std::nanf(""), 0.0f}, 1.0f, 0, 0);
  ASSERT_TRUE(nan.ok());
  EXPECT_EQ(nan->chosen.logprob, -kInf);
}

}  // namespace
}  // namespace cortiq::model
