// GenerationStream: one generation's events as an HTTP answer consumes them,
// wherever the generation runs — a job on this node's engine (http_server.cc's
// JobWatch) or a gRPC Generate call relayed to the node that owns the
// conversation's session (owner_relay.h). The response writers (the SSE
// stream, the JSON body) see only this, so a relayed answer is written by the
// same code as a local one: chunks, usage with cached_tokens, logprobs, n
// choices, finish reasons, tool and think parsing.
//
// Threads: one consumer (an HTTP worker) calls everything; Cancel may also
// come from it while the producer (the engine, a gRPC callback thread) runs.
#pragma once

#include "core/session/engine.h"

namespace cortiq::server::http {

class GenerationStream {
 public:
  virtual ~GenerationStream() = default;  // cancels the generation unless it finished

  enum class Next { kEvent, kDrained, kWaiting };
  // The next event; kDrained once the generation has finished and every
  // event was taken (result() is then valid); kWaiting when `until` passed
  // first.
  virtual Next Wait(session::GenerationEvent* ev, session::Clock::time_point until) = 0;
  // The next event when one is queued now.
  virtual bool Pop(session::GenerationEvent* ev) = 0;
  // Stops the generation (its result says cancelled, or its error); idempotent.
  virtual void Cancel() = 0;
  // How it ended; valid after Wait answered kDrained.
  virtual const session::GenerationResult& result() const = 0;
};

}  // namespace cortiq::server::http
