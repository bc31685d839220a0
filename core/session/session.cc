#include "core/session/session.h"

#include <algorithm>

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/session/request_plan.h"
#include "core/util/status_macros.h"

namespace cortiq::session {

bool IsTenantName(std::string_view name) {
  return name.size() <= kMaxTenantBytes && std::all_of(name.begin(), name.end(), [](char ch) {
           return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') ||
                  (ch >= 'A' && ch <= 'Z') || ch == '.' || ch == '_' || ch == '-';
         });
}

std::string_view AttentionModeName(AttentionMode mode) {
  switch (mode) {
    case AttentionMode::kExact:
      return "exact";
    case AttentionMode::kO1:
      return "o1";
    case AttentionMode::kQsa:
      return "qsa";
    case AttentionMode::kWindow:
      return "window";
  }
  return "unknown";
}

Session::Session(std::string id, const model::ModelConfig& config,
                 const SessionConfig& session_config)
    : id_(std::move(id)),
      config_(session_config),
      created_(Clock::now()),
      kv_(config, session_config.kv_mode),
      num_attention_heads_(config.num_attention_heads),
      vocab_size_(config.vocab_size),
      max_positions_(static_cast<size_t>(config.max_position_embeddings)) {}

absl::StatusOr<std::unique_ptr<Session>> Session::Create(std::string id,
                                                         const model::Transformer& model,
                                                         const SessionConfig& config) {
  std::unique_ptr<Session> s(new Session(std::move(id), model.config(), config));
  switch (config.attention) {
    case AttentionMode::kExact:
      break;
    case AttentionMode::kO1:
      CORTIQ_RETURN_IF_ERROR(s->kv_.EnableO1(config.o1));
      break;
    case AttentionMode::kQsa:
      CORTIQ_RETURN_IF_ERROR(s->kv_.EnableQsa(config.qsa));
      break;
    case AttentionMode::kWindow:
      CORTIQ_RETURN_IF_ERROR(s->kv_.EnableWindow(config.window));
      break;
  }
  return s;
}

void Session::AppendPrompt(std::span<const int32_t> prompt) {
  tokens_.insert(tokens_.end(), prompt.begin(), prompt.end());
}

absl::Status Session::ChooseSampler(const model::SamplingParams& params, bool seed_given) {
  absl::StatusOr<model::Sampler> sampler = seed_given || !sampler_.has_value()
                                               ? model::Sampler::Create(params)
                                               : sampler_->WithParams(params);
  if (!sampler.ok()) return sampler.status();
  sampler_ = *std::move(sampler);
  return absl::OkStatus();
}

void Session::ReservePositions(size_t positions) { kv_.Reserve(positions); }

void Session::ReleaseUnusedPositions() {
  kv_.ReleaseUnused();
  PublishMemory();
}

int32_t Session::SampleNext(std::span<const float> logits, size_t completion,
                            std::span<const int32_t> masked) {
  const std::span<const int32_t> history(tokens_);
  const int32_t t = sampler_->Sample(logits, history,
                                     history.last(std::min(completion, history.size())), masked);
  tokens_.push_back(t);
  return t;
}

PrefixReuse Session::PlanReuse(std::span<const int32_t> conversation) const {
  PrefixReuse r;
  r.history = tokens_.size();
  const size_t n = std::min(tokens_.size(), conversation.size());
  while (r.lcp < n && tokens_[r.lcp] == conversation[r.lcp]) ++r.lcp;
  // A conversation equal to (or a prefix of) the history still prefills its
  // last token: the call needs that position's logits.
  r.kept = std::min(r.lcp, conversation.empty() ? 0 : conversation.size() - 1);
  const size_t position = kv_.position();
  r.cached = std::min(position, r.kept);
  // Rolling back nothing (an exact extension: the last sampled token is not
  // in kv yet, position <= kept) works in every mode; anything more needs
  // every layer's consent.
  if (position > r.kept && !kv_.CanTruncate(position - r.kept).ok()) {
    r.kept = 0;
    r.cached = 0;
    r.start_over = true;
  }
  return r;
}

void Session::RewindForReuse(const PrefixReuse& reuse) {
  if (reuse.start_over) {
    kv_.Release();
    tokens_.clear();
    detok_pending_.clear();
    LowerJournalMark(0, 0);
    PublishMemory();
    return;
  }
  LowerJournalMark(reuse.kept, reuse.cached);
  const size_t position = kv_.position();
  if (position > reuse.cached) {
    const absl::Status st = kv_.TruncateLast(position - reuse.cached);
    (void)st;  // PlanReuse asked CanTruncate on this very state
  }
  if (reuse.lcp < tokens_.size()) detok_pending_.clear();
  tokens_.resize(reuse.kept);
  PublishMemory();
}

void Session::KeepDetokPending(std::string_view bytes) { detok_pending_.assign(bytes); }

void Session::CopyStateFrom(const Session& source) {
  kv_ = source.kv_.Copy();
  tokens_ = source.tokens_;
  LowerJournalMark(0, 0);
  detok_pending_ = source.detok_pending_;
  PublishMemory();
}

absl::Status Session::RestoreHistory(std::vector<int32_t> tokens, size_t cached,
                                     std::string_view detok_pending) {
  for (int32_t token : tokens) {
    if (token < 0 || token >= vocab_size_) {
      return absl::InvalidArgumentError("tokens: id outside the vocabulary");
    }
  }
  if (cached > tokens.size()) {
    return absl::InvalidArgumentError("tokens: more cached positions than tokens");
  }
  // A session never holds more than the model's context (admission plans
  // history + prompt + max_tokens within it): a longer history is forged.
  if (tokens.size() > max_positions_) {
    return absl::InvalidArgumentError(absl::StrCat("tokens: a history of ", tokens.size(),
                                                   " tokens is beyond the model's context of ",
                                                   max_positions_));
  }
  tokens_ = std::move(tokens);
  detok_pending_.assign(detok_pending);
  LowerJournalMark(0, 0);
  return absl::OkStatus();
}

void Session::RestoreSampler(model::Sampler sampler) { sampler_ = std::move(sampler); }

absl::Status Session::InstallLayerCache(size_t layer, kv::LayerKvCache cache, size_t positions) {
  return kv_.layer(layer).InstallCache(std::move(cache), positions);
}

absl::Status Session::RestoreLayerAux(size_t layer,
                                      const std::shared_ptr<attention::QsaRuntime>& runtime,
                                      std::span<const uint8_t> blob) {
  return kv_.layer(layer).RestoreAux(runtime, blob);
}

void Session::PublishMemory() {
  const MemoryByKind m = MemoryOf(kv_);
  for (size_t i = 0; i < kNumMemoryKinds; ++i) {
    memory_[i].store(m.bytes[i], std::memory_order_relaxed);
  }
  published_tokens_.store(tokens_.size(), std::memory_order_relaxed);
  published_cached_.store(kv_.position(), std::memory_order_relaxed);
}

void Session::ReleaseState() {
  kv_.Release();
  LowerJournalMark(journal_.tokens, 0);
  PublishMemory();
}

MemoryByKind Session::Memory() const {
  MemoryByKind m;
  for (size_t i = 0; i < kNumMemoryKinds; ++i) {
    m.bytes[i] = memory_[i].load(std::memory_order_relaxed);
  }
  return m;
}

size_t ProjectedSessionBytes(const model::ModelConfig& model, const SessionConfig& config,
                             size_t positions, size_t prompt_positions) {
  return ProjectedSessionMemory(model, config, positions, prompt_positions).total();
}

}  // namespace cortiq::session
