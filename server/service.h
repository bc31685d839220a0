// InferenceService: the cortiq.v1.Inference gRPC service on the callback API.
//
// Every method is on the raw (byte) API with typed handlers (see
// InferenceService below): a request that does not parse gets
// INVALID_ARGUMENT like any other bad input.
//
// Threads: handlers run on gRPC's callback threads and do only cheap work
// there (validation, tokenization, store bookkeeping); every forward pass
// runs on the Engine's thread. Generate is one GenerateReactor per call (see
// service.cc): one write in flight, OnCancel cancels the job, OnDone frees
// everything and deletes the reactor.
//
// Every RPC: the caller's token and role first (server/auth.h: UNAUTHENTICATED,
// PERMISSION_DENIED; a client's session RPCs see only its tenant's
// sessions), then validation —
// bad input gets INVALID_ARGUMENT naming the field and the limit and changes
// nothing. Each call ends with one log line (request id, RPC, code, tokens,
// duration, session, caller, traceparent; never the prompt text; text or
// JSON: server/log_format.h) and the request metrics.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/transformer.h"
#include "core/session/engine.h"
#include "core/session/session_persister.h"
#include "core/session/session_store.h"
#include "core/tokenizer/tokenizer.h"
#include "core/util/in_flight.h"
#include "core/util/task_runner.h"
#include "cortiq/v1/inference.grpc.pb.h"
#include "server/auth.h"
#include "server/config.h"
#include "server/metrics.h"

namespace cortiq::server {

class PeerDialer;  // server/peer_dialer.h
class SessionRouter;  // server/session_router.h

// The outcome of a drain: every session that was on the node, moved or not.
// A session its owner released while the drain ran (ReleaseSession is served
// while draining) is `released`: nothing was left to move, and it is not a
// failure.
struct DrainReport {
  struct Entry {
    std::string session_id;
    bool migrated = false;
    bool released = false;
    std::string peer, peer_session_id, peer_node, error;
  };
  std::vector<Entry> sessions;
  size_t migrated = 0, released = 0, failed = 0;
};

// Everything a handler needs; owned by Server, outlives the service.
struct ServiceContext {
  const ServerConfig* config = nullptr;
  const Authenticator* auth = nullptr;  // the tokens and their roles (never null)
  const model::Transformer* model = nullptr;
  const tokenizer::Tokenizer* tokenizer = nullptr;
  session::SessionStore* store = nullptr;
  session::Engine* engine = nullptr;
  session::SessionPersister* persister = nullptr;  // --state-dir; may be null
  Metrics* metrics = nullptr;              // may be null (metrics off)
  SessionRouter* router = nullptr;         // where other nodes' sessions live (session_router.h)
  PeerDialer* peers = nullptr;             // every channel to another node (peer_dialer.h)
  // An in-process channel to this server, set once it serves (null before
  // and after Shutdown): a Generate with create_if_missing that no peer can
  // serve is relayed here at the hop limit, and served here (forwarding.h).
  std::atomic<std::shared_ptr<grpc::Channel>> self_channel;
  std::string model_name;                  // directory basename
  std::string node_name;                   // --node-name or DefaultNodeName: x-cortiq-node
  std::string fingerprint;                 // hex of wire_fingerprint
  uint64_t wire_fingerprint = 0;           // session::ModelWireFingerprint (checkpoint + tokenizer)
  session::SessionConfig default_session;  // resolved from the flags
  std::atomic<bool> draining{false};       // new generations / sessions → UNAVAILABLE
  std::atomic<uint64_t> next_request_id{1};
  // When an import last ended short (steady_clock ticks; 0: never): the
  // reaper trims the allocator a little after it (Server::ReaperLoop).
  std::atomic<int64_t> import_ended_short{0};
  // Conversations' sessions created here while a peer could not be asked
  // whether it held them (owner_relay.cc): that peer may come back holding
  // one (a restart restores it from its --state-dir, a frozen node wakes).
  // The reaper asks the peers again (Server::SettleMoves) and releases the
  // copy here (reason duplicate) once one does. At most kMaxUnsettled ids.
  static constexpr size_t kMaxUnsettled = 65536;
  std::mutex unsettled_mu;
  std::set<std::string> unsettled;
  // Generate calls whose reactor has not finished (OnDone not yet run).
  util::InFlight streams_in_flight;
  // Generate calls whose engine job has not finished; the engine returns the
  // session's lease before a job counts as finished, so zero here means no
  // session is held by a generation.
  util::InFlight jobs_in_flight;
  // Blocking work kept off the gRPC threads (MigrateSession, Drain); owned
  // by Server, whose Shutdown runs what is queued and joins it.
  util::TaskRunner* background = nullptr;
  // Generate calls whose session is spilled (--state-dir): each is set up
  // here, where reading the session's file back may take a second, not on
  // the gRPC thread it arrived on; owned by Server like `background`.
  util::TaskRunner* read_back = nullptr;
  // Set by Server: drains the node (grace in seconds; nullopt = --grace) and
  // reports; idempotent. Blocking.
  std::function<DrainReport(std::optional<double>)> drain;
  // Set by the process (cortiq-server's main): called after a Drain RPC has
  // answered, to stop the process. May be empty (tests).
  std::function<void()> after_drain;
};

// Resolves a request's session configuration against the server's defaults
// (request > flags > CMF_O1* env > model hint > defaults). INVALID_ARGUMENT
// naming the field for what only the proto can say: an unknown enum value, a
// bad O(1) layer spec or rectifier, a bad QSA spec / ratio / budget
// (model::MakeQsaConfig). The sizes (the O(1) minimums, nothing above the
// context) are checked by session::CheckSessionConfig: in PlanRequest for a
// Generate, directly for CreateSession.
absl::StatusOr<session::SessionConfig> ResolveSessionConfig(const v1::SessionConfig& request,
                                                            const ServiceContext& ctx);
// The server's default session configuration from its flags, the CMF_O1*
// environment and the model's O(1) hint (model.config().o1_hint). model_dir
// is unused (the hint is parsed with config.json by ModelConfig); kept until
// the caller (server.cc) stops passing it.
absl::StatusOr<session::SessionConfig> DefaultSessionConfig(const ServerConfig& config,
                                                            const model::Transformer& model,
                                                            const std::string& model_dir);

class UnaryReactor;  // server/call_util.h

// Every method is on gRPC's raw (byte) API, so that a request which does not
// parse gets INVALID_ARGUMENT naming the RPC and the message type, logged and
// counted (gRPC's typed handlers would answer UNIMPLEMENTED, unseen).
using RawInferenceService = v1::Inference::WithRawCallbackMethod_Generate<
    v1::Inference::WithRawCallbackMethod_CreateSession<
        v1::Inference::WithRawCallbackMethod_GetSession<
            v1::Inference::WithRawCallbackMethod_ListSessions<
                v1::Inference::WithRawCallbackMethod_ReleaseSession<
                    v1::Inference::WithRawCallbackMethod_Tokenize<
                        v1::Inference::WithRawCallbackMethod_GetModelInfo<
                            v1::Inference::WithRawCallbackMethod_ExportSession<
                                v1::Inference::WithRawCallbackMethod_ImportSession<
                                    v1::Inference::WithRawCallbackMethod_MigrateSession<
                                        v1::Inference::WithRawCallbackMethod_Drain<
                                            v1::Inference::Service>>>>>>>>>>>;

// The public methods are gRPC's raw entry points. The unary ones parse the
// request and hand it to the typed handler of the same name (private, below;
// ServeUnary in server/call_util.h), which replies on its UnaryReactor.
// Generate parses in its reactor and writes serialised GenerateResponses.
// ExportSession and ImportSession stay on bytes: chunks go out from the
// buffers they were read into, and in from the received slices straight into
// the new session's caches (server/wire_calls.cc).
class InferenceService final : public RawInferenceService {
 public:
  explicit InferenceService(ServiceContext* ctx) : ctx_(ctx) {}

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* CreateSession(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetSession(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListSessions(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ReleaseSession(grpc::CallbackServerContext* context,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* ExportSession(
      grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* ImportSession(grpc::CallbackServerContext* context,
                                                           grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* MigrateSession(grpc::CallbackServerContext* context,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* context,
                                  const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) override;

 private:
  // The typed handlers: each returns `reactor` and replies on it, at once or
  // (MigrateSession, Drain) from the background workers.
  grpc::ServerUnaryReactor* CreateSession(grpc::CallbackServerContext* context,
                                          const v1::CreateSessionRequest* request,
                                          v1::SessionInfo* response, UnaryReactor* reactor);
  grpc::ServerUnaryReactor* GetSession(grpc::CallbackServerContext* context,
                                       const v1::GetSessionRequest* request,
                                       v1::SessionInfo* response, UnaryReactor* reactor);
  grpc::ServerUnaryReactor* ListSessions(grpc::CallbackServerContext* context,
                                         const v1::ListSessionsRequest* request,
                                         v1::ListSessionsResponse* response, UnaryReactor* reactor);
  grpc::ServerUnaryReactor* ReleaseSession(grpc::CallbackServerContext* context,
                                           const v1::ReleaseSessionRequest* request,
                                           v1::ReleaseSessionResponse* response,
                                           UnaryReactor* reactor);
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response, UnaryReactor* reactor);
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* request,
                                         v1::ModelInfo* response, UnaryReactor* reactor);
  grpc::ServerUnaryReactor* MigrateSession(grpc::CallbackServerContext* context,
                                           const v1::MigrateSessionRequest* request,
                                           v1::MigrateSessionResponse* response,
                                           UnaryReactor* reactor);
  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* context,
                                  const v1::DrainRequest* request, v1::DrainResponse* response,
                                  UnaryReactor* reactor);

  ServiceContext* ctx_;
};

}  // namespace cortiq::server
