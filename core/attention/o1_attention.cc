#include "core/attention/o1_attention.h"

#include <atomic>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/attention/exact_attention.h"
#include "core/util/status_macros.h"
#include "spdlog/spdlog.h"

namespace cortiq::attention {

O1Attention::O1Attention(const AttentionGeometry& geometry, kv::KvMode mode, size_t layer,
                         const kv::O1Config& config)
    : CacheAttention(geometry, mode, layer, /*accepts_sealed=*/true), config_(config) {}

absl::Status O1Attention::Prefill(const AttentionRows& rows, AttentionContext& ctx) {
  const size_t qw = geometry_.q_width(), kw = geometry_.kv_width();
  if (cache_.O1Sealed()) {
    // A later turn: its rows stream through the Nyström state in order.
    for (size_t r = 0; r < rows.count; ++r) {
      cache_.O1Step({rows.q + r * qw, qw}, {rows.k + r * kw, kw}, {rows.v + r * kw, kw},
                    geometry_.num_q_heads, {rows.out + r * qw, qw});
    }
    return absl::OkStatus();
  }
  if (cache_.seq_len() == 0) {
    // The first prefill of a fresh sequence: record the query trace through
    // this and any following block until CompletePrompt.
    CORTIQ_RETURN_IF_ERROR(cache_.O1Begin(config_.m, config_.w, config_.sink, config_.rect));
  }
  for (size_t r = 0; r < rows.count; ++r) {
    cache_.Append({rows.k + r * kw, kw}, {rows.v + r * kw, kw});
    cache_.O1PushQ({rows.q + r * qw, qw});  // no-op unless collecting
  }
  AttendCausal(cache_, rows, ctx);
  return absl::OkStatus();
}

absl::StatusOr<size_t> O1Attention::BeginDecode(const AttentionRows& row, AttentionContext&) {
  if (cache_.O1Sealed()) return 1;     // one task: O1Step over every group
  AppendRows(cache_, row, geometry_);  // a refused seal: the layer runs exact
  return geometry_.num_kv_heads;
}

void O1Attention::DecodeTask(const AttentionRows& row, size_t task, ScratchSlot& slot) {
  if (!cache_.O1Sealed()) {
    AttendGroupTask(cache_, row, 0, task, 0, geometry_, slot);
    return;
  }
  const size_t qw = geometry_.q_width(), kw = geometry_.kv_width();
  cache_.O1Step({row.q, qw}, {row.k, kw}, {row.v, kw}, geometry_.num_q_heads, {row.out, qw});
}

bool O1Attention::CompletePrompt(size_t num_q_heads) {
  if (!cache_.O1Collecting()) return false;
  const absl::Status st = cache_.O1Seal(num_q_heads);
  if (st.ok()) return true;
  // One warning per process: a config that cannot seal (e.g. O(1) asked for
  // on int8 sessions) would otherwise log on every request.
  static std::atomic<bool> warned{false};
  const std::string why(st.message());
  if (!warned.exchange(true, std::memory_order_relaxed)) {
    spdlog::warn("o1: layer {} keeps exact attention: {} (further refusals log at debug level)",
                 layer_, why);
  } else {
    spdlog::debug("o1: layer {} keeps exact attention: {}", layer_, why);
  }
  return false;
}

MemoryByKind O1Attention::Memory() const {
  MemoryByKind m;
  const size_t o1 = cache_.O1MemoryBytes();
  m[MemoryKind::kO1] = o1;
  m[RowsKind(cache_.mode())] = cache_.MemoryBytes() - o1;
  return m;
}

std::unique_ptr<LayerAttentionState> O1Attention::Copy() const {
  auto out = std::make_unique<O1Attention>(geometry_, cache_.mode(), layer_, config_);
  out->cache_ = cache_.Copy();
  return out;
}

}  // namespace cortiq::attention
