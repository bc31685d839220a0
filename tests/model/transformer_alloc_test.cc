// A decode step with a warm ForwardScratch and reserved caches performs no
// heap allocation (counted with a replaced global operator new; this binary
// holds only this test so the counter sees nothing else).
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <new>

#include "absl/strings/str_cat.h"
#include "core/model/random_checkpoint.h"
#include "core/model/transformer.h"
#include "gtest/gtest.h"
#include "tests/common/alloc_counter.h"
#include "tests/common/model_test_util.h"

namespace cortiq::model {
namespace {

TEST(TransformerAllocTest, DecodeStepDoesNotAllocate) {
  const std::string dir = cortiq::testing::TempModel("tiny-gqa");
  auto config = NamedShape("tiny-gqa");
  ASSERT_TRUE(config.ok());
  util::ThreadPool pool(2);
  auto tf = Transformer::Load(dir, &pool);
  ASSERT_TRUE(tf.ok()) << tf.status();
  const size_t V = config->vocab_size, B = 4;
  std::vector<SequenceKv> seqs;
  std::vector<SequenceKv*> ptrs;
  ForwardScratch scratch;
  std::vector<float> logits(B * V);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7};
  for (size_t b = 0; b < B; ++b) {
    seqs.emplace_back(*config, b == 1 ? kv::KvMode::kInt8 : kv::KvMode::kF32);
    if (b == 3) {  // sink + window: its constant rows are allocated once
      auto w = attention::MakeWindowConfig("all", 2, 4, size_t(config->num_hidden_layers));
      ASSERT_TRUE(w.ok());
      ASSERT_TRUE(seqs.back().EnableWindow(*w).ok());
    }
    seqs.back().Reserve(64);
  }
  for (auto& s : seqs) {
    ptrs.push_back(&s);
    ASSERT_TRUE((*tf)->Prefill(prompt, s, scratch, logits.data()).ok());
  }
  std::vector<int32_t> next = {10, 20, 30, 40};
  // Warm-up: grows the scratch to B rows and every thread's attention buffer.
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE((*tf)->DecodeBatch(next, ptrs, scratch, logits.data()).ok());
  EXPECT_EQ(cortiq::testing::AllocationsDuring([&] {
              for (int i = 0; i < 20; ++i) {
                ASSERT_TRUE((*tf)->DecodeBatch(next, ptrs, scratch, logits.data()).ok());
              }
            }),
            0u)
      << "heap allocations during 20 decode steps (f32, int8, f32, window)";
}

// A warm engine step (Transformer::Step) with decode rows and a prompt chunk
// together allocates nothing either.
TEST(TransformerAllocTest, MixedStepDoesNotAllocate) {
  auto config = NamedShape("tiny-gqa");
  ASSERT_TRUE(config.ok());
  util::ThreadPool pool(2);
  auto tf = Transformer::Load(cortiq::testing::TempModel("tiny-gqa"), &pool);
  ASSERT_TRUE(tf.ok()) << tf.status();
  const size_t V = config->vocab_size;
  std::vector<SequenceKv> seqs;
  for (size_t b = 0; b < 4; ++b) {
    seqs.emplace_back(*config, b == 1 ? kv::KvMode::kInt8 : kv::KvMode::kF32);
    seqs.back().Reserve(256);
  }
  ForwardScratch scratch;
  std::vector<float> logits(4 * V);
  const std::vector<int32_t> prompt = cortiq::testing::TestIds(24, int64_t(V), 3);
  for (size_t b = 0; b < 3; ++b) {
    ASSERT_TRUE((*tf)->Prefill(prompt, seqs[b], scratch, logits.data()).ok());
  }
  const std::vector<int32_t> next = {10, 20, 30};
  auto step = [&] {
    std::array<StepSegment, 4> segs = {
        StepSegment{&seqs[0], std::span(next).subspan(0, 1), true, true},
        StepSegment{&seqs[1], std::span(next).subspan(1, 1), true, true},
        StepSegment{&seqs[2], std::span(next).subspan(2, 1), true, true},
        StepSegment{&seqs[3], std::span(prompt).first(20), false, true}};
    return (*tf)->Step(segs, scratch, logits.data());
  };
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(step().ok());
  EXPECT_EQ(cortiq::testing::AllocationsDuring([&] {
              for (int i = 0; i < 5; ++i) ASSERT_TRUE(step().ok());
            }),
            0u)
      << "heap allocations during 5 steps of 3 decode rows and a 20-token chunk";
}

}  // namespace
}  // namespace cortiq::model
