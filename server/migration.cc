// MigrateSession and Drain: the client side of a migration. Migrate runs on
// the server's background workers (it is a blocking client of the peer):
// the peer's channel from the PeerDialer (which refuses an address that is
// not a peer or in --migrate-allow before dialling it), lease, learn the
// peer's versions (GetModelInfo), stream at the highest common version,
// reading each chunk from the caches while the previous one is sent, to the
// peer's ImportSession (server/wire_calls.cc on the other side), and release
// locally (reason "migrated") only after the peer answered OK; on any
// failure the lease is returned and the session stays as it was. Every peer
// call has a deadline (the connect timeout, or one that scales with the
// bytes to send, never past the caller's), and the caller's cancel, a
// ReleaseSession of the session, or shutdown TryCancels it (MigrationCancel).
#include "server/migration.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/session/session_persister.h"
#include "core/session/session_wire.h"
#include "core/util/failpoint.h"
#include "core/util/log_escape.h"
#include "core/util/status_macros.h"
#include "core/util/strings.h"
#include "core/util/tsan_annotations.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "server/auth.h"
#include "server/call_util.h"
#include "server/config.h"
#include "server/forwarding.h"
#include "server/metrics.h"
#include "server/peer_dialer.h"
#include "server/session_router.h"
#include "server/status_util.h"
#include "server/wire_chunk.h"
#include "spdlog/spdlog.h"

namespace cortiq::server {

namespace {

// Send buffers for StreamToPeer: gRPC holds each one (as a slice) until its
// bytes are written to the socket, then hands it back here (from any
// thread), so a migration cycles through a few warm buffers instead of
// faulting in fresh memory for every chunk. Get never waits for a buffer to
// come back (nothing may block the thread that polls the call): with one
// write in flight and one chunk read ahead, two or three buffers are in use.
// Outstanding buffers keep the pool alive (a cancelled call may release
// them late).
class ChunkPool : public std::enable_shared_from_this<ChunkPool> {
 public:
  struct Buffer {
    std::shared_ptr<ChunkPool> pool;  // set while gRPC holds it
    std::unique_ptr<char[]> data = std::make_unique_for_overwrite<char[]>(kChunkBytes);
  };

  ~ChunkPool() {
    for (Buffer* b : free_) delete b;
  }

  // A returned buffer, or a new one.
  Buffer* Get() {
    Buffer* b = nullptr;
    {
      std::lock_guard lock(mu_);
      if (!free_.empty()) {
        b = free_.back();
        free_.pop_back();
      }
    }
    if (b == nullptr) b = new Buffer;
    b->pool = shared_from_this();
    util::TsanRelease(b);  // gRPC hands it back to Return on its thread
    return b;
  }
  // The slice's destroy callback.
  static void Return(void* p) {
    auto* b = static_cast<Buffer*>(p);
    util::TsanAcquire(b);
    std::shared_ptr<ChunkPool> pool = std::move(b->pool);
    std::lock_guard lock(pool->mu_);
    pool->free_.push_back(b);
  }

 private:
  std::mutex mu_;
  std::vector<Buffer*> free_;
};

// The next chunk of `src` as a WireChunk message, read from the caches
// straight into a pool buffer that gRPC sends without copying it again.
grpc::ByteBuffer NextChunkMessage(session::SessionWireSource& src, ChunkPool& pool) {
  ChunkPool::Buffer* b = pool.Get();
  const size_t n = src.Read(b->data.get(), kChunkBytes);
  return ChunkMessage(grpc::Slice(b->data.get(), n, &ChunkPool::Return, b));
}

// The peer's ImportSession as a gRPC method path ("/<service>/<method>"),
// from the generated descriptors; empty if they have no client-streaming
// method of that name from WireChunk to ImportSessionResponse (what
// StreamToPeer sends and reads).
const std::string& ImportSessionPath() {
  static const std::string path = [] {
    const google::protobuf::ServiceDescriptor* service =
        v1::WireChunk::descriptor()->file()->pool()->FindServiceByName(
            v1::Inference::service_full_name());
    const google::protobuf::MethodDescriptor* m =
        service ? service->FindMethodByName("ImportSession") : nullptr;
    if (m == nullptr || !m->client_streaming() || m->server_streaming() ||
        m->input_type() != v1::WireChunk::descriptor() ||
        m->output_type() != v1::ImportSessionResponse::descriptor()) {
      return std::string();
    }
    return absl::StrCat("/", service->full_name(), "/", m->name());
  }();
  return path;
}

// Streams `src` to the peer's ImportSession and returns the call's status
// (*resp on OK). The generic (byte) API lets each chunk go out from the
// buffer it was read into, and the next chunk is read from the caches while
// the previous one is on its way (one write in flight).
grpc::Status StreamToPeer(const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext& c,
                          session::SessionWireSource& src, v1::ImportSessionResponse* resp) {
  grpc::CompletionQueue cq;
  grpc::Status status;
  {
    grpc::GenericStub stub(channel);
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
        stub.PrepareCall(&c, ImportSessionPath(), &cq);
    auto wait = [&cq] {  // one operation in flight at a time: its outcome
      void* tag = nullptr;
      bool ok = false;
      return cq.Next(&tag, &ok) && ok;
    };
    call->StartCall(nullptr);
    bool ok = wait();
    auto pool = std::make_shared<ChunkPool>();
    std::optional<grpc::ByteBuffer> next;
    if (ok && src.left() > 0) next = NextChunkMessage(src, *pool);
    while (ok && next) {
      call->Write(*next, nullptr);
      next.reset();
      if (src.left() > 0) next = NextChunkMessage(src, *pool);  // while this one is sent
      ok = wait();  // false: the peer ended the call, Finish says why
    }
    grpc::ByteBuffer reply;
    if (ok) {
      call->WritesDone(nullptr);
      ok = wait();
    }
    if (ok) {
      call->Read(&reply, nullptr);
      ok = wait();
    }
    call->Finish(&status, nullptr);
    wait();
    if (status.ok()) {
      status = ok ? grpc::SerializationTraits<v1::ImportSessionResponse>::Deserialize(&reply, resp)
                  : grpc::Status(grpc::StatusCode::INTERNAL, "ImportSession: no reply");
    }
  }
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

// The earlier of now + `budget` and `bound`.
std::chrono::system_clock::time_point DeadlineWithin(std::chrono::milliseconds budget,
                                                     std::chrono::system_clock::time_point bound) {
  const auto now = std::chrono::system_clock::now();
  return bound - now < budget ? bound : now + budget;
}

// A failed peer call as a status: DEADLINE_EXCEEDED when bounds.deadline
// passed, CANCELLED when `cancel` fired, UNAVAILABLE
// for an unreachable or too slow peer (`slow` says what it was too slow
// for), else the peer's own code. `what` names the call.
absl::Status PeerCallError(const grpc::Status& st, const MigrationCancel& cancel,
                           const MigrateBounds& bounds, const std::string& peer,
                           std::string_view what, std::string_view slow) {
  // First: a caller whose deadline passed is also cancelled (OnCancel).
  if (std::chrono::system_clock::now() >= bounds.deadline) {
    return absl::DeadlineExceededError(absl::StrCat("migration to ", peer, ": ",
                                                    util::Sv(bounds.deadline_name),
                                                    " passed during ", util::Sv(what)));
  }
  if (cancel.cancelled()) {
    return absl::CancelledError(absl::StrCat("migration to ", peer, " cancelled during ",
                                             util::Sv(what),
                                             " (caller cancelled, session released, or the "
                                             "node stops)"));
  }
  const std::string peer_says =
      absl::StrCat(util::Sv(GrpcCodeName(st.error_code())), ": ", st.error_message());
  if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return absl::UnavailableError(absl::StrCat("peer ", peer, ": ", util::Sv(what), " ",
                                               util::Sv(slow), " (", peer_says, ")"));
  }
  if (st.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return absl::UnavailableError(
        absl::StrCat("peer ", peer, ": ", util::Sv(what), ": ", peer_says));
  }
  return absl::Status(
      static_cast<absl::StatusCode>(st.error_code()),
      absl::StrCat("peer ", peer, " refused ",
                   what == "ImportSession" ? "the import" : util::Sv(what), ": ", peer_says));
}

// What every call to a migration's peer carries: the bearer token the
// migration was given, the caller's trace context, and `deadline`.
void PreparePeerCall(grpc::ClientContext& c, const std::string& peer_token,
                     const MigrateBounds& bounds, std::chrono::system_clock::time_point deadline) {
  if (!peer_token.empty()) c.AddMetadata("authorization", "Bearer " + peer_token);
  ForwardTraceContext(bounds.traceparent, c);
  c.set_deadline(deadline);
}

// The client side of a migration: the peer's versions, then its ImportSession.
// `channel` is the dialer's, to `peer`.
absl::StatusOr<v1::ImportSessionResponse> SendToPeer(ServiceContext& ctx, const std::string& peer,
                                                     const std::shared_ptr<grpc::Channel>& channel,
                                                     const std::string& peer_token, bool f16,
                                                     session::SessionStore::Lease& lease,
                                                     const MigrateBounds& bounds,
                                                     MigrationCancel& cancel, uint32_t* version,
                                                     size_t* wire_bytes, bool* answer_lost) {
  const ServerConfig& config = *ctx.config;
  auto stub = v1::Inference::NewStub(channel);
  auto prepare = [&](grpc::ClientContext& c, std::chrono::milliseconds budget) {
    PreparePeerCall(c, peer_token, bounds, DeadlineWithin(budget, bounds.deadline));
  };
  // The channel connects on this first call (not wait-for-ready: a refused
  // connection fails at once), so the connect timeout bounds both.
  v1::ModelInfo info;
  {
    grpc::ClientContext c;
    prepare(c, config.peer_connect_timeout);
    cancel.Attach(&c);
    const grpc::Status st = stub->GetModelInfo(&c, {}, &info);
    cancel.Detach();
    if (!st.ok()) {
      return PeerCallError(st, cancel, bounds, peer, "GetModelInfo",
                           absl::StrCat("did not connect and answer within --peer-connect-timeout ",
                                        config.peer_connect_timeout.count() / 1000.0, " s"));
    }
  }
  // --peer-dns lists this node too (a headless Service resolves to every
  // pod): a session does not move to where it is.
  if (info.node() == ctx.node_name) {
    return absl::FailedPreconditionError(
        absl::StrCat("peer ", peer, " is this node (", ctx.node_name, ")"));
  }
  std::vector<uint32_t> versions(info.wire_versions().begin(), info.wire_versions().end());
  CORTIQ_ASSIGN_OR_RETURN(*version, session::NegotiateWireVersion(versions));
  session::SessionWireOptions o;
  o.version = *version;
  o.f16 = f16;
  CORTIQ_ASSIGN_OR_RETURN(session::SessionWireSource src,
                          session::SessionWireSource::Make(*lease, ctx.wire_fingerprint, o));
  *wire_bytes = src.size();

  if (ImportSessionPath().empty()) {
    return absl::InternalError("the generated descriptors have no ImportSession(stream WireChunk)");
  }
  const std::chrono::milliseconds budget =
      PeerStreamBudget(config.peer_connect_timeout, config.peer_min_throughput, src.size());
  grpc::ClientContext c;
  prepare(c, budget);
  v1::ImportSessionResponse resp;
  cancel.Attach(&c);
  const grpc::Status st = StreamToPeer(channel, c, src, &resp);
  cancel.Detach();
  // Codes the transport gives when the call broke, timed out or was
  // cancelled: the peer may have installed the session and answered OK on a
  // connection that failed before the answer arrived. A refusal of the
  // peer's own (any other code) installed nothing there.
  const grpc::StatusCode code = st.error_code();
  *answer_lost = code == grpc::StatusCode::DEADLINE_EXCEEDED ||
                 code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::CANCELLED ||
                 code == grpc::StatusCode::UNKNOWN || code == grpc::StatusCode::INTERNAL;
  if (!st.ok()) {
    return PeerCallError(
        st, cancel, bounds, peer, "ImportSession",
        absl::StrCat("did not take ", src.size(), " bytes within ", budget.count() / 1000.0,
                     " s (--peer-min-throughput ", config.peer_min_throughput, " bytes/s)"));
  }
  return resp;
}

// An import whose answer did not come back (`answer_lost`): the session
// may be on the peer as well as here, where the caller is told the move
// failed and keeps it. The peer is asked to release `session_id`, served
// there and never forwarded (x-cortiq-hops at the limit), with the token
// the import used, on behalf of an admin (the session may be any tenant's).
// Bounded by --peer-connect-timeout and not by the caller's deadline or
// cancel, which may be what ended the import; the caller holds the
// session's lease, so no other move of it runs meanwhile. A peer that
// cannot be asked leaves the session on both nodes: logged and counted
// (cortiq_migration_undos_total{result="failed"}).
void UndoImportAtPeer(ServiceContext& ctx, const std::string& peer,
                      const std::shared_ptr<grpc::Channel>& channel, const std::string& peer_token,
                      const std::string& session_id, const MigrateBounds& bounds) {
  auto stub = v1::Inference::NewStub(channel);
  grpc::ClientContext c;
  PreparePeerCall(c, peer_token, bounds,
                  std::chrono::system_clock::now() + ctx.config->peer_connect_timeout);
  // A peer token acts as an admin here (it may call only ImportSession and
  // GetModelInfo on its own); an admin token ignores the header.
  c.AddMetadata(kOnBehalfOfHeader, OnBehalfOfValue(Caller{"", Role::kAdmin}));
  c.AddMetadata(kHopsHeader, std::to_string(kMaxForwardHops));
  c.set_wait_for_ready(true);  // the import's connection may just have broken: dial again
  v1::ReleaseSessionRequest req;
  req.set_session_id(session_id);
  v1::ReleaseSessionResponse resp;
  const grpc::Status st = stub->ReleaseSession(&c, req, &resp);
  MigrationUndo result = MigrationUndo::kFailed;
  if (st.ok()) {
    result = resp.released() ? MigrationUndo::kReleased : MigrationUndo::kAbsent;
  } else if (st.error_code() == grpc::StatusCode::NOT_FOUND) {
    result = MigrationUndo::kAbsent;
  }
  if (ctx.metrics) ctx.metrics->CountMigrationUndo(result);
  switch (result) {
    case MigrationUndo::kReleased:
      spdlog::warn(
          "session {}: its import on {} did not answer, but the peer had installed it: "
          "released there, this node keeps the session",
          session_id, util::EscapeForLog(peer));
      break;
    case MigrationUndo::kAbsent:
      spdlog::info("session {}: its import on {} did not answer; the peer does not hold it",
                   session_id, util::EscapeForLog(peer));
      break;
    case MigrationUndo::kFailed:
      spdlog::error(
          "session {}: its import on {} did not answer, and the peer could not be asked to "
          "release what it may have installed ({}: {}): the session may be on both nodes",
          session_id, util::EscapeForLog(peer), GrpcCodeName(st.error_code()),
          util::EscapeForLog(st.error_message()));
      break;
  }
}

}  // namespace

std::chrono::milliseconds PeerStreamBudget(std::chrono::milliseconds connect_timeout,
                                           size_t min_throughput, size_t wire_bytes) {
  const double send_ms = 1000.0 * static_cast<double>(wire_bytes) /
                         static_cast<double>(std::max<size_t>(min_throughput, 1));
  return connect_timeout + std::chrono::milliseconds(static_cast<int64_t>(std::ceil(send_ms))) +
         kPeerDeadlineFloor;
}

void MigrationCancel::Cancel() {
  std::lock_guard lock(mu_);
  cancelled_ = true;
  if (call_ != nullptr) call_->TryCancel();
}

bool MigrationCancel::cancelled() const {
  std::lock_guard lock(mu_);
  return cancelled_;
}

void MigrationCancel::Attach(grpc::ClientContext* c) {
  std::lock_guard lock(mu_);
  call_ = c;
  // A context cancelled before its call starts cancels the call as it starts.
  if (cancelled_) c->TryCancel();
}

void MigrationCancel::Detach() {
  std::lock_guard lock(mu_);
  call_ = nullptr;
}

absl::StatusOr<MigrateOutcome> MigrateOut(ServiceContext& ctx, const std::string& session_id,
                                          const std::string& peer, const std::string& peer_token,
                                          bool f16, const MigrateBounds& bounds) {
  const std::shared_ptr<MigrationCancel> cancel =
      bounds.cancel ? bounds.cancel : std::make_shared<MigrationCancel>();
  absl::StatusOr<MigrateOutcome> result;
  bool moving_marked = false;
  // Only a peer or a --migrate-allow address is dialled; any other is
  // PERMISSION_DENIED here, before a channel exists and before the session
  // is touched.
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = ctx.peers->Channel(peer);
  if (!channel.ok()) {
    result = channel.status();
  } else {
    absl::StatusOr<session::SessionStore::Lease> lease = ctx.store->Acquire(session_id);
    if (!lease.ok()) {
      result = lease.status();
    } else {
      // ReleaseSession (and shutdown's CancelAll) stop the peer call, so the
      // lease comes back at once instead of after the peer's deadline.
      lease->SetCanceller([cancel] { cancel->Cancel(); });
      MigrateOutcome out;
      // --state-dir: from the peer's answer (its copy on its disk) until
      // this node's file is deleted, the session is on two disks. The mark
      // makes a crash in between restore it here in doubt, not as a second
      // copy (Server::SettleMoves asks the peers). It goes once the session
      // is released here, or the move failed.
      absl::Status marked = absl::OkStatus();
      if (ctx.persister != nullptr) {
        marked = ctx.persister->MarkMoving(session_id, peer);
        moving_marked = marked.ok();
      }
      if (marked.ok()) util::Failpoint("migrate-before-send");
      bool answer_lost = false;
      absl::StatusOr<v1::ImportSessionResponse> sent =
          marked.ok() ? SendToPeer(ctx, peer, *channel, peer_token, f16, *lease, bounds, *cancel,
                                   &out.version, &out.wire_bytes, &answer_lost)
                      : absl::StatusOr<v1::ImportSessionResponse>(marked);
      if (sent.ok()) {
        util::Failpoint("migrate-after-peer-import");
        // The peer holds a complete copy: only now does the source let go.
        lease->ReleaseOnReturn(session::ReleaseReason::kMigrated);
        out.peer_session_id = sent->session().session_id();
        out.peer_node = sent->session().node();
        // Calls that still name it here go there (forwarding, --forward-ttl).
        if (ctx.router) ctx.router->Moved(session_id, peer);
        result = out;
      } else {
        result = sent.status();
        // Still under the lease: the session is here and only here after this.
        if (answer_lost) UndoImportAtPeer(ctx, peer, *channel, peer_token, session_id, bounds);
      }
    }  // the lease returns here: released (migrated, its file deleted) or intact
  }
  if (moving_marked) {
    if (result.ok()) util::Failpoint("migrate-before-unmark");
    ctx.persister->ClearMoving(session_id);
  }
  if (ctx.metrics) {
    ctx.metrics->CountMigration(MigrationDirection::kOut,
                                result.ok() ? MigrationResult::kOk : MigrationResult::kFailed);
  }
  return result;
}

namespace {

// Finishes a unary call refused before any work (logged and counted).
grpc::ServerUnaryReactor* FinishRefused(UnaryReactor* reactor, CallLog& log,
                                        const absl::Status& st) {
  const grpc::Status gs = ToGrpcStatus(st);
  log.Done(gs.error_code(), gs.error_message());
  reactor->Reply(gs);
  return reactor;
}

// Runs a blocking unary call (a client of a peer) on the server's background
// workers (ctx->background), so it never holds a gRPC callback thread.
// `body` returns the call's status and its log fields; `then` runs after the
// reply is sent, and the task counts as in flight (Server::Shutdown waits
// for it) until `then` has returned. A task the workers refuse (the server
// stops: UNAVAILABLE; too many queued: RESOURCE_EXHAUSTED) is answered at
// once.
template <typename Body>
grpc::ServerUnaryReactor* RunInBackground(ServiceContext* ctx, UnaryReactor* reactor,
                                          std::shared_ptr<CallLog> log, Body body,
                                          std::function<void()> then = nullptr) {
  const absl::Status queued = ctx->background->Submit(
      [reactor, log, body = std::move(body), then = std::move(then)]() mutable {
        auto [status, fields] = body();
        const grpc::Status gs = ToGrpcStatus(status);
        log->Done(gs.error_code(), gs.error_message(), std::move(fields));
        reactor->Reply(gs);
        if (then) then();
      });
  if (!queued.ok()) return FinishRefused(reactor, *log, queued);
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* InferenceService::MigrateSession(grpc::CallbackServerContext* context,
                                                           const v1::MigrateSessionRequest* request,
                                                           v1::MigrateSessionResponse* response,
                                                           UnaryReactor* reactor) {
  // A session another node holds is migrated by that node, to a target its
  // own --peers / --migrate-allow permit; this node must permit it too, so a
  // refused target is refused here, before anything is dialled, whether or
  // not the session exists.
  if (ShouldForward(*ctx_, context, request->session_id(), reactor->caller()) &&
      ctx_->peers->CheckAllowed(request->peer(), PeerDialer::Wait::kNo).ok()) {
    return ForwardUnaryToOwner(ctx_, context, reactor, "MigrateSession", request->session_id(),
                               reactor->caller());
  }
  auto log = std::make_shared<CallLog>(ctx_, context, "MigrateSession");
  absl::Status st = CheckAuth(*ctx_, context);
  if (st.ok()) st = CheckSessionId(request->session_id());
  if (st.ok() && request->peer().empty()) st = absl::InvalidArgumentError("peer: empty (HOST:PORT)");
  if (st.ok()) st = CheckWireRequest(0, request->dtype());
  if (!st.ok()) return FinishRefused(reactor, *log, st);
  MigrateBounds bounds;
  bounds.deadline = context->deadline();
  // The caller's cancel (or its deadline passing) cancels the migration's
  // peer call.
  bounds.cancel = std::make_shared<MigrationCancel>();
  bounds.traceparent = log->traceparent();
  reactor->OnCancelled([cancel = bounds.cancel] { cancel->Cancel(); });
  return RunInBackground(ctx_, reactor, log, [ctx = ctx_, request, response, bounds] {
    // Checked when the task runs: one queued before a drain began must not
    // start a migration the drain (and so the shutdown) would wait for.
    absl::StatusOr<MigrateOutcome> out =
        ctx->draining.load()
            ? absl::UnavailableError("server is draining: its drain migrates the sessions")
            : MigrateOut(*ctx, request->session_id(), request->peer(), request->peer_token(),
                         request->dtype() == v1::WIRE_DTYPE_F16, bounds);
    if (out.ok()) {
      response->set_peer_session_id(out->peer_session_id);
      response->set_wire_bytes(out->wire_bytes);
      response->set_version(out->version);
      response->set_peer_node(out->peer_node);
    }
    return std::make_pair(out.status(),
                          LogFields{{"session", request->session_id()}, {"to", request->peer()}});
  });
}

grpc::ServerUnaryReactor* InferenceService::Drain(grpc::CallbackServerContext* context,
                                                  const v1::DrainRequest* request,
                                                  v1::DrainResponse* response,
                                                  UnaryReactor* reactor) {
  auto log = std::make_shared<CallLog>(ctx_, context, "Drain");
  absl::Status st = CheckAuth(*ctx_, context);
  if (st.ok() && request->has_grace_seconds() &&
      !(request->grace_seconds() >= 0 && request->grace_seconds() <= 3600)) {
    st = absl::InvalidArgumentError(absl::StrCat("grace_seconds: ", request->grace_seconds(),
                                                 " is outside [0, 3600]"));
  }
  if (st.ok() && !ctx_->drain) st = absl::UnimplementedError("Drain: not available in this process");
  if (!st.ok()) return FinishRefused(reactor, *log, st);
  std::optional<double> grace;
  if (request->has_grace_seconds()) grace = request->grace_seconds();
  return RunInBackground(
      ctx_, reactor, log,
      [ctx = ctx_, response, grace] {
        const DrainReport report = ctx->drain(grace);
        for (const DrainReport::Entry& e : report.sessions) {
          v1::DrainedSession* d = response->add_sessions();
          d->set_session_id(e.session_id);
          d->set_migrated(e.migrated);
          d->set_peer(e.peer);
          d->set_peer_session_id(e.peer_session_id);
          d->set_peer_node(e.peer_node);
          d->set_error(e.error);
        }
        response->set_migrated(static_cast<uint32_t>(report.migrated));
        response->set_failed(static_cast<uint32_t>(report.failed));
        return std::make_pair(absl::OkStatus(),
                              LogFields{{"migrated", static_cast<int64_t>(report.migrated)},
                                        {"failed", static_cast<int64_t>(report.failed)}});
      },
      ctx_->after_drain);
}

}  // namespace cortiq::server
