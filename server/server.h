// Server: one cortiq-server process — the model, the session store, the
// engine, the metrics endpoint, the gRPC server (Inference + health +
// reflection) and the OpenAI-compatible HTTP front (server/http/), with the
// idle-session reaper.
//
// Lifetime: Start() loads and binds everything (errors name the file or the
// address); Shutdown() drains: health goes NOT_SERVING (HTTP /health 503),
// new generations get UNAVAILABLE (HTTP 503), streams in flight get `grace` to finish, then the rest are
// cancelled, and so are MigrateSession calls holding a session (the lease's
// canceller); drains still running on the background workers finish (within
// --drain-timeout; new calls get UNAVAILABLE) and the workers are joined; the gRPC
// server stops and the engine joins. Every wait is on a condition variable
// (util::InFlight), none polls. Thread-safe.
//
// Example:
//   CORTIQ_ASSIGN_OR_RETURN(auto server, Server::Start(config));
//   std::cout << "listening on port " << server->port();
//   ... server->Shutdown(std::chrono::seconds(10));
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <optional>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/transformer.h"
#include "core/session/engine.h"
#include "core/session/session_store.h"
#include "core/tokenizer/tokenizer.h"
#include "core/util/task_runner.h"
#include "core/util/thread_pool.h"
#include "grpcpp/server.h"
#include "server/config.h"
#include "server/http/http_server.h"
#include "server/metrics.h"
#include "server/peer_dialer.h"
#include "server/session_router.h"
#include "server/service.h"

namespace cortiq::server {

class Server {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerConfig& config);
  ~Server();  // Shutdown(0) if still running

  // Bound ports (the real ones when the flags asked for port 0); metrics 0 = off.
  int port() const { return port_; }
  int metrics_port() const { return metrics_server_ ? metrics_server_->port() : 0; }
  // The HTTP (OpenAI API) port; 0 when --http-listen is off.
  int http_port() const { return http_ ? http_->port() : 0; }

  // Drains (see the banner) and moves every session left to a peer
  // (PeerDialer::Peers(): --peers, CORTIQ_PEERS, --peer-dns; never a
  // --migrate-allow address), --drain-parallelism at a time,
  // trying the next peer when one fails. Returns within `grace` + 5 s (the
  // engine's cancel wait, only when jobs outlive the grace) +
  // --drain-timeout + a few ms: migrations still running at the timeout are
  // cancelled and reported failed, their sessions intact here. Idempotent: a
  // second call returns the first report. The server keeps running
  // (NOT_SERVING) until Shutdown.
  DrainReport Drain(std::chrono::milliseconds grace);
  // Drains new work and stops (see the banner). Idempotent; returns once stopped.
  void Shutdown(std::chrono::milliseconds grace);
  // Who this node may dial, and its channels to them.
  PeerDialer& peer_dialer() { return *peers_; }
  // Re-reads the token file (--auth-tokens): what SIGHUP does. On an error
  // (unreadable, a bad line) the tokens in use stay, the error is logged
  // and returned; the server keeps running. Blocking file I/O; any thread
  // but a gRPC one (cortiq-server's signal thread).
  absl::Status ReloadAuth();
  // Called after a Drain RPC answered (cortiq-server stops the process).
  void SetAfterDrain(std::function<void()> fn) { ctx_->after_drain = std::move(fn); }
  // Blocks until Shutdown has completed.
  void Wait();

  session::SessionStore& store() { return *store_; }
  session::Engine& engine() { return *engine_; }
  // --state-dir's persister; null without one.
  session::SessionPersister* persister() { return persister_.get(); }
  // Where Generate and ExportSession calls on spilled sessions are set up.
  util::TaskRunner& read_back_runner() { return *read_back_; }
  util::TaskRunner& background_runner() { return *background_; }
  const model::Transformer& model() const { return *model_; }
  // The ISA tier the model's math kernels run on (e.g. "avx512bf16"), for logs.
  const char* kernel_tier() const;
  Metrics* metrics() { return metrics_.get(); }
  // What the handlers share: the in-flight counts a test can wait on
  // (streams_in_flight, jobs_in_flight), the draining flag.
  ServiceContext& context() { return *ctx_; }
  const ServerConfig& config() const { return config_; }

 private:
  explicit Server(const ServerConfig& config) : config_(config) {}
  absl::Status Init();
  void ReaperLoop();
  // malloc_trim(0) for a few seconds after sessions were released or
  // spilled, or an import ended short (see the definition). Reaper thread.
  void TrimFreedMemory();
  // Sessions restored in doubt (their move to a peer cut by a crash): asks
  // the peers (a router lookup, each answering from its own sessions) and
  // settles each: a peer holds it, it is released here; every peer answered
  // and none does, it stays here; some did not answer, asked again later
  // (backoff 0.5 s doubling to 30 s), at most 8 lookups at a time. The
  // same for conversations created here while a peer was silent
  // (ServiceContext::unsettled): a peer holds one too, the copy here is
  // released (reason duplicate, once no call holds it) and a forwarding
  // record sends the next turn there; every peer answered and none does, it
  // is settled. Reaper thread; the lookups' answers arrive on gRPC threads
  // and are applied on the next tick.
  void SettleMoves();
  // Stops new work, lets streams run up to `grace`, cancels the rest and
  // waits for the engine to let go of every session.
  void Quiesce(std::chrono::milliseconds grace);
  // --state-dir: restores every session file into the store (Init, before
  // the node listens).
  void RestoreSessions();
  // Drain's migration of one session: peers[first_peer] first, then the
  // others, each bounded by `deadline`.
  DrainReport::Entry DrainOne(const std::string& session_id, const std::vector<std::string>& peers,
                              size_t first_peer, std::chrono::system_clock::time_point deadline);

  ServerConfig config_;
  std::unique_ptr<util::ThreadPool> pool_;
  std::unique_ptr<model::Transformer> model_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  // --state-dir: before the store and the engine, which write through it
  // (so it outlives them and writes their last records).
  std::unique_ptr<session::SessionPersister> persister_;
  std::unique_ptr<session::SessionStore> store_;
  std::unique_ptr<Authenticator> auth_;
  // Generate and ExportSession calls on a spilled session
  // (ctx_->read_back); declared before metrics_, whose scrape reads its
  // count. Shutdown drains and joins it before anything here is destroyed.
  std::unique_ptr<util::TaskRunner> read_back_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<session::Engine> engine_;
  std::unique_ptr<MetricsServer> metrics_server_;
  // Used by ctx_'s users (migrations, the drain): declared before ctx_ and
  // background_ so that it outlives them.
  std::unique_ptr<PeerDialer> peers_;
  // SettleMoves' lookups, by session id: declared before router_, whose
  // destructor runs their callbacks (CANCELLED), which write here.
  struct Settling {
    bool in_flight = false;
    std::optional<absl::StatusOr<std::string>> answer;  // the last lookup's, not yet applied
    std::chrono::steady_clock::time_point next_try{};
    std::chrono::milliseconds backoff{500};
  };
  std::mutex settle_mu_;
  std::map<std::string, Settling> settling_;
  // Where the sessions this node does not hold live (the forwarding); it
  // dials through peers_, and its destructor waits for its lookups.
  std::unique_ptr<SessionRouter> router_;
  std::unique_ptr<ServiceContext> ctx_;
  // MigrateSession and Drain bodies (ctx_->background); declared after ctx_,
  // which its tasks use. Shutdown drains and joins it.
  std::unique_ptr<util::TaskRunner> background_;
  std::unique_ptr<InferenceService> service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  // The HTTP front: its handlers use ctx_ and the engine; stopped in
  // Shutdown after Quiesce (its jobs cancelled), before the engine stops.
  std::unique_ptr<http::HttpServer> http_;
  int port_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool stopped_ = false;
  std::mutex drain_mu_;
  std::optional<DrainReport> drain_report_;
  std::thread reaper_;
  // TrimFreedMemory's state (the reaper thread only): releases + spills seen
  // last, when memory was last freed, when the allocator was last trimmed.
  uint64_t trim_seen_frees_ = 0;
  std::chrono::steady_clock::time_point last_free_{}, last_trim_{};
};

}  // namespace cortiq::server
