#include "server/server.h"

#include <malloc.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <filesystem>
#include <numeric>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/math/kernels.h"
#include "core/model/model_files.h"
#include "core/session/session_wire.h"
#include "core/util/log_escape.h"
#include "core/util/page_pool.h"
#include "core/util/status_macros.h"
#include "core/util/strings.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "server/forwarding.h"
#include "server/migration.h"
#include "spdlog/spdlog.h"

namespace cortiq::server {

namespace {

constexpr const char* kServiceName = v1::Inference::service_full_name();

// Background workers for MigrateSession and Drain calls (each blocks on a
// peer up to its deadline; an operator runs a few at a time), and how many
// more may wait for one before a call is refused with RESOURCE_EXHAUSTED.
constexpr size_t kBackgroundWorkers = 4;
constexpr size_t kBackgroundQueue = 64;
// Reading spilled sessions back: two at a time (a disk reads one file
// sequentially fastest; a second overlaps one's copy with the other's
// read), the rest wait in turn up to a queue the size of a busy burst.
constexpr size_t kReadBackWorkers = 2;
constexpr size_t kReadBackQueue = 256;

// How long Quiesce waits, after cancelling, for the engine to finish the
// cancelled jobs (it does at its next step).
constexpr auto kCancelWait = std::chrono::seconds(5);

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerConfig& config) {
  std::unique_ptr<Server> s(new Server(config));
  CORTIQ_RETURN_IF_ERROR(s->Init());
  return s;
}

namespace {

// Large malloc blocks always get their own mapping, unmapped when freed
// (AlignedBuffer's of 128 KiB and up, K/V rows and an import's layers, are
// not malloc's but the page pool's: util::PagePool, --page-pool). glibc's
// default threshold (128 KiB) is dynamic: freeing a mapped block raises it
// to that block's size (up to 32 MiB), after which blocks that size come
// from the heap arenas and stay resident after they are freed (only an
// arena's top can shrink). An import that ends short then left its rows
// resident (the issue: 682 MB after 100 stalled streams ended). Setting the
// threshold fixes it where it is and turns the adjustment off; the cost is
// an mmap/munmap per block of 128 KiB or more, which the hot path never
// allocates (decode allocates nothing; caches grow by doubling).
// Process-wide and idempotent.
void ConfigureAllocator() {
  constexpr int kMmapThreshold = 128 << 10;
  mallopt(M_MMAP_THRESHOLD, kMmapThreshold);
}

// How long the page pool (--page-pool) keeps its pages without a buffer
// taken from it: a node that admits nothing for this long hands them back
// and its RSS returns to the sessions' and the model's.
constexpr std::chrono::seconds kPagePoolIdle{30};

}  // namespace

absl::Status Server::Init() {
  const ServerConfig& c = config_;
  ConfigureAllocator();
  util::PagePool::Global().SetCapacity(c.page_pool_bytes);
  CORTIQ_RETURN_IF_ERROR(model::CheckModelPath(c.model_dir));
  pool_ = std::make_unique<util::ThreadPool>(c.threads);
  model::LoadOptions load;
  load.pool = pool_.get();
  load.bf16_activations = c.activations == "bf16";
  load.weights = *model::ParseWeights(c.weights);  // ChoiceFlag checked it
  CORTIQ_ASSIGN_OR_RETURN(model_, model::Transformer::Load(c.model_dir, load));
  CORTIQ_ASSIGN_OR_RETURN(model::ModelTokenizer tok, model::LoadModelTokenizer(c.model_dir));
  tokenizer_ = std::make_unique<tokenizer::Tokenizer>(std::move(tok.tokenizer));
  const uint64_t wire_fingerprint = session::ModelWireFingerprint(model_->checkpoint(), tok.identity);

  if (!c.state_dir.empty()) {
    session::PersisterOptions po;
    po.dir = c.state_dir;
    po.sync = *session::ParsePersistSync(c.persist_sync);  // ChoiceFlag checked it
    po.interval = std::max(c.persist_interval, std::chrono::milliseconds(1));
    po.fingerprint = wire_fingerprint;
    CORTIQ_ASSIGN_OR_RETURN(persister_, session::SessionPersister::Open(*model_, std::move(po)));
  }

  session::StoreOptions so;
  so.max_sessions = c.max_sessions;
  so.memory_budget_bytes = c.memory_budget_bytes;
  so.ttl = c.session_ttl;
  so.lease_wait = c.lease_wait;
  so.max_imports = c.max_concurrent_imports;
  so.max_exports = c.max_concurrent_exports;
  so.persister = persister_.get();  // files deleted on release; idle sessions spilled
  so.max_age = c.session_max_age;
  store_ = std::make_unique<session::SessionStore>(so);
  CORTIQ_ASSIGN_OR_RETURN(auth_, Authenticator::Create(c.auth_tokens_file, c.auth_token));

  read_back_ = std::make_unique<util::TaskRunner>(kReadBackWorkers, kReadBackQueue);
  const bool metrics_on = !c.metrics_listen.empty() && c.metrics_listen != "off";
  if (metrics_on) {
    MetricsSources src;
    src.store = store_.get();
    src.model = model_.get();
    src.model_name = model::ModelName(c.model_dir);
    src.version = "0.1.0";
    src.tenants = [auth = auth_.get()] { return auth->Tenants(); };
    src.persister = persister_.get();
    src.read_back = read_back_.get();
    src.memory_capacity_bytes =
        c.memory_capacity_bytes > 0 ? c.memory_capacity_bytes : MachineMemoryBytes().value_or(0);
    CORTIQ_ASSIGN_OR_RETURN(metrics_, Metrics::Create(src));
  }
  session::EngineOptions eo;
  eo.max_batch = c.max_batch;
  eo.step_tokens = c.step_tokens;
  eo.prefill_chunk = c.prefill_chunk;
  eo.aging_steps = c.aging_steps;
  eo.tenant_weights = c.tenant_weights;
  eo.queue_capacity = c.queue_capacity;
  eo.max_context = c.max_context;
  eo.observer = metrics_.get();
  eo.persister = persister_.get();
  engine_ = std::make_unique<session::Engine>(*model_, *tokenizer_, eo);
  if (metrics_) metrics_->AttachEngine(engine_.get());

  CORTIQ_ASSIGN_OR_RETURN(peers_, PeerDialer::Create(c));
  // Lookups start on gRPC's threads: they take the peers DNS last gave and
  // never wait for a fresher answer.
  router_ = std::make_unique<SessionRouter>(
      SessionRouter::Options{.forward_ttl = c.forward_ttl,
                             .lookup_timeout = c.peer_connect_timeout},
      [p = peers_.get()] { return p->Peers(PeerDialer::Wait::kNo); },
      [p = peers_.get()](const std::string& address) {
        return p->Channel(address, PeerDialer::Wait::kNo);
      });
  ctx_ = std::make_unique<ServiceContext>();
  ctx_->config = &config_;
  ctx_->peers = peers_.get();
  ctx_->router = router_.get();
  ctx_->auth = auth_.get();
  ctx_->model = model_.get();
  ctx_->tokenizer = tokenizer_.get();
  ctx_->store = store_.get();
  ctx_->engine = engine_.get();
  ctx_->metrics = metrics_.get();
  ctx_->model_name = model::ModelName(c.model_dir);
  if (config_.node_name.empty()) config_.node_name = DefaultNodeName(c.listen);
  ctx_->node_name = config_.node_name;
  ctx_->wire_fingerprint = wire_fingerprint;
  ctx_->persister = persister_.get();
  ctx_->fingerprint = absl::StrFormat("%016x", ctx_->wire_fingerprint);
  CORTIQ_ASSIGN_OR_RETURN(ctx_->default_session, DefaultSessionConfig(c, *model_, c.model_dir));
  background_ = std::make_unique<util::TaskRunner>(kBackgroundWorkers, kBackgroundQueue);
  ctx_->background = background_.get();
  ctx_->read_back = read_back_.get();
  ctx_->drain = [this](std::optional<double> grace_s) {
    const auto grace =
        grace_s ? std::chrono::milliseconds(static_cast<int64_t>(*grace_s * 1000)) : config_.grace;
    return Drain(grace);
  };
  service_ = std::make_unique<InferenceService>(ctx_.get());
  if (persister_) RestoreSessions();

  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!c.tls_cert.empty()) {
    grpc::SslServerCredentialsOptions ssl;
    grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
    CORTIQ_ASSIGN_OR_RETURN(pair.cert_chain, ReadFlagFile(c.tls_cert, "--tls-cert"));
    CORTIQ_ASSIGN_OR_RETURN(pair.private_key, ReadFlagFile(c.tls_key, "--tls-key"));
    ssl.pem_key_cert_pairs.push_back(std::move(pair));
    creds = grpc::SslServerCredentials(ssl);
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(c.listen, creds, &port_);
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(std::min<size_t>(c.max_message_bytes, INT32_MAX)));
  builder.RegisterService(service_.get());
  grpc_server_ = builder.BuildAndStart();
  if (!grpc_server_ || port_ == 0) {
    return absl::UnavailableError(absl::StrCat("--listen: cannot listen on '", c.listen, "'"));
  }
  auto* health = grpc_server_->GetHealthCheckService();
  health->SetServingStatus(true);
  health->SetServingStatus(kServiceName, true);
  ctx_->self_channel.store(grpc_server_->InProcessChannel(grpc::ChannelArguments()));

  if (metrics_on) {
    CORTIQ_ASSIGN_OR_RETURN(metrics_server_, MetricsServer::Start(c.metrics_listen, *metrics_));
  }
  if (!c.http_listen.empty() && c.http_listen != "off") {
    CORTIQ_ASSIGN_OR_RETURN(http::ChatRenderer chat,
                            http::LoadChatRenderer(c, {.source = tok.chat_template,
                                                       .bos_token = tok.bos_token,
                                                       .eos_token = tok.eos_token}));
    CORTIQ_ASSIGN_OR_RETURN(http_, http::HttpServer::Start(ctx_.get(), std::move(chat)));
  }
  reaper_ = std::thread([this] { ReaperLoop(); });
  return absl::OkStatus();
}

// Every session file in --state-dir comes back under its id, tenant and
// configuration before the node listens (so before it reports SERVING).
void Server::RestoreSessions() {
  spdlog::info("state: restoring sessions from {}", util::EscapeForLog(config_.state_dir));
  const session::SessionPersister::RestoreReport r =
      persister_->RestoreAll([this](std::unique_ptr<session::Session> s,
                                    const std::string& moving_to) {
        return store_->InstallRestored(std::move(s), moving_to);
      });
  spdlog::info(
      "state: restored {} session(s) ({} of them spilled: beyond the memory budget, or in "
      "doubt), {:.1f} MB in {:.3f} s ({:.0f} MB/s); {} quarantined, {} torn tail(s) dropped, {} "
      "not installed, {} in doubt (a move to a peer cut by the crash)",
      r.restored, store_->num_spilled(), r.bytes / 1e6, r.seconds,
      r.seconds > 0 ? r.bytes / 1e6 / r.seconds : 0.0, r.quarantined, r.torn, r.refused,
      r.in_doubt);
}

absl::Status Server::ReloadAuth() {
  if (config_.auth_tokens_file.empty()) {
    spdlog::info("SIGHUP: no --auth-tokens file to re-read");
    return absl::OkStatus();
  }
  absl::Status st = auth_->Reload();
  if (!st.ok()) {
    // The message names the file and line, never a token.
    spdlog::error("auth: reload failed, the tokens in use stay: {}",
                  util::EscapeForLog(std::string(st.message())));
    return st;
  }
  spdlog::info("auth: reloaded {} ({} tenant(s))", util::EscapeForLog(config_.auth_tokens_file),
               auth_->Tenants().size());
  return absl::OkStatus();
}

void Server::ReaperLoop() {
  const auto period = std::clamp<std::chrono::milliseconds>(
      config_.session_ttl / 4, std::chrono::milliseconds(10), std::chrono::milliseconds(1000));
  std::unique_lock lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, period, [&] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    store_->ReapIdle();
    TrimFreedMemory();
    util::PagePool::Global().ReleaseIfIdle(std::chrono::steady_clock::now(), kPagePoolIdle);
    SettleMoves();
    lock.lock();
  }
}

void Server::SettleMoves() {
  const std::vector<std::pair<std::string, std::string>> doubt = store_->InDoubt();
  // Conversations created here while a peer was silent (ServiceContext::
  // unsettled): those still here are asked about like the moves in doubt.
  std::vector<std::string> unsettled;
  {
    std::lock_guard lock(ctx_->unsettled_mu);
    for (auto it = ctx_->unsettled.begin(); it != ctx_->unsettled.end();) {
      if (!store_->Get(*it)) {
        it = ctx_->unsettled.erase(it);  // released meanwhile, or never made
        continue;
      }
      const bool in_doubt =
          std::any_of(doubt.begin(), doubt.end(), [&](const auto& d) { return d.first == *it; });
      if (!in_doubt) unsettled.push_back(*it);
      ++it;
    }
  }
  const auto now = std::chrono::steady_clock::now();
  // At most this many lookups of its own in flight: the router's share of
  // lookups (SessionRouter::Options::max_lookups) stays with the clients'.
  constexpr size_t kMaxSettleLookups = 8;
  size_t in_flight = 0;
  {
    // (The lookups' callbacks write settling_ on gRPC threads.)
    std::lock_guard lock(settle_mu_);
    if (doubt.empty() && unsettled.empty() && settling_.empty()) return;
    for (const auto& [id, s] : settling_) in_flight += s.in_flight ? 1 : 0;
  }
  // (id, the peer its move went to; empty for a conversation created here)
  std::vector<std::pair<std::string, std::string>> asks = doubt;
  for (std::string& id : unsettled) asks.emplace_back(std::move(id), std::string());
  std::set<std::string> live;
  for (const auto& [id, peer] : asks) {
    const bool move = !peer.empty();
    live.insert(id);
    std::optional<absl::StatusOr<std::string>> answer;
    {
      std::lock_guard lock(settle_mu_);
      Settling& s = settling_[id];
      if (s.in_flight) continue;
      if (s.answer) {
        answer = std::move(s.answer);
        s.answer.reset();
      } else if (now < s.next_try || in_flight >= kMaxSettleLookups) {
        continue;
      }
    }
    if (answer) {
      if (move && answer->ok()) {
        store_->SettleMove(id, **answer);
      } else if (move && answer->status().code() == absl::StatusCode::kNotFound) {
        store_->SettleMove(id, std::nullopt);
      } else if (!move && answer->ok()) {
        // A peer holds the conversation too: the client resends the whole
        // chat, so either copy answers it; this one goes, and the next turn
        // here is relayed there (a forwarding record). A turn running on
        // it now is not cancelled: asked again at the next tick.
        if (store_->ReleaseIfIdle(id, session::ReleaseReason::kDuplicate)) {
          spdlog::info(
              "session {}: {} holds it too (it was created here while that peer could "
              "not be asked): the copy here is released",
              id, util::EscapeForLog(**answer));
          router_->Moved(id, **answer);
          std::lock_guard lock(ctx_->unsettled_mu);
          ctx_->unsettled.erase(id);
        }
      } else if (!move && answer->status().code() == absl::StatusCode::kNotFound) {
        std::lock_guard lock(ctx_->unsettled_mu);  // every peer answered: the only copy
        ctx_->unsettled.erase(id);
      } else {
        std::lock_guard lock(settle_mu_);
        Settling& s = settling_[id];
        if (move) {
          spdlog::warn("session {}: still in doubt (its move to {}): {}; asking again in {} ms", id,
                       util::EscapeForLog(peer),
                       util::EscapeForLog(std::string(answer->status().message())),
                       s.backoff.count());
        } else {
          spdlog::debug("session {}: created here while a peer was silent, still unsettled: {}", id,
                        util::EscapeForLog(std::string(answer->status().message())));
        }
        s.next_try = now + s.backoff;
        s.backoff = std::min<std::chrono::milliseconds>(2 * s.backoff, std::chrono::seconds(30));
      }
      continue;
    }
    {
      std::lock_guard lock(settle_mu_);
      settling_[id].in_flight = true;
    }
    ++in_flight;
    SessionRouter::LookupCall call;
    call.deadline = std::chrono::system_clock::now() + config_.peer_connect_timeout;
    call.metadata = OnBehalfMetadata(*ctx_, Caller{"", Role::kAdmin}, "");
    router_->Lookup(id, std::move(call), [this, id](absl::StatusOr<std::string> owner) {
      std::lock_guard lock(settle_mu_);
      Settling& s = settling_[id];
      s.in_flight = false;
      s.answer = std::move(owner);
    });
  }
  std::lock_guard lock(settle_mu_);
  for (auto it = settling_.begin(); it != settling_.end();) {
    it = !live.contains(it->first) && !it->second.in_flight ? settling_.erase(it) : std::next(it);
  }
}

// Freed session state's small blocks go back to glibc's arenas (malloc's
// blocks of 128 KiB or more are unmapped already: ConfigureAllocator;
// AlignedBuffer's go to the page pool, which shows and bounds what it
// keeps), where they stay resident:
// the small buffers of short sessions (40 short sessions of the embedded
// model, released, left their 13 MB resident, shown by no gauge), or an
// import that ended short (the issue measured 682 MB left resident after 100
// stalled streams ended). malloc_trim(0) hands their free pages back to the
// OS. Done here, on the reaper's thread, from kTrimAfter to kTrimUntil after
// the last such event (sessions released or spilled, an import that ended
// short), at most every kTrimEvery (one-shot calls release a session each):
// gRPC frees a call's own state after
// OnDone, and its transport buffers later still, so one trim right after a
// burst leaves part of it (20-30 MB of the 100-stream attack). A trim walks
// the arenas once (milliseconds); a quiet server never trims.
void Server::TrimFreedMemory() {
  constexpr std::chrono::milliseconds kTrimAfter{100}, kTrimUntil{5000}, kTrimEvery{1000};
  const auto now = std::chrono::steady_clock::now();
  const std::array<uint64_t, session::kNumReleaseReasons> released = store_->releases();
  const uint64_t freed = std::accumulate(released.begin(), released.end(), store_->spills());
  if (freed != trim_seen_frees_) {
    trim_seen_frees_ = freed;
    last_free_ = now;
  }
  if (const int64_t ended = ctx_->import_ended_short.load(); ended != 0) {
    const std::chrono::steady_clock::time_point at{std::chrono::steady_clock::duration(ended)};
    last_free_ = std::max(last_free_, at);
  }
  if (last_free_ == std::chrono::steady_clock::time_point{}) return;
  const auto since = now - last_free_;
  if (since >= kTrimAfter && since <= kTrimUntil && now - last_trim_ >= kTrimEvery) {
    malloc_trim(0);
    last_trim_ = now;
  }
}

void Server::Quiesce(std::chrono::milliseconds grace) {
  auto* health = grpc_server_->GetHealthCheckService();
  health->SetServingStatus(false);
  health->SetServingStatus(kServiceName, false);
  ctx_->draining.store(true);
  // Streams in flight get the grace period to finish (no new one gets a job
  // now) ...
  const auto until = std::chrono::steady_clock::now() + grace;
  if (ctx_->streams_in_flight.WaitIdleUntil(until)) ctx_->jobs_in_flight.WaitIdleUntil(until);
  // ... then the rest are cancelled (their streams end with finish reason
  // cancelled) and the engine lets go of their sessions.
  store_->CancelAll();
  ctx_->jobs_in_flight.WaitIdleUntil(std::chrono::steady_clock::now() + kCancelWait);
}

DrainReport::Entry Server::DrainOne(const std::string& session_id,
                                    const std::vector<std::string>& peers, size_t first_peer,
                                    std::chrono::system_clock::time_point deadline) {
  DrainReport::Entry e;
  e.session_id = session_id;
  if (peers.empty()) {
    e.error = "no peer configured (--peers, CORTIQ_PEERS or --peer-dns)";
    return e;
  }
  // Each round tries every peer, starting at first_peer. A peer that is full
  // for now (RESOURCE_EXHAUSTED: its --max-concurrent-imports or its
  // --memory-budget, or this node's budget for reading a spilled session
  // back while other migrations hold it) may have room once the migrations
  // in flight end, so such a round is tried again after a pause, until
  // --drain-timeout; any other failure of every peer ends the session's
  // drain at once.
  auto pause = std::chrono::milliseconds(100);
  for (int round = 1;; ++round) {
    std::string errors;
    bool full = false;
    for (size_t t = 0; t < peers.size(); ++t) {
      const std::string& peer = peers[(first_peer + t) % peers.size()];
      if (std::chrono::system_clock::now() >= deadline) {
        e.error = absl::StrCat(errors, errors.empty() ? "" : "; ",
                               "--drain-timeout passed before a migration to ", peer, " started",
                               round > 1 ? absl::StrCat(" (round ", round, ")") : "");
        return e;
      }
      absl::StatusOr<MigrateOutcome> out = MigrateOut(*ctx_, session_id, peer, config_.peer_token,
                                                      /*f16=*/false,
                                                      {.deadline = deadline,
                                                       .cancel = nullptr,
                                                       .deadline_name = "--drain-timeout",
                                                       .traceparent = {}});
      if (out.ok()) {
        e.migrated = true;
        e.peer = peer;
        e.peer_session_id = out->peer_session_id;
        e.peer_node = out->peer_node;
        e.error.clear();
        return e;
      }
      if (!store_->Get(session_id)) {
        // Released by its owner while this migration ran (or before it
        // began): nothing is left to move.
        e.released = true;
        e.error = "released by its owner during the drain";
        return e;
      }
      full |= out.status().code() == absl::StatusCode::kResourceExhausted;
      errors =
          absl::StrCat(errors, errors.empty() ? "" : "; ", peer, ": ", out.status().ToString());
    }
    const auto now = std::chrono::system_clock::now();
    if (!full || now + pause >= deadline) {
      e.error = round > 1 ? absl::StrCat(errors, " (after ", round, " rounds over the peers)")
                          : std::move(errors);
      return e;
    }
    spdlog::info("drain: session {}: every peer refused it for now (round {}); again in {} ms",
                 session_id, round, pause.count());
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(2000));
  }
}

DrainReport Server::Drain(std::chrono::milliseconds grace) {
  std::lock_guard lock(drain_mu_);
  if (drain_report_) return *drain_report_;
  spdlog::info("drain: NOT_SERVING; streams in flight get {} ms", grace.count());
  Quiesce(grace);
  const std::vector<std::string> peers = peers_->Peers();
  // Every migration's peer calls end by this deadline (MigrateBounds): what
  // has not moved by then is cancelled, reported failed and stays intact here.
  const auto deadline = std::chrono::system_clock::now() + config_.drain_timeout;
  // No session comes in from here on: an import still arriving is refused
  // when it ends (its source keeps the session), a call that passed the
  // draining check a moment ago makes none, unless it landed before this
  // list, which then moves it on with the rest.
  store_->CloseToNewSessions();
  const std::vector<session::SessionSnapshot> sessions = store_->List();
  DrainReport report;
  report.sessions.resize(sessions.size());
  // config_.drain_parallelism workers take the sessions in order; session i
  // tries peer i first, so the sessions spread over the peers.
  std::atomic<size_t> next{0};
  {
    std::vector<std::jthread> workers;
    const size_t n = std::min(config_.drain_parallelism, sessions.size());
    for (size_t w = 0; w < n; ++w) {
      workers.emplace_back([&] {
        for (size_t i; (i = next.fetch_add(1)) < sessions.size();) {
          report.sessions[i] = DrainOne(sessions[i].id, peers, i, deadline);
        }
      });
    }
  }  // joins the workers
  for (const DrainReport::Entry& e : report.sessions) {
    if (e.migrated) {
      ++report.migrated;
      // The peer's answer is quoted: escape it (util::EscapeForLog).
      spdlog::info("drain: session {} migrated to {} (node {})", e.session_id, e.peer,
                   util::EscapeForLog(e.peer_node));
    } else if (e.released) {
      ++report.released;
      spdlog::info("drain: session {} released by its owner during the drain", e.session_id);
    } else {
      ++report.failed;
      spdlog::error("drain: session {} NOT migrated: {}", e.session_id,
                    util::EscapeForLog(e.error));
    }
  }
  spdlog::info("drain: {} session(s) migrated, {} released during the drain, {} failed",
               report.migrated, report.released, report.failed);
  drain_report_ = report;
  return report;
}

void Server::Shutdown(std::chrono::milliseconds grace) {
  {
    std::unique_lock lock(mu_);
    if (stopping_) {
      cv_.wait(lock, [&] { return stopped_; });
      return;
    }
    stopping_ = true;
  }
  cv_.notify_all();
  if (reaper_.joinable()) reaper_.join();
  if (grpc_server_) {
    Quiesce(grace);
    // Quiesce cancelled the migrations that hold a session; drains and
    // migrations still queued finish (each bounded by its peer deadlines)
    // and answer their callers before the gRPC server stops; new ones are
    // refused from here on.
    // HTTP requests in flight end with their jobs (cancelled by Quiesce);
    // idle keep-alive connections close.
    if (http_) http_->Stop();
    // Calls waiting for a read-back are set up now (refused: the node is
    // stopping) and answer before the gRPC server stops.
    read_back_->Shutdown();
    background_->Shutdown();
    grpc_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    ctx_->self_channel.store(nullptr);  // no channel to a stopped server outlives it
  }
  if (engine_) engine_->Shutdown();
  {
    std::unique_lock lock(mu_);
    stopped_ = true;
  }
  cv_.notify_all();
  spdlog::info("server stopped");
}

const char* Server::kernel_tier() const { return math::IsaName(math::ActiveIsa()); }

void Server::Wait() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return stopped_; });
}

Server::~Server() {
  Shutdown(std::chrono::milliseconds(0));
  if (grpc_server_) grpc_server_->Wait();
}

}  // namespace cortiq::server
