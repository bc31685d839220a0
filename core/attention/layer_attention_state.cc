#include "core/attention/layer_attention_state.h"

#include "absl/strings/str_cat.h"

namespace cortiq::attention {

std::string_view MemoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kKvF32:
      return "kv_f32";
    case MemoryKind::kKvInt8:
      return "kv_int8";
    case MemoryKind::kO1:
      return "o1";
    case MemoryKind::kQsa:
      return "qsa";
  }
  return "unknown";
}

size_t MemoryByKind::total() const {
  size_t t = 0;
  for (size_t b : bytes) t += b;
  return t;
}

MemoryByKind& MemoryByKind::operator+=(const MemoryByKind& o) {
  for (size_t i = 0; i < kNumMemoryKinds; ++i) bytes[i] += o.bytes[i];
  return *this;
}

absl::Status LayerAttentionState::Bind(const std::shared_ptr<QsaRuntime>&) {
  return absl::OkStatus();
}

absl::Status LayerAttentionState::EndDecode(const AttentionRows&, AttentionContext&) {
  return absl::OkStatus();
}

bool LayerAttentionState::CompletePrompt(size_t) { return false; }

absl::StatusOr<kv::LayerKvCache> LayerAttentionState::ExportRows() const {
  return absl::FailedPreconditionError(
      absl::StrCat("the ", std::string(name()), " attention state has no other form of its rows"));
}

absl::Status LayerAttentionState::InstallCache(kv::LayerKvCache, size_t) {
  return absl::InvalidArgumentError(
      absl::StrCat("the ", std::string(name()), " attention state does not hold exact cache rows"));
}

absl::Status LayerAttentionState::AuxRows(size_t, size_t count, uint8_t*) const {
  if (count == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(std::string(name()), " attention keeps no aux state"));
}

absl::StatusOr<std::vector<uint8_t>> LayerAttentionState::SnapshotAux() const {
  return std::vector<uint8_t>{};
}

absl::Status LayerAttentionState::RestoreAux(const std::shared_ptr<QsaRuntime>&,
                                             std::span<const uint8_t>) {
  return absl::FailedPreconditionError(
      absl::StrCat("the ", std::string(name()), " attention state carries no aux blob"));
}

}  // namespace cortiq::attention
