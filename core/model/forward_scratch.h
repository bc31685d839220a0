// ForwardScratch: every buffer one forward call of model::Transformer uses —
// the activations below and the attention states' scratch — grown to the
// largest batch / block seen and then reused: a decode step with a warm
// scratch performs no allocation. One per engine thread (or per caller);
// concurrent forward calls need distinct ones. Move-only.
#pragma once

#include <cstddef>
#include <vector>

#include "core/attention/attention_scratch.h"
#include "core/util/aligned_buffer.h"

namespace cortiq::model {

class SequenceKv;

// Layouts are row-major; `rows` = tokens in the call (prefill block length,
// or the decode batch size).
struct ForwardScratch {
  util::AlignedBuffer<float> x;           // [rows × hidden] residual stream
  util::AlignedBuffer<float> xn;          // [rows × hidden] normed input
  util::AlignedBuffer<float> q;           // [rows × n_heads × head_dim]
  util::AlignedBuffer<float> k;           // [rows × n_kv × head_dim]
  util::AlignedBuffer<float> v;           // [rows × n_kv × head_dim]
  util::AlignedBuffer<float> att;         // [rows × n_heads × head_dim]
  util::AlignedBuffer<float> gate;        // [rows × intermediate]
  util::AlignedBuffer<float> up;          // [rows × intermediate]
  util::AlignedBuffer<float> rope;        // [rows × head_dim] (cos | sin halves)
  size_t rows = 0;                        // rows the buffers above hold
  std::vector<size_t> positions;          // [rows] each row's position
  std::vector<size_t> task_first;         // decode: [rows + 1] first attention task of each row
  // Transformer::Step: per segment, its first row and its first position;
  // the rows' tokens; the decode rows' sequences.
  std::vector<size_t> segment_row, segment_start;
  std::vector<int32_t> tokens;
  std::vector<SequenceKv*> decode_kvs;
  attention::AttentionScratch attention;  // per-thread scores, QSA launch scratch
};

}  // namespace cortiq::model
