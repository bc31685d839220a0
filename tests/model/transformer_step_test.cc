// Transformer::Step: decode rows and prompt chunks of sequences in every
// attention mode share one forward, and every sequence gets the same bits it
// gets alone (chunks through Prefill, decode rows through DecodeBatch of
// one), whatever shares its steps. Bad steps are refused before anything
// changes.
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "core/attention/window_attention.h"
#include "core/model/transformer.h"
#include "gtest/gtest.h"
#include "tests/common/model_test_util.h"
#include "tests/math/test_util.h"

namespace cortiq::model {
namespace {

using cortiq::testing::TempModel;
using cortiq::testing::TestIds;

constexpr size_t kChunk = 64;  // the engine's default --prefill-chunk

enum class Mode { kExact, kInt8Kv, kO1, kQsa, kWindow };

struct Script {
  Mode mode;
  size_t prompt;      // tokens
  size_t decodes;     // decode rows after the prompt
  size_t start_step;  // the step it arrives at (mixed run)
};

// Checkpoint dtype x weight format.
class StepTest
    : public ::testing::TestWithParam<std::tuple<math::DType, LoadOptions::Weights>> {
 protected:
  void SetUp() override {
    LoadOptions lo;
    lo.weights = std::get<1>(GetParam());
    auto tf = Transformer::Load(TempModel("tiny-gqa", std::get<0>(GetParam())), lo);
    ASSERT_TRUE(tf.ok()) << tf.status();
    tf_ = *std::move(tf);
    V_ = size_t(tf_->config().vocab_size);
  }

  SequenceKv NewSeq(Mode mode) const {
    const ModelConfig& c = tf_->config();
    const size_t layers = size_t(c.num_hidden_layers);
    SequenceKv s(c, mode == Mode::kInt8Kv ? kv::KvMode::kInt8 : kv::KvMode::kF32);
    if (mode == Mode::kO1) {
      kv::O1Config o1;
      for (size_t l = 0; l < layers; ++l) o1.layers.push_back(l);
      o1.m = 16;
      o1.w = 32;
      o1.sink = 4;
      EXPECT_TRUE(s.EnableO1(o1).ok());
    } else if (mode == Mode::kQsa) {
      auto q = MakeQsaConfig("all", 8, 4, layers);
      EXPECT_TRUE(q.ok() && s.EnableQsa(*q).ok());
    } else if (mode == Mode::kWindow) {
      auto w = attention::MakeWindowConfig("all", 4, 24, layers);
      EXPECT_TRUE(w.ok() && s.EnableWindow(*w).ok());
    }
    return s;
  }

  // Sequence i's prompt and decode inputs.
  std::vector<int32_t> Ids(size_t i, const Script& sc) const {
    return TestIds(sc.prompt + sc.decodes, int64_t(V_), uint32_t(31 + i));
  }

  // Alone: the prompt in chunks of kChunk through Prefill, then one
  // DecodeBatch of one row per decode input. Every logits row, in order.
  std::vector<float> Alone(size_t i, const Script& sc) {
    const std::vector<int32_t> ids = Ids(i, sc);
    SequenceKv s = NewSeq(sc.mode);
    ForwardScratch scratch;
    std::vector<float> out, row(V_);
    for (size_t p = 0; p < sc.prompt; p += kChunk) {
      const size_t n = std::min(kChunk, sc.prompt - p);
      const bool last = p + n == sc.prompt;
      EXPECT_TRUE(tf_->Prefill(std::span(ids).subspan(p, n), s, scratch,
                               last ? row.data() : nullptr)
                      .ok());
    }
    out.insert(out.end(), row.begin(), row.end());
    for (size_t d = 0; d < sc.decodes; ++d) {
      SequenceKv* kvs[1] = {&s};
      const int32_t t[1] = {ids[sc.prompt + d]};
      EXPECT_TRUE(tf_->DecodeBatch(t, kvs, scratch, row.data()).ok());
      out.insert(out.end(), row.begin(), row.end());
    }
    return out;
  }

  // Mixed: a budget of `budget` rows per step, decode rows first, then whole
  // chunks in arrival order while they fit (the first always runs). Every
  // sequence's logits rows, in order; the number of steps with decode rows
  // and chunks together in *mixed_steps.
  std::vector<std::vector<float>> Mixed(const std::vector<Script>& scripts, size_t budget,
                                        size_t* mixed_steps) {
    const size_t n = scripts.size();
    std::vector<std::vector<float>> got(n);
    std::vector<SequenceKv> seqs;
    std::vector<std::vector<int32_t>> ids;
    for (size_t i = 0; i < n; ++i) {
      seqs.push_back(NewSeq(scripts[i].mode));
      ids.push_back(Ids(i, scripts[i]));
    }
    std::vector<size_t> absorbed(n, 0), decoded(n, 0);
    ForwardScratch scratch;
    std::vector<float> logits;
    std::vector<StepSegment> segs;
    std::vector<size_t> owner;  // segs' sequence
    *mixed_steps = 0;
    for (size_t step = 0; step < 200; ++step) {
      segs.clear();
      owner.clear();
      size_t rows = 0;
      for (size_t i = 0; i < n; ++i) {
        const Script& sc = scripts[i];
        if (absorbed[i] == sc.prompt && decoded[i] < sc.decodes) {
          segs.push_back(
              {&seqs[i], std::span(ids[i]).subspan(sc.prompt + decoded[i], 1), true, true});
          owner.push_back(i);
          ++rows;
        }
      }
      const size_t decode_rows = rows;
      for (size_t i = 0; i < n; ++i) {
        const Script& sc = scripts[i];
        if (step < sc.start_step) continue;
        for (size_t at = absorbed[i]; at < sc.prompt;) {
          const size_t len = std::min(kChunk, sc.prompt - at);
          if (rows + len > budget && rows > decode_rows) break;
          const bool last = at + len == sc.prompt;
          segs.push_back({&seqs[i], std::span(ids[i]).subspan(at, len), false, last});
          owner.push_back(i);
          rows += len;
          at += len;
        }
      }
      if (segs.empty()) break;
      if (decode_rows > 0 && segs.size() > decode_rows) ++*mixed_steps;
      size_t with_logits = 0;
      for (const StepSegment& g : segs) with_logits += g.logits;
      logits.assign(with_logits * V_, 0.0f);
      absl::Status st = tf_->Step(segs, scratch, logits.data());
      EXPECT_TRUE(st.ok()) << st;
      if (!st.ok()) break;
      size_t k = 0;
      for (size_t j = 0; j < segs.size(); ++j) {
        const size_t i = owner[j];
        if (segs[j].decode) {
          ++decoded[i];
        } else {
          absorbed[i] += segs[j].tokens.size();
        }
        if (segs[j].logits) {
          got[i].insert(got[i].end(), logits.begin() + k * V_, logits.begin() + (k + 1) * V_);
          ++k;
        }
      }
    }
    return got;
  }

  // Each script alone and all of them mixed give the same bits.
  void ExpectMixedEqualsAlone(const std::vector<Script>& scripts, size_t budget,
                              size_t min_mixed_steps) {
    const size_t n = scripts.size();
    std::vector<std::vector<float>> want(n);
    for (size_t i = 0; i < n; ++i) want[i] = Alone(i, scripts[i]);
    size_t mixed_steps = 0;
    const std::vector<std::vector<float>> got = Mixed(scripts, budget, &mixed_steps);
    EXPECT_GE(mixed_steps, min_mixed_steps) << "the script must mix decode rows and chunks";
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(got[i].size(), want[i].size()) << "sequence " << i;
      for (size_t r = 0; r < want[i].size() / V_; ++r) {
        EXPECT_EQ(0, std::memcmp(got[i].data() + r * V_, want[i].data() + r * V_, V_ * 4))
            << "sequence " << i << " (mode " << int(scripts[i].mode) << ", prompt "
            << scripts[i].prompt << "), logits row " << r;
      }
    }
  }

  std::unique_ptr<Transformer> tf_;
  size_t V_ = 0;
};

TEST_P(StepTest, EverySequenceGetsItsOwnBitsInMixedSteps) {
  // Steps with decode rows only, chunks only, several chunks of one
  // sequence, and short and GEMM-sized chunks together.
  ExpectMixedEqualsAlone({{Mode::kExact, 150, 6, 0},
                          {Mode::kInt8Kv, 70, 6, 0},
                          {Mode::kO1, 90, 5, 1},
                          {Mode::kQsa, 40, 7, 1},
                          {Mode::kWindow, 130, 6, 2},
                          {Mode::kExact, 5, 8, 3},
                          {Mode::kInt8Kv, 64, 4, 3}},
                         160, 3);
}

// A burst of short prompts: chunks on both sides of every path's GEMM
// threshold (math::ChunkGemmMinRows: 32 on the VDPBF16PS path, 64 on the
// others) share steps with each other and with decode rows, on every
// kernel tier this CPU has.
TEST_P(StepTest, ShortPromptsKeepTheirBitsOnEveryTier) {
  const std::vector<Script> scripts = {
      {Mode::kExact, 32, 4, 0}, {Mode::kExact, 31, 4, 0},  {Mode::kInt8Kv, 48, 3, 0},
      {Mode::kExact, 33, 3, 1}, {Mode::kWindow, 63, 3, 1}, {Mode::kExact, 32, 3, 2},
      {Mode::kQsa, 16, 3, 2},   {Mode::kExact, 64, 2, 3},
  };
  for (math::Isa isa : math::testing::SupportedIsas()) {
    math::testing::ScopedIsa scoped(isa);
    SCOPED_TRACE(math::IsaName(isa));
    ExpectMixedEqualsAlone(scripts, 128, 2);
  }
}

TEST_P(StepTest, BadStepsAreRefusedAndChangeNothing) {
  SequenceKv a = NewSeq(Mode::kExact), b = NewSeq(Mode::kExact);
  ForwardScratch scratch;
  std::vector<float> logits(4 * V_);
  const std::vector<int32_t> ids = TestIds(20, int64_t(V_), 5);
  ASSERT_TRUE(tf_->Prefill(std::span(ids).first(4), a, scratch, logits.data()).ok());
  const int32_t bad_id[1] = {int32_t(V_)};
  auto refused = [&](std::vector<StepSegment> segs, const std::string& needle) {
    absl::Status st = tf_->Step(segs, scratch, logits.data());
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << needle;
    EXPECT_NE(st.message().find(needle), std::string::npos) << st;
    EXPECT_EQ(a.position(), 4u);
    EXPECT_EQ(b.position(), 0u);
  };
  const auto one = std::span(ids).subspan(4, 1);
  const auto chunk = std::span(ids).subspan(8, 6);
  refused({}, "no rows");
  refused({{&b, chunk, false, true}, {&a, one, true, true}}, "comes before every chunk");
  refused({{&a, chunk, true, true}}, "holds one token");
  refused({{&a, one, true, true}, {&a, one, true, true}}, "appears twice");
  refused({{&a, one, true, true}, {&a, chunk, false, true}}, "appears twice");
  refused({{&b, chunk, false, false}, {&a, chunk, false, false}, {&b, chunk, false, true}},
          "appears twice");
  refused({{&a, one, true, true}, {&b, std::span(bad_id), false, true}}, "outside the vocabulary");
  refused({{nullptr, one, true, true}}, "no sequence");
  refused({{&b, std::span<const int32_t>(), false, true}}, "no tokens");
  // A sequence's consecutive chunks are one longer prefill.
  ASSERT_TRUE(tf_->Step(std::vector<StepSegment>{{&a, one, true, true},
                                                 {&b, chunk, false, false},
                                                 {&b, chunk, false, true}},
                        scratch, logits.data())
                  .ok());
  EXPECT_EQ(a.position(), 5u);
  EXPECT_EQ(b.position(), 12u);
}

INSTANTIATE_TEST_SUITE_P(
    Weights, StepTest,
    ::testing::Values(std::make_tuple(math::DType::kF32, LoadOptions::Weights::kCheckpoint),
                      std::make_tuple(math::DType::kBF16, LoadOptions::Weights::kCheckpoint),
                      std::make_tuple(math::DType::kF32, LoadOptions::Weights::kInt8)),
    [](const auto& info) {
      return std::string(math::DTypeName(std::get<0>(info.param))) +
             (std::get<1>(info.param) == LoadOptions::Weights::kInt8 ? "_int8" : "");
    });

}  // namespace
}  // namespace cortiq::model
