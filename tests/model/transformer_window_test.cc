// Sink + window attention through the whole forward pass: with a window
// that covers the whole sequence it IS exact attention (bit for bit, both
// below the tiled-prefill size), its memory stays constant however long the
// sequence grows, and a sequence's logits do not depend on what shares its
// decode batch (exact and window sequences mixed).
#include <cstring>
#include <span>
#include <vector>

#include "core/attention/exact_attention.h"
#include "core/model/transformer.h"
#include "gtest/gtest.h"
#include "tests/common/model_test_util.h"

namespace cortiq::model {
namespace {

class WindowFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tf = Transformer::Load(cortiq::testing::TempModel("tiny-gqa", math::DType::kF32, 3));
    ASSERT_TRUE(tf.ok()) << tf.status();
    tf_ = std::move(*tf);
    V_ = size_t(tf_->config().vocab_size);
  }
  const ModelConfig& config() const { return tf_->config(); }
  SequenceKv Window(size_t sink, size_t window) {
    SequenceKv s(config(), kv::KvMode::kF32);
    auto c = attention::MakeWindowConfig("all", sink, window, size_t(config().num_hidden_layers));
    EXPECT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE(s.EnableWindow(*c).ok());
    return s;
  }
  void Decode(std::vector<SequenceKv*> seqs, std::vector<int32_t> tokens, std::vector<float>& out) {
    out.resize(seqs.size() * V_);
    ASSERT_TRUE(tf_->DecodeBatch(tokens, seqs, scratch_, out.data()).ok());
  }

  std::unique_ptr<Transformer> tf_;
  size_t V_ = 0;
  ForwardScratch scratch_;
};

TEST_F(WindowFixture, AWindowCoveringTheSequenceIsExactAttention) {
  const std::vector<int32_t> ids = cortiq::testing::TestIds(70, config().vocab_size, 5);
  SequenceKv exact(config(), kv::KvMode::kF32), window = Window(4, 100);
  std::vector<float> a(V_), b(V_);
  // Below the tiled size, so exact prefill runs the same row kernels.
  const size_t rows = attention::kTiledAttentionMinRows - 1;
  const auto prompt = std::span(ids).first(rows);
  ASSERT_TRUE(tf_->Prefill(prompt, exact, scratch_, a.data()).ok());
  ASSERT_TRUE(tf_->Prefill(prompt, window, scratch_, b.data()).ok());
  ASSERT_EQ(0, std::memcmp(a.data(), b.data(), V_ * sizeof(float)));
  for (size_t i = rows; i < ids.size(); ++i) {
    Decode({&exact}, {ids[i]}, a);
    Decode({&window}, {ids[i]}, b);
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), V_ * sizeof(float))) << i;
  }
}

TEST_F(WindowFixture, MemoryIsConstantAndBatchesDoNotChangeAnySequence) {
  const std::vector<int32_t> ids = cortiq::testing::TestIds(300, config().vocab_size, 9);
  SequenceKv alone = Window(2, 16), mixed = Window(2, 16), exact(config(), kv::KvMode::kF32);
  std::vector<float> l(V_), m;
  const auto prompt = std::span(ids).first(100);
  ASSERT_TRUE(tf_->Prefill(prompt, alone, scratch_, l.data()).ok());
  ASSERT_TRUE(tf_->Prefill(prompt, mixed, scratch_, l.data()).ok());
  ASSERT_TRUE(tf_->Prefill(prompt, exact, scratch_, l.data()).ok());
  const size_t bytes = alone.MemoryBytes();
  EXPECT_GT(bytes, 0u);
  for (size_t i = 100; i < ids.size(); ++i) {
    Decode({&alone}, {ids[i]}, l);
    Decode({&exact, &mixed}, {ids[i], ids[i]}, m);
    ASSERT_EQ(0, std::memcmp(l.data(), m.data() + V_, V_ * sizeof(float))) << i;
  }
  EXPECT_EQ(alone.position(), ids.size());
  EXPECT_EQ(alone.MemoryBytes(), bytes);  // 300 positions, the bytes of 100
  EXPECT_GT(exact.MemoryBytes(), bytes);
  // Past the window, rows are gone: no rollback, and the sequence says so.
  EXPECT_EQ(alone.TruncateLast(1).code(), absl::StatusCode::kFailedPrecondition);
  alone.Release();
  EXPECT_EQ(alone.MemoryBytes(), 0u);
}

}  // namespace
}  // namespace cortiq::model
