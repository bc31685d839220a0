// Shared by the GGUF fuzz target (tests/fuzz/gguf_fuzz.cc) and the corpus
// regression test (tests/model/gguf_corpus_test.cc): the calls one input goes
// through, and what counts as a finding.
//
// RunGgufInput(bytes): GgufFile::FromBuffer over the input, every accessor
// on what it accepts, ModelConfigFromGguf, and — when the metadata maps onto
// a ModelConfig — the input written to `tmp_path` and opened as a Checkpoint
// (name mapping, K-quant conversion, llama un-permutation), then, for a small
// enough model, Transformer::Load and a 2-token prefill.
//
// A finding (returned as INTERNAL naming the call; the fuzz target aborts on
// it, the test fails):
//   * GgufFile refusing with a code other than DATA_LOSS;
//   * an accessor on an accepted file failing with a code other than
//     NOT_FOUND / INVALID_ARGUMENT / UNIMPLEMENTED, or a view outside the
//     input;
//   * ModelConfigFromGguf / Checkpoint::Open / Transformer::Load refusing with
//     a code other than DATA_LOSS / NOT_FOUND / INVALID_ARGUMENT /
//     UNIMPLEMENTED.
// Sanitizer reports and crashes are findings too (the sanitizers report them).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/model/checkpoint.h"
#include "core/model/gguf.h"
#include "core/model/gguf_model.h"
#include "core/model/transformer.h"

namespace cortiq::fuzz {

// How far an input got.
struct GgufRun {
  bool parsed = false;  // GgufFile accepted it
  bool config = false;  // ModelConfigFromGguf accepted it
  bool opened = false;  // Checkpoint::Open accepted it
  bool loaded = false;  // Transformer::Load accepted it (and a prefill ran)
};

namespace gguf_internal {

inline absl::Status Finding(const std::string& what, const absl::Status& s) {
  return absl::InternalError(absl::StrCat(what, ": ", s.ToString()));
}

inline absl::Status CheckAccessor(const std::string& what, const absl::Status& s) {
  if (s.ok() || absl::IsNotFound(s) || absl::IsInvalidArgument(s) || absl::IsUnimplemented(s)) {
    return absl::OkStatus();
  }
  return Finding(absl::StrCat(what, " failed with an unexpected code"), s);
}

inline absl::Status CheckModelRefusal(const std::string& what, const absl::Status& s) {
  if (s.ok() || absl::IsDataLoss(s) || absl::IsNotFound(s) || absl::IsInvalidArgument(s) ||
      absl::IsUnimplemented(s)) {
    return absl::OkStatus();
  }
  return Finding(absl::StrCat(what, " refused with an unexpected code"), s);
}

inline absl::Status ExerciseMetadata(const model::GgufFile& f) {
  for (const std::string& k : f.keys()) {
    for (const absl::Status& s :
         {f.GetString(k).status(), f.GetU32(k).status(), f.GetI32(k).status(), f.GetU64(k).status(),
          f.GetF32(k).status(), f.GetBool(k).status(), f.GetInt(k).status(), f.GetFloat(k).status(),
          f.GetStringArray(k).status(), f.GetIntArray(k).status(), f.GetFloatArray(k).status(),
          f.ArrayLength(k).status()}) {
      if (absl::Status c = CheckAccessor(absl::StrCat("metadata key '", k, "'"), s); !c.ok()) {
        return c;
      }
    }
  }
  return absl::OkStatus();
}

inline absl::Status ExerciseTensors(const model::GgufFile& f) {
  std::vector<float> row;
  for (const model::GgufFile::TensorInfo& t : f.tensors()) {
    const std::span<const uint8_t> raw = f.RawData(t.name);
    if (raw.data() == nullptr || raw.size() != t.nbytes ||
        f.data_start() + t.offset + t.nbytes > f.file_size()) {
      return absl::InternalError(absl::StrCat("RawData of '", t.name, "': outside the input"));
    }
    auto v = f.Get(t.name);
    if (absl::Status c = CheckAccessor(absl::StrCat("Get '", t.name, "'"), v.status()); !c.ok()) {
      return c;
    }
    if (v.ok() && v->nbytes != t.nbytes) {
      return absl::InternalError(absl::StrCat("Get '", t.name, "': ", v->nbytes,
                                              " bytes, the "
                                              "tensor info says ",
                                              t.nbytes));
    }
    // The first row, dequantized (touches every byte of it).
    const size_t cols = static_cast<size_t>(t.ne[0]);
    if (model::GgufDequantizable(t.type) && cols <= (size_t{1} << 20)) {
      row.resize(cols);
      model::DequantizeGgufRows(t.type, raw.data(), cols, row.data());
    }
  }
  return absl::OkStatus();
}

inline absl::Status ExerciseModel(std::string_view bytes, const std::string& path, GgufRun& run) {
  FILE* out = std::fopen(path.c_str(), "wb");
  if (out == nullptr) return absl::OkStatus();  // no temp dir: nothing to check
  const bool written = std::fwrite(bytes.data(), 1, bytes.size(), out) == bytes.size();
  if (std::fclose(out) != 0 || !written) return absl::OkStatus();
  auto ck = model::Checkpoint::Open(path);
  if (absl::Status c = CheckModelRefusal("Checkpoint::Open", ck.status()); !c.ok()) return c;
  if (!ck.ok()) return absl::OkStatus();
  run.opened = true;
  const model::ModelConfig& c = ck->config();
  // Small models only: Load sizes norms, RoPE tables and scratch by them.
  if (c.hidden_size > 1024 || c.intermediate_size > 4096 || c.num_hidden_layers > 4 ||
      c.vocab_size > 4096 || c.num_attention_heads > 64 || c.head_dim > 256) {
    return absl::OkStatus();
  }
  auto m = model::Transformer::Load(path);
  if (absl::Status s = CheckModelRefusal("Transformer::Load", m.status()); !s.ok()) return s;
  if (!m.ok()) return absl::OkStatus();
  run.loaded = true;
  model::SequenceKv kv(c, kv::KvMode::kF32);
  model::ForwardScratch s;
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  const int32_t ids[2] = {0, static_cast<int32_t>(c.vocab_size - 1)};
  (void)(*m)->Prefill(ids, kv, s, logits.data(), nullptr);
  return absl::OkStatus();
}

}  // namespace gguf_internal

// See the banner. `tmp_path`: a file the model path may (over)write.
inline absl::Status RunGgufInput(std::string_view bytes, const std::string& tmp_path,
                                 GgufRun* run_out = nullptr) {
  GgufRun run;
  auto f = model::GgufFile::FromBuffer(bytes, "fuzz.gguf");
  absl::Status result = absl::OkStatus();
  if (!f.ok()) {
    if (!absl::IsDataLoss(f.status())) {
      result =
          gguf_internal::Finding("GgufFile refused with a code other than DATA_LOSS", f.status());
    }
  } else {
    run.parsed = true;
    result = gguf_internal::ExerciseMetadata(*f);
    if (result.ok()) result = gguf_internal::ExerciseTensors(*f);
    if (result.ok()) {
      auto config = model::ModelConfigFromGguf(*f);
      result = gguf_internal::CheckModelRefusal("ModelConfigFromGguf", config.status());
      if (result.ok() && config.ok()) {
        run.config = true;
        result = gguf_internal::ExerciseModel(bytes, tmp_path, run);
      }
    }
  }
  if (run_out != nullptr) *run_out = run;
  return result;
}

}  // namespace cortiq::fuzz
