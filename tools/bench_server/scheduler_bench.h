// cortiq-bench-server's scheduler scenarios (issue 19), run on an engine in
// this process (session::Engine directly, no gRPC): what they measure is the
// engine's choice of rows per step, which the gRPC layer only relays, and
// the engine takes EngineOptions::step_tokens and tenant_weights, and
// SessionStore::Create a session's tenant, without a server flag or an auth
// token file.
//
// --long-prompt N: `streams` jobs decode long generations; once every one
// is decoding, one request with an N-token prompt arrives. Its time to first
// token, the decoders' inter-token latency while it is absorbed and outside
// that, and the mixed steps' time, for each --step-tokens value (one engine
// per value, the model loaded once).
//
// --tenants: tenant "flood" with `streams` clients resubmitting at once,
// tenant "light" with one client sending a request now and then. The light
// tenant's time to first token alone and under the flood; then both tenants
// backlogged (`streams` clients each), and the share of generated tokens and
// of prompt tokens absorbed each tenant got against the --tenant-weights.
//
// Threads: each client is one thread that owns its jobs' consumer side; the
// scenario function joins them all before it returns. Timestamps are taken
// when a client pops an event (it pops as soon as one is queued).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/session/engine.h"

namespace cortiq::tools {

// The p-quantile (0..1) of `v`, nearest rank; 0 when empty.
double Percentile(std::vector<double> v, double p);

using TenantWeights = std::vector<std::pair<std::string, double>>;

// Issue 19's scheduler settings, as the bench's flags give them; unset ones
// keep the engine's (or the server's) defaults.
struct SchedulerFlags {
  size_t max_batch = 32;                        // --max-batch
  std::vector<size_t> step_tokens;              // --step-tokens (a list for --long-prompt)
  std::optional<size_t> prefill_chunk;          // --prefill-chunk
  std::optional<size_t> aging_steps;            // --aging-steps
  std::optional<TenantWeights> tenant_weights;  // --tenant-weights
};

// The engine's options for one step budget (nullopt: the engine's default).
session::EngineOptions EngineOptionsFor(const SchedulerFlags& flags,
                                        std::optional<size_t> step_tokens);

struct SchedulerBenchOptions {
  std::string model_dir;
  size_t threads = 0;         // math threads; 0 = every core
  size_t prompt_tokens = 32;  // the short prompts (decoders, tenants' requests)
  size_t max_tokens = 64;     // tokens a tenant's request generates
  size_t rounds = 2;          // long prompts per step budget; light requests / 4
  size_t streams = 8;         // decoders; flood clients (and light's when backlogged)
  SchedulerFlags flags;
};

// Both print a markdown table for docs/PERFORMANCE.md and return the exit
// code: 0, or 1 after printing why (a load or a job failed).
int RunLongPromptBench(const SchedulerBenchOptions& opt, size_t long_prompt);
int RunTenantsBench(const SchedulerBenchOptions& opt);

}  // namespace cortiq::tools
