// Helpers shared by the model tests: random checkpoints written once per
// process (CTest runs every test case of a binary as its own process, in
// parallel, so a shared directory would be written by several at once),
// deterministic token ids, and the relative error used across the suite.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/model/random_checkpoint.h"
#include "core/model/sequence_kv.h"
#include "core/model/transformer.h"
#include "core/tokenizer/tokenizer.h"
#include "gtest/gtest.h"

namespace cortiq::testing {

// The exact caches of a sequence's layers, in order (every layer's state
// must keep one: exact, O(1), QSA).
inline std::vector<std::reference_wrapper<const kv::LayerKvCache>> Caches(
    const model::SequenceKv& s) {
  std::vector<std::reference_wrapper<const kv::LayerKvCache>> out;
  for (size_t l = 0; l < s.num_layers(); ++l) {
    const kv::LayerKvCache* c = s.layer(l).cache();
    EXPECT_NE(c, nullptr) << "layer " << l << " keeps no exact cache";
    out.push_back(std::cref(*c));
  }
  return out;
}

// A random checkpoint of a named shape under the test temp dir, written on
// first use by this process.
inline std::string TempModel(const std::string& shape, math::DType dtype = math::DType::kF32,
                             uint64_t seed = 3) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/cortiq_model_", getpid(), "_", shape,
                                       "_", int(dtype), "_", seed);
  if (!std::filesystem::exists(dir + "/config.json")) {
    auto config = model::NamedShape(shape);
    EXPECT_TRUE(config.ok()) << config.status();
    model::RandomCheckpointOptions o;
    o.dtype = dtype;
    o.seed = seed;
    absl::Status s = model::WriteRandomCheckpoint(*config, dir, o);
    EXPECT_TRUE(s.ok()) << s;
  }
  return dir;
}

// Loads TempModel(shape) and its tokenizer into *model and *tok (gtest
// failures when either does not load).
inline void LoadTempModel(const std::string& shape, std::unique_ptr<model::Transformer>* model,
                          std::unique_ptr<tokenizer::Tokenizer>* tok) {
  const std::string dir = TempModel(shape);
  auto m = model::Transformer::Load(dir);
  ASSERT_TRUE(m.ok()) << m.status();
  *model = *std::move(m);
  auto t = tokenizer::Tokenizer::FromFile(dir + "/tokenizer.json");
  ASSERT_TRUE(t.ok()) << t.status();
  *tok = std::make_unique<tokenizer::Tokenizer>(*std::move(t));
}

// n pseudo-random ids in [0, vocab) (an LCG: the same on every machine).
inline std::vector<int32_t> TestIds(size_t n, int64_t vocab, uint32_t seed) {
  std::vector<int32_t> ids(n);
  uint32_t s = seed;
  for (auto& id : ids) {
    s = s * 1664525u + 1013904223u;
    id = int32_t((s >> 8) % uint32_t(vocab));
  }
  return ids;
}

// max |a - b| / max |b|: the error relative to the logits' scale.
template <typename B>
double MaxRelErr(const float* a, const B* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num = std::max(num, std::abs(double(a[i]) - double(b[i])));
    den = std::max(den, std::abs(double(b[i])));
  }
  return num / den;
}

}  // namespace cortiq::testing
