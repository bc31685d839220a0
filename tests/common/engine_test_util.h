// Helpers for tests that drive the Engine directly: a job's events read to
// its end, with the result; an O(1) session config the tiny models seal.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/session/engine.h"

namespace cortiq::testing {

// What a job streamed: every event's token id and text, then its result.
struct JobOutput {
  std::vector<int32_t> ids;
  std::string text;
  session::GenerationResult result;
};

// Pops every event of `job` (blocking) until it has ended and is drained.
inline JobOutput DrainJob(session::Job& job) {
  JobOutput o;
  session::GenerationEvent ev;
  while (job.WaitPop(&ev)) {
    o.ids.push_back(ev.token_id);
    o.text += ev.text;
  }
  o.result = job.result();
  return o;
}

// O(1) on layer 1 with m 8, window 16, sink 2: small enough for a prompt
// of a few dozen tokens of the "tiny" shape to seal (f32 rows).
inline session::SessionConfig SmallO1Config() {
  session::SessionConfig c;
  c.attention = session::AttentionMode::kO1;
  c.o1.layers = {1};
  c.o1.m = 8;
  c.o1.w = 16;
  c.o1.sink = 2;
  return c;
}

}  // namespace cortiq::testing
