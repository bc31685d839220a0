// O(1) Nyström attention (seed 002) on one layer of one sequence.
//
// Lifecycle:
//   1. the first Prefill at position 0 arms the layer (LayerKvCache::
//      O1Begin); every prefill row is appended exactly and records its
//      rotated queries (O1PushQ), so one long prefill and a chunked one feed
//      the same trace, while attention stays exact;
//   2. CompletePrompt seals (LayerKvCache::O1Seal): the exact K/V is freed
//      and the layer holds one NystromState per KV group. The sequence calls
//      it when its caller says the prompt is complete, or at the latest
//      before its first decode step. A refused seal (int8 rows, ...) leaves
//      the layer exact, logged once per process;
//   3. on a sealed layer a position appends nothing to the exact cache:
//      O1Step inserts (k, v) and attends for every Q head of every group, in
//      one decode task; a later turn's Prefill streams its rows through
//      O1Step in order.
// Release frees everything; the next first Prefill arms again.
#pragma once

#include <memory>
#include <string_view>

#include "core/attention/exact_attention.h"
#include "core/attention/layer_attention_state.h"
#include "core/kv/layer_kv_cache.h"
#include "core/kv/o1_config.h"

namespace cortiq::attention {

class O1Attention final : public CacheAttention {
 public:
  // `config` was validated (O1Config minimums) by the sequence.
  O1Attention(const AttentionGeometry& geometry, kv::KvMode mode, size_t layer,
              const kv::O1Config& config);

  std::string_view name() const override { return "o1"; }
  absl::Status Prefill(const AttentionRows& rows, AttentionContext& ctx) override;
  absl::StatusOr<size_t> BeginDecode(const AttentionRows& row, AttentionContext& ctx) override;
  void DecodeTask(const AttentionRows& row, size_t task, ScratchSlot& slot) override;
  bool CompletePrompt(size_t num_q_heads) override;
  bool AwaitsPromptEnd() const override { return cache_.O1Collecting(); }
  MemoryByKind Memory() const override;
  std::unique_ptr<LayerAttentionState> Copy() const override;

 private:
  const kv::O1Config config_;  // m, w, sink, rect (its layer list is the sequence's)
  // cache_: exact rows until sealed, then the O(1) override.
};

}  // namespace cortiq::attention
