// The one check of a generation request (see request_plan.h).
#include "core/session/request_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/kv/layer_kv_cache.h"
#include "core/util/status_macros.h"
#include "core/util/strings.h"

namespace cortiq::session {

absl::Status CheckRequestFields(const GenerationRequest& r, const PlanLimits& limits,
                                const model::ModelConfig& model) {
  const int64_t vocab = model.vocab_size;
  if (r.prompt.empty()) {
    return absl::InvalidArgumentError("prompt: empty; give prompt text or prompt_tokens");
  }
  for (size_t i = 0; i < r.prompt.size(); ++i) {
    if (r.prompt[i] < 0 || r.prompt[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("prompt_tokens[", i, "]: id ", r.prompt[i],
                                                     " is outside the vocabulary [0, ", vocab,
                                                     ")"));
    }
  }
  if (r.max_tokens < 1 || r.max_tokens > limits.max_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens: ", r.max_tokens, " is outside [1, ", limits.max_tokens, "]"));
  }
  CORTIQ_RETURN_IF_ERROR(r.sampling.Validate());
  // Validate checked the logit_bias ids are >= 0, distinct and ascending:
  // the last is the largest.
  if (!r.sampling.logit_bias.empty() && r.sampling.logit_bias.back().first >= vocab) {
    return absl::InvalidArgumentError(absl::StrCat("logit_bias: token id ",
                                                   r.sampling.logit_bias.back().first,
                                                   " is outside the vocabulary [0, ", vocab, ")"));
  }
  if (r.stop_token_ids.size() > kMaxStopTokenIds) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stop_token_ids: ", r.stop_token_ids.size(), " ids, at most ", kMaxStopTokenIds));
  }
  for (size_t i = 0; i < r.stop_token_ids.size(); ++i) {
    if (r.stop_token_ids[i] < 0 || r.stop_token_ids[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("stop_token_ids[", i, "]: id ",
                                                     r.stop_token_ids[i],
                                                     " is outside the vocabulary [0, ", vocab,
                                                     ")"));
    }
  }
  if (r.min_tokens > r.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("min_tokens: ", r.min_tokens,
                                                   " is above max_tokens ", r.max_tokens));
  }
  if (r.n < 1 || r.n > limits.max_n) {
    return absl::InvalidArgumentError(
        absl::StrCat("n: ", r.n, " is outside [1, ", limits.max_n, "] (--max-n)"));
  }
  if (r.top_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_logprobs: ", r.top_logprobs, " is outside [0, ", kMaxTopLogprobs, "]"));
  }
  if (r.stop.size() > kMaxStopSequences) {
    return absl::InvalidArgumentError(
        absl::StrCat("stop: ", r.stop.size(), " sequences, at most ", kMaxStopSequences));
  }
  for (size_t i = 0; i < r.stop.size(); ++i) {
    if (r.stop[i].empty() || r.stop[i].size() > kMaxStopBytes) {
      return absl::InvalidArgumentError(absl::StrCat("stop[", i, "]: ", r.stop[i].size(),
                                                     " bytes, must be 1 .. ", kMaxStopBytes));
    }
  }
  return absl::OkStatus();
}

namespace {

// Checks the fields and the context, then projects: the part both overloads
// share. `history` tokens of the session stay; the prompt's first
// `prompt_kept` tokens are among them (reuse_prefix), the rest is appended.
absl::StatusOr<RequestPlan> Plan(const GenerationRequest& r, const PlanLimits& limits,
                                 const model::ModelConfig& model, const SessionConfig& config,
                                 size_t history, size_t prompt_kept = 0) {
  CORTIQ_RETURN_IF_ERROR(CheckRequestFields(r, limits, model));
  RequestPlan plan;
  plan.config = config;
  plan.history = history;
  plan.prompt = r.prompt.size() - prompt_kept;
  plan.max_tokens = r.max_tokens;
  plan.total = history + plan.prompt + plan.max_tokens;
  if (plan.total > limits.max_context) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt: ", plan.prompt, " prompt tokens + max_tokens ", plan.max_tokens,
                     " + ", history, " session tokens = ", plan.total,
                     " positions, beyond the context of ", limits.max_context));
  }
  plan.projected = ProjectedSessionMemory(model, config, plan.total, history + plan.prompt);
  return plan;
}

size_t RoundUp64(size_t n) { return (n + 63) / 64 * 64; }

size_t NextPow2(size_t n) {
  size_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

}  // namespace

std::string_view FrontendName(Frontend frontend) {
  return frontend == Frontend::kHttp ? "http" : "grpc";
}

std::string_view PriorityName(Priority priority) {
  switch (priority) {
    case Priority::kLow: return "low";
    case Priority::kNormal: return "normal";
    case Priority::kHigh: return "high";
  }
  return "normal";
}

std::optional<Priority> ParsePriority(std::string_view name) {
  for (size_t p = 0; p < kNumPriorities; ++p) {
    if (name == PriorityName(static_cast<Priority>(p))) return static_cast<Priority>(p);
  }
  return std::nullopt;
}

absl::StatusOr<RequestPlan> PlanRequest(const GenerationRequest& request, const PlanLimits& limits,
                                        const model::ModelConfig& model,
                                        const SessionConfig& config) {
  CORTIQ_RETURN_IF_ERROR(CheckSessionConfig(config, limits.max_context, limits.max_o1_m));
  CORTIQ_ASSIGN_OR_RETURN(RequestPlan plan, Plan(request, limits, model, config, /*history=*/0));
  if (request.reuse_prefix) plan.reuse = PrefixReuse{};  // nothing to keep, nothing cached
  return plan;
}

absl::StatusOr<RequestPlan> PlanRequest(const GenerationRequest& request, const PlanLimits& limits,
                                        const model::ModelConfig& model,
                                        const ExistingSession& session) {
  if (!request.reuse_prefix) return Plan(request, limits, model, session.config, session.history);
  if (!session.reuse.has_value()) {
    return absl::InternalError(
        "reuse_prefix: the session was peeked without the conversation (SessionStore::"
        "PeekForReuse)");
  }
  const PrefixReuse& reuse = *session.reuse;
  // An empty prompt fails CheckRequestFields first; kept < prompt.size() otherwise.
  const size_t kept = std::min(reuse.kept, request.prompt.size());
  CORTIQ_ASSIGN_OR_RETURN(RequestPlan plan,
                          Plan(request, limits, model, session.config, kept, kept));
  plan.reuse = reuse;
  plan.lease_serial = session.lease_serial;
  return plan;
}

absl::Status CheckSessionConfig(const SessionConfig& c, size_t max_context, size_t max_o1_m) {
  auto over = [&](std::string_view field, size_t v) {
    return absl::InvalidArgumentError(absl::StrCat("session_config.", util::Sv(field), ": ", v,
                                                   " is above the context of ", max_context));
  };
  if (c.attention == AttentionMode::kO1) {
    CORTIQ_RETURN_IF_ERROR(
        kv::CheckO1Minimums(c.o1.m, c.o1.w, "session_config.o1.m", "session_config.o1.window"));
    if (c.o1.m > max_context) return over("o1.m", c.o1.m);
    if (c.o1.m > max_o1_m) {
      return absl::InvalidArgumentError(absl::StrCat(
          "session_config.o1.m: ", c.o1.m, " landmarks are above the limit of ", max_o1_m,
          " (--max-o1-m: sealing a prompt costs O(m^3) per head, each token O(m^2))"));
    }
    if (c.o1.w > max_context) return over("o1.window", c.o1.w);
    if (c.o1.sink > max_context) return over("o1.sink", c.o1.sink);
  }
  if (c.attention == AttentionMode::kQsa) {
    if (c.qsa.ratio > max_context) return over("qsa.ratio", c.qsa.ratio);
    if (c.qsa.budget > max_context) return over("qsa.budget", c.qsa.budget);
  }
  if (c.attention == AttentionMode::kWindow) {
    if (c.kv_mode != kv::KvMode::kF32) {
      return absl::InvalidArgumentError(
          "session_config.window: sink + window attention keeps f32 rows; it does not run with "
          "kv_dtype KV_DTYPE_INT8");
    }
    if (c.window.sink > max_context) return over("window.sink", c.window.sink);
    if (c.window.window > max_context) return over("window.window", c.window.window);
  }
  return absl::OkStatus();
}

MemoryByKind ProjectedSessionMemory(const model::ModelConfig& model, const SessionConfig& config,
                                    size_t positions, size_t prompt_positions) {
  const size_t layers = static_cast<size_t>(model.num_hidden_layers);
  const size_t kv_heads = static_cast<size_t>(model.num_key_value_heads);
  const size_t heads = static_cast<size_t>(model.num_attention_heads);
  const size_t hd = static_cast<size_t>(model.head_dim);
  const size_t exact = kv::LayerKvCache::ProjectedBytes(kv_heads, hd, config.kv_mode, positions);
  MemoryByKind m;
  size_t& rows = m[attention::RowsKind(config.kv_mode)];
  for (size_t l = 0; l < layers; ++l) {
    if (config.attention == AttentionMode::kWindow && config.window.IsWindowLayer(l)) {
      rows += config.window.LayerBytes(kv_heads, hd);  // constant: sink + window rows
      continue;
    }
    rows += exact;
    if (config.attention == AttentionMode::kO1 && config.o1.IsO1Layer(l)) {
      // Peak while sealing: the prompt's query trace (grown geometrically)
      // and the new states are held next to the exact rows.
      const size_t mm = config.o1.m, w = config.o1.w, sink = config.o1.sink;
      const size_t trace = NextPow2(prompt_positions) * heads * hd * sizeof(float);
      const size_t group = ((w + sink + 8) * 2 * hd + mm * hd) * sizeof(float);
      const size_t head = (2 * mm * hd + mm * mm + 4 * mm) * sizeof(double);
      m[MemoryKind::kO1] += trace + kv_heads * group + heads * head;
    } else if (config.attention == AttentionMode::kQsa && config.qsa.IsQsaLayer(l)) {
      // Raw keys bf16 [capacity × hd] + block keys bf16 [capacity / ratio × hd].
      const size_t ratio = std::max<size_t>(config.qsa.ratio, 1);
      m[MemoryKind::kQsa] +=
          RoundUp64(positions * hd * 2) + RoundUp64((positions / ratio + 1) * hd * 2);
    }
  }
  return m;
}

}  // namespace cortiq::session
