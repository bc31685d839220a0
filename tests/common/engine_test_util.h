// Helpers for tests that drive the Engine directly: a job's events read to
// its end, with the result; an O(1) session config the tiny models seal;
// one configuration per attention mode, a fixed request, a call on a kept
// session (the session wire, journal and persister tests).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/attention/qsa_runtime.h"
#include "core/attention/window_attention.h"
#include "core/session/engine.h"
#include "core/session/session_store.h"
#include "gtest/gtest.h"

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

// Every attention mode on the "tiny" shape, small enough that a prompt of a
// few dozen tokens exercises it: 0 exact f32, 1 exact int8, 2 O(1) on both
// layers (m 8, window 16, sink 2), 3 QSA (ratio 16, budget 4, 2 heads), 4
// sink + window (sink 2, window 8: rows are dropped).
inline session::SessionConfig ModeConfig(int mode) {
  session::SessionConfig c;
  if (mode == 1) c.kv_mode = kv::KvMode::kInt8;
  if (mode == 2) {
    c.attention = session::AttentionMode::kO1;
    c.o1.layers = {0, 1};
    c.o1.m = 8;
    c.o1.w = 16;
    c.o1.sink = 2;
  }
  if (mode == 3) {
    c.attention = session::AttentionMode::kQsa;
    auto q = attention::MakeQsaConfig("all", 16, 4, 2);
    EXPECT_TRUE(q.ok());
    c.qsa = *q;
  }
  if (mode == 4) {
    c.attention = session::AttentionMode::kWindow;
    auto w = attention::MakeWindowConfig("all", 2, 8, 2);
    EXPECT_TRUE(w.ok());
    c.window = *w;
  }
  return c;
}

// `n` tokens after `prompt`, EOS ignored; greedy, or sampled at 0.9 with
// `seed` (used by a session's first call; a continuation keeps its RNG).
inline session::GenerationRequest FixedRequest(std::vector<int32_t> prompt, size_t n,
                                               bool sampled, uint64_t seed = 77) {
  session::GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = n;
  r.ignore_eos = true;
  r.sampling.temperature = sampled ? 0.9f : 0.0f;
  r.sampling.seed = seed;
  return r;
}

// One call on kept session `id` of `store` (Acquire, Submit, drain): its
// token ids; a failure is a test failure.
inline std::vector<int32_t> RunKept(session::Engine& engine, session::SessionStore& store,
                                    const std::string& id, session::GenerationRequest r) {
  auto lease = store.Acquire(id);
  EXPECT_TRUE(lease.ok()) << lease.status();
  if (!lease.ok()) return {};
  auto job = engine.Submit(*std::move(lease), std::move(r));
  EXPECT_TRUE(job.ok()) << job.status();
  if (!job.ok()) return {};
  JobOutput out = DrainJob(**job);
  EXPECT_TRUE(out.result.status.ok()) << out.result.status;
  return out.ids;
}

}  // namespace cortiq::testing
