// libFuzzer target for the two parsers of hostile migration input:
// session::ImportSessionWire (the CQSW stream) and LayerKvCache::ImportWire
// (the CQKV layer blob). Build, corpus and campaign: tests/fuzz/README.md.
//
// Each input runs as is and again with its checksums recomputed
// (FixWireChecksums, tests/fuzz/wire_fuzz_util.h), so mutations reach the
// parsers behind the CRC32C checks. What counts as a finding:
//   * any sanitizer report (ASan: out-of-bounds, use-after-free, leaks;
//     UBSan: every check, no recovery) or crash;
//   * an allocation over -rss_limit_mb / -malloc_limit_mb (libFuzzer);
//   * an error other than DATA_LOSS / FAILED_PRECONDITION;
//   * an accepted input that leaves an object the rest of the code cannot
//     use: its re-export must succeed and import again, and a session must
//     take one decode step (an error status is fine there, a crash is not).
// A finding aborts with the reason on stderr.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "core/kv/layer_kv_cache.h"
#include "core/model/random_checkpoint.h"
#include "core/model/transformer.h"
#include "core/session/session_store.h"
#include "core/session/session_wire.h"
#include "tests/fuzz/wire_fuzz_util.h"

namespace cortiq::fuzz {
namespace {

[[noreturn]] void Finding(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "wire_import_fuzz FINDING: %s: %s\n", what.c_str(),
               status.ToString().c_str());
  std::abort();
}

// The two codes a refusal may carry (docs/WIRE_FORMAT.md, "Import").
void CheckRefusal(const std::string& what, const absl::Status& status) {
  if (status.ok() || absl::IsDataLoss(status) || absl::IsFailedPrecondition(status)) return;
  Finding(what + " refused with an unexpected code", status);
}

struct Globals {
  std::unique_ptr<model::Transformer> model;
  model::ForwardScratch scratch;
  std::vector<float> logits;
};

// Loaded once per process: a "tiny" random checkpoint in a temp dir (the
// same shape and seed the corpus generator and the corpus test use).
Globals& G() {
  static Globals* g = [] {
    setenv("CORTIQ_THREADS", "1", /*overwrite=*/0);
    const std::string dir =
        (std::filesystem::temp_directory_path() / ("cortiq_wire_fuzz_" + std::to_string(getpid())))
            .string();
    auto config = model::NamedShape(kWireFuzzShape);
    if (!config.ok()) Finding("NamedShape", config.status());
    if (absl::Status s = model::WriteRandomCheckpoint(*config, dir, {}); !s.ok()) {
      Finding("WriteRandomCheckpoint", s);
    }
    auto m = model::Transformer::Load(dir);
    if (!m.ok()) Finding("Transformer::Load", m.status());
    std::filesystem::remove_all(dir);  // the model is in memory now
    auto* out = new Globals;
    out->model = *std::move(m);
    out->logits.resize(static_cast<size_t>(out->model->config().vocab_size));
    return out;
  }();
  return *g;
}

void FuzzLayerBlob(std::string_view blob, kv::KvMode mode) {
  const kv::WireImportExpect expect{kFuzzQHeads, kFuzzMaxPositions};
  kv::LayerKvCache cache(kFuzzKvHeads, kFuzzHeadDim, mode);
  const size_t fresh_bytes = cache.MemoryBytes();
  const absl::Status st = cache.ImportWire(blob, expect);
  CheckRefusal("LayerKvCache::ImportWire", st);
  if (!st.ok()) {
    if (cache.MemoryBytes() != fresh_bytes || cache.seq_len() != 0) {
      Finding("a refused layer import changed the cache", st);
    }
    return;
  }
  (void)cache.MemoryBytes();
  // What was accepted must travel on: re-export, import, re-export again
  // gives the same bytes.
  absl::StatusOr<std::string> again = cache.ExportWire({});
  if (!again.ok()) Finding("re-export of an imported layer", again.status());
  kv::LayerKvCache copy(kFuzzKvHeads, kFuzzHeadDim, mode);
  if (absl::Status s = copy.ImportWire(*again, expect); !s.ok()) {
    Finding("import of a re-exported layer", s);
  }
  absl::StatusOr<std::string> third = copy.ExportWire({});
  if (!third.ok() || *third != *again) Finding("re-export is not stable", third.status());
}

void FuzzSession(std::string_view wire) {
  Globals& g = G();
  absl::StatusOr<std::unique_ptr<session::Session>> s =
      session::ImportSessionWire(wire, *g.model, kWireFuzzFingerprint, "fuzz");
  CheckRefusal("ImportSessionWire", s.status());
  if (!s.ok()) return;
  session::Session& sess = **s;
  (void)sess.Memory().total();
  (void)sess.kv().MemoryBytes();
  absl::StatusOr<std::string> again =
      session::ExportSessionWire(sess, kWireFuzzFingerprint, {.version = 2, .f16 = false});
  if (!again.ok()) Finding("re-export of an imported session", again.status());
  auto copy = session::ImportSessionWire(*again, *g.model, kWireFuzzFingerprint, "copy");
  if (!copy.ok()) Finding("import of a re-exported session", copy.status());
  // One decode step, as the engine would continue it (installed in a store,
  // the model run on the lease's sequence): the last token when it is not
  // absorbed yet, else any token. Errors (a full context) are fine.
  session::SessionStore store({});
  absl::StatusOr<session::SessionStore::Lease> lease = store.Install(*std::move(s));
  if (!lease.ok()) Finding("install of an imported session", lease.status());
  model::SequenceKv& kv = lease->sequence();
  const std::vector<int32_t>& history = (*lease)->tokens();
  const int32_t next = kv.position() < history.size() ? history[kv.position()] : 1;
  model::SequenceKv* kvs[1] = {&kv};
  const int32_t tokens[1] = {next};
  (void)g.model->DecodeBatch(tokens, kvs, g.scratch, g.logits.data());
  (void)kv.MemoryBytes();
}

void RunOne(std::string_view in) {
  FuzzSession(in);
  if (in.substr(0, 4) == "CQKV") {
    FuzzLayerBlob(in, kv::KvMode::kF32);
    FuzzLayerBlob(in, kv::KvMode::kInt8);
  }
}

}  // namespace
}  // namespace cortiq::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  cortiq::fuzz::G();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  cortiq::fuzz::RunOne(in);
  const std::string fixed = cortiq::fuzz::FixWireChecksums(in);
  if (fixed != in) cortiq::fuzz::RunOne(fixed);
  return 0;
}
