// Session: one conversation's state on this node — token history, one
// attention state per layer (SequenceKv: exact f32/int8 rows, optional sealed
// O(1) overrides, optional QSA states), the sampler with its RNG, and the
// incremental detokenizer's held-back bytes.
//
// Ownership and threads: a Session is owned by the SessionStore. Its state
// changes only through the operations below, each of which names who may
// call it:
//   - the lease holder (SessionStore::Lease), one thread at a time: the
//     engine thread while a job runs, otherwise the thread holding the lease;
//   - the owner of a session not yet installed in a store (the wire import
//     building a fresh one, before SessionStore::Install).
// Reads (kv(), tokens(), ...) follow the same rule. Memory() reads counters
// the lease holder publishes with PublishMemory(), so the metrics thread may
// read it at any time without racing the engine.
//
// The attention state itself (model::SequenceKv, which Transformer::Prefill /
// DecodeBatch / SealO1 extend) is reachable mutably only through the lease,
// SessionStore::Lease::sequence(): the forward pass needs the whole sequence,
// and handing it out by lease makes "only the lease holder runs the model on
// a session" a property of the types instead of a comment. Session itself
// offers only const reads of it and the named operations below.
//
// Example:
//   CORTIQ_ASSIGN_OR_RETURN(SessionStore::Lease lease, store.Create(model, plan));
//   lease->AppendPrompt(prompt);
//   CORTIQ_RETURN_IF_ERROR(model.Prefill(prompt, lease.sequence(), scratch, logits));
//   lease->PublishMemory();   // metrics now see the new bytes
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/kv/layer_kv_cache.h"
#include "core/kv/o1_config.h"
#include "core/model/sampler.h"
#include "core/model/transformer.h"

namespace cortiq::session {

class SessionStore;

enum class AttentionMode : uint8_t { kExact, kO1, kQsa, kWindow };
// "exact" | "o1" | "qsa" | "window"
std::string_view AttentionModeName(AttentionMode mode);

// Fixed at creation. Resolved: every field is concrete.
struct SessionConfig {
  kv::KvMode kv_mode = kv::KvMode::kF32;
  AttentionMode attention = AttentionMode::kExact;
  kv::O1Config o1;             // used when attention == kO1
  model::QsaConfig qsa;        // used when attention == kQsa
  model::WindowConfig window;  // used when attention == kWindow
};

// The kinds of state the metrics report (label kind="kv_f32|kv_int8|o1|qsa"):
// core/attention's, which every attention state reports its bytes by.
using attention::kNumMemoryKinds;
using attention::MemoryByKind;
using attention::MemoryKind;
using attention::MemoryKindName;

// Splits a sequence's MemoryBytes() by kind, as its layers' states report
// it: O(1) overrides → o1, QSA states → qsa, rows → kv_f32 or kv_int8. The
// parts sum to kv.MemoryBytes() exactly.
inline MemoryByKind MemoryOf(const model::SequenceKv& kv) { return kv.Memory(); }

using Clock = std::chrono::steady_clock;
inline double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// A tenant name (Session::tenant, the token file's NAME, the wire's tenant):
// at most kMaxTenantBytes of [A-Za-z0-9._-]; "" is no tenant.
inline constexpr size_t kMaxTenantBytes = 64;
bool IsTenantName(std::string_view name);

// What a reuse_prefix call (GenerationRequest::reuse_prefix: the prompt is
// the whole conversation) keeps of a session: Session::PlanReuse's answer,
// carried by the plan (RequestPlan::reuse) to the engine, which applies it
// (Session::RewindForReuse). Positions are token counts from the start.
struct PrefixReuse {
  size_t history = 0;  // the session's tokens when planned
  size_t lcp = 0;      // longest common prefix of that history and the conversation
  // History tokens kept: min(lcp, conversation - 1) — one token is always
  // prefilled, for the logits — or 0 when starting over. The call appends
  // conversation[kept:] to them.
  size_t kept = 0;
  // Positions the attention state keeps (min(kv position, kept)): the
  // conversation's tokens not prefilled again (Usage.cached_tokens).
  size_t cached = 0;
  // The attention state cannot roll back to `kept` (a sealed O(1) layer, a
  // window that dropped rows, a layer whose CanTruncate refuses) and the
  // history is not a prefix of the conversation: the session's state is
  // emptied and the whole conversation prefilled (kept = cached = 0).
  bool start_over = false;

  bool operator==(const PrefixReuse&) const = default;
};

class Session {
 public:
  // A fresh session for `model`: O(1) or QSA enabled per config (errors name
  // the field). Allocates no cache rows yet.
  static absl::StatusOr<std::unique_ptr<Session>> Create(std::string id,
                                                         const model::Transformer& model,
                                                         const SessionConfig& config);

  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const std::string& id() const { return id_; }
  // The tenant the session belongs to (the name of the token that created
  // it; "" on a node without tokens). Fixed before the session is installed
  // in a store (SessionStore::Create, or set_tenant by an import); any
  // thread may read it after that. It travels with the session (wire
  // version 4).
  const std::string& tenant() const { return tenant_; }
  const SessionConfig& config() const { return config_; }
  Clock::time_point created() const { return created_; }

  // ---- reads: the lease holder, or the owner of an uninstalled session ----
  const model::SequenceKv& kv() const { return kv_; }
  // Every token of the conversation: prompts and sampled tokens. The last
  // sampled token is not yet absorbed by kv() (kv().position() ==
  // tokens().size() - 1 after a generation): the next call feeds it first.
  const std::vector<int32_t>& tokens() const { return tokens_; }
  // The sampler of the last generation (its RNG continues on the next call
  // unless the request names a seed); nullopt before the first.
  const std::optional<model::Sampler>& sampler() const { return sampler_; }
  // Bytes of a UTF-8 character cut between the last streamed token and the
  // next (IncrementalDetokenizer::pending_bytes), so a continued stream never
  // splits a character.
  const std::string& detok_pending() const { return detok_pending_; }
  // The model geometry the session was made for (checked by the wire import).
  int64_t num_attention_heads() const { return num_attention_heads_; }
  int64_t vocab_size() const { return vocab_size_; }

  // ---- a generation: the lease holder (the engine thread while a job runs) ----
  // Appends a request's prompt to the history (the tokens the next prefill
  // absorbs after the history's unabsorbed tail). Amortised O(prompt); may
  // grow the history's buffer.
  void AppendPrompt(std::span<const int32_t> prompt);
  // Chooses this call's sampler: a new one from `params` when `seed_given`
  // (or the session has none yet), otherwise the session's sampler continued
  // under `params` (Sampler::WithParams: the RNG stream carries over).
  // INVALID_ARGUMENT from Sampler::Create / WithParams; nothing changes then.
  absl::Status ChooseSampler(const model::SamplingParams& params, bool seed_given);
  // Grows every layer of the sequence to hold `positions` positions in all,
  // so the call's decode steps do not allocate (SequenceKv::Reserve).
  void ReservePositions(size_t positions);
  // The end of a call on a kept session: gives back the positions reserved
  // for it and not used (a deadline, cancel, stop or EOS cut it short;
  // SequenceKv::ReleaseUnused), then publishes the smaller bytes.
  void ReleaseUnusedPositions();
  // Samples the next token from `logits` ([vocab]) with the session's
  // sampler and appends it to the history. The repetition penalty sees the
  // whole history; the presence / frequency penalties its last `completion`
  // tokens (those this call sampled, <= tokens().size()); `masked` ids are
  // not sampled (Sampler::Sample). Requires a sampler (ChooseSampler
  // first). Allocates nothing once the sampler's scratch is sized and the
  // history has room (the engine does not reserve it: amortised growth as
  // before).
  int32_t SampleNext(std::span<const float> logits, size_t completion = 0,
                     std::span<const int32_t> masked = {});
  // What a reuse_prefix call with `conversation` (non-empty) keeps of this
  // session as it stands (see PrefixReuse). Reads the history and asks the
  // attention state whether it can roll back (SequenceKv::CanTruncate);
  // changes nothing. O(min(history, conversation) + layers), no allocation.
  // The lease holder, or the store under its lock for an unleased session.
  PrefixReuse PlanReuse(std::span<const int32_t> conversation) const;
  // Applies `reuse` (PlanReuse's answer on the session as it stands now):
  // rolls the attention state back to reuse.cached positions and the history
  // to reuse.kept tokens, or, on a start over, frees every state byte and
  // empties the history; publishes the bytes. The held-back detokenizer
  // bytes belong to the history's last tokens: they go when those do
  // (lcp < history, or a start over). The sampler stays (its RNG continues
  // unless the call names a seed). The caller then appends
  // conversation[kept:] (AppendPrompt). Allocates nothing.
  void RewindForReuse(const PrefixReuse& reuse);
  // Keeps the detokenizer's held-back bytes (at most 3: a cut UTF-8
  // character) for the session's next call. At the end of a call.
  void KeepDetokPending(std::string_view bytes);
  // Makes this session a fork of `source` (a request's choice > 0, whose
  // session the engine creates empty): an explicit deep copy of its whole
  // attention state (SequenceKv::Copy: rows, O(1) states, QSA indexer
  // states, the window), history and held-back bytes, sharing nothing
  // mutable with it. Not its id, tenant or sampler. Both sessions are
  // leased by the caller; they must have the same config (a programmer
  // invariant). Allocates the copy: O(source's bytes).
  void CopyStateFrom(const Session& source);

  // ---- state built outside the engine: the owner of an uninstalled session
  // (the wire import), or the lease holder (tools and tests that synthesise
  // a state) ----
  // Replaces the history with `tokens`, of which the first `cached` are (or
  // are about to be: InstallLayerCache) absorbed by the sequence, and the
  // detokenizer's held-back bytes with `detok_pending`. INVALID_ARGUMENT,
  // nothing changed, for a token outside the vocabulary ("tokens: id outside
  // the vocabulary"), cached > tokens.size() ("tokens: more cached
  // positions than tokens") or a history longer than the model's context
  // (no session can hold one). O(tokens).
  absl::Status RestoreHistory(std::vector<int32_t> tokens, size_t cached,
                              std::string_view detok_pending);
  // Sets the tenant (the owner of an uninstalled session only: the wire
  // import sets the tenant the stream carries before SessionStore::Install).
  void set_tenant(std::string tenant) { tenant_ = std::move(tenant); }
  // Keeps the creation time of the session this one replaces (a spilled
  // session read back: --session-max-age counts from its first creation).
  void set_created(Clock::time_point created) { created_ = created; }
  // Sets the sampler (with its RNG state), e.g. Sampler::Deserialize's.
  void RestoreSampler(model::Sampler sampler);
  // Installs `cache` as layer `layer`'s rows holding `positions` positions
  // (LayerAttentionState::InstallCache: its checks and errors).
  absl::Status InstallLayerCache(size_t layer, kv::LayerKvCache cache, size_t positions);
  // Restores layer `layer`'s auxiliary state (a QSA layer's indexer) from a
  // LayerAttentionState::SnapshotAux blob (LayerAttentionState::RestoreAux:
  // its checks and errors).
  absl::Status RestoreLayerAux(size_t layer, const std::shared_ptr<attention::QsaRuntime>& runtime,
                               std::span<const uint8_t> blob);

  // ---- the lease holder, the owner of an uninstalled session, or the store
  // for a session nobody leases ----
  // Recomputes the memory counters from kv() (O(layers)) and publishes them.
  void PublishMemory();
  // Frees every state byte (kv().Release()) and publishes zero. Idempotent.
  void ReleaseState();

  // ---- the journal (core/session/session_journal): the lease holder, or
  // the owner of an uninstalled session ----
  // What the session's journal file (--state-dir) holds of it: whether the
  // file exists, the prefix of the state it holds (history tokens and
  // positions: a record appends what lies past them) and its size. The
  // operations that roll the state back (RewindForReuse, ReleaseState,
  // CopyStateFrom, RestoreHistory) lower the prefix; the journal sets the
  // whole mark when it queues a record.
  struct JournalMark {
    bool written = false;
    size_t tokens = 0;
    size_t cached = 0;
    uint64_t file_bytes = 0;
  };
  const JournalMark& journal_mark() const { return journal_; }
  void set_journal_mark(const JournalMark& mark) { journal_ = mark; }

  // ---- any thread ----
  // Last published bytes by kind (exactly MemoryOf(kv()) as of the last
  // PublishMemory).
  MemoryByKind Memory() const;
  // Token count and cached positions as of the last PublishMemory.
  size_t published_tokens() const { return published_tokens_.load(std::memory_order_relaxed); }
  size_t published_cached() const { return published_cached_.load(std::memory_order_relaxed); }

 private:
  // The lease hands out the mutable sequence (Lease::sequence()); a
  // journal's restore fills an uninstalled session's (session_journal.cc).
  friend class SessionStore;
  friend class JournalRestore;

  Session(std::string id, const model::ModelConfig& config, const SessionConfig& session_config);
  // A rollback to `tokens` history tokens and `cached` positions: the
  // journal's prefix shrinks to them when it held more.
  void LowerJournalMark(size_t tokens, size_t cached) {
    journal_.tokens = std::min(journal_.tokens, tokens);
    journal_.cached = std::min(journal_.cached, cached);
  }

  std::string id_;
  std::string tenant_;
  SessionConfig config_;
  Clock::time_point created_;
  model::SequenceKv kv_;
  std::vector<int32_t> tokens_;
  std::optional<model::Sampler> sampler_;
  std::string detok_pending_;
  int64_t num_attention_heads_ = 0;
  int64_t vocab_size_ = 0;
  size_t max_positions_ = 0;  // the model's context
  JournalMark journal_;

  std::array<std::atomic<size_t>, kNumMemoryKinds> memory_{};
  std::atomic<size_t> published_tokens_{0};
  std::atomic<size_t> published_cached_{0};
};

// Bytes a session of `config` holds at its peak while absorbing `positions`
// positions in total (history + prompt + max_tokens): what admission checks
// against the memory budget. Exact for exact layers (LayerKvCache::
// ProjectedBytes); for O(1) layers the prompt's exact rows plus its query
// trace (the peak, before the seal frees them) plus the sealed states; for
// QSA layers the exact rows plus the indexer states. An upper bound, never
// an underestimate of what the caches reserve.
size_t ProjectedSessionBytes(const model::ModelConfig& model, const SessionConfig& config,
                             size_t positions, size_t prompt_positions);

}  // namespace cortiq::session
