// ExportSession, ImportSession and MigrateSession: sessions moving between
// nodes in the session wire format (core/session/session_wire.h,
// docs/WIRE_FORMAT.md).
//
// Export leases the session (ABORTED while it generates), serialises it,
// returns the lease, then streams chunks of at most kChunkBytes with one
// write in flight. Import buffers chunks up to --max-import-bytes (refused
// with RESOURCE_EXHAUSTED before a chunk beyond it is kept), validates the
// whole stream into a new session, then installs it under the cap and the
// budget. Migrate runs on its own thread (it is a client of the peer): lease,
// learn the peer's versions (GetModelInfo), export at the highest common
// version, stream to the peer's ImportSession, and release locally (reason
// "migrated") only after the peer answered OK; on any failure the lease is
// returned and the session stays as it was.
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/session/session_wire.h"
#include "grpcpp/grpcpp.h"
#include "core/util/status_macros.h"
#include "core/util/strings.h"
#include "server/call_util.h"
#include "server/migration.h"

namespace cortiq::server {

namespace {

constexpr size_t kChunkBytes = 1 << 20;

session::SessionWireOptions WireOptionsFrom(uint32_t version, v1::WireDtype dtype) {
  session::SessionWireOptions o;
  o.version = version == 0 ? session::kSessionWireMaxVersion : version;
  o.f16 = dtype == v1::WIRE_DTYPE_F16;
  return o;
}

absl::Status CheckWireRequest(uint32_t version, v1::WireDtype dtype) {
  if (version != 0 &&
      (version < session::kSessionWireMinVersion || version > session::kSessionWireMaxVersion)) {
    return absl::InvalidArgumentError(absl::StrCat("version: ", version,
                                                   " is not one this server writes (",
                                                   session::kSessionWireMinVersion, "..",
                                                   session::kSessionWireMaxVersion, "; 0 = the highest)"));
  }
  if (dtype != v1::WIRE_DTYPE_UNSPECIFIED && dtype != v1::WIRE_DTYPE_F32 &&
      dtype != v1::WIRE_DTYPE_F16) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype: unknown value ", static_cast<int>(dtype), " (F32 = 1 | F16 = 2)"));
  }
  return absl::OkStatus();
}

// Exports a session under its lease; counts a refusal by reason.
absl::StatusOr<std::string> ExportLeased(ServiceContext& ctx, const std::string& id,
                                         const session::SessionWireOptions& options) {
  CORTIQ_ASSIGN_OR_RETURN(session::SessionStore::Lease lease, ctx.store->Acquire(id));
  absl::StatusOr<std::string> wire = session::ExportSessionWire(*lease, ctx.wire_fingerprint, options);
  if (!wire.ok() && wire.status().code() == absl::StatusCode::kFailedPrecondition && ctx.metrics) {
    const std::string msg(wire.status().message());
    ExportRefusal reason = msg.find("importance") != std::string::npos ? ExportRefusal::kImportance
                           : msg.find("O(1)") != std::string::npos   ? ExportRefusal::kO1Overlay
                           : msg.find("int8") != std::string::npos   ? ExportRefusal::kInt8Rows
                                                                     : ExportRefusal::kOther;
    ctx.metrics->CountExportRefused(reason);
  }
  return wire;
}

class ExportReactor final : public grpc::ServerWriteReactor<v1::WireChunk> {
 public:
  ExportReactor(ServiceContext* ctx, grpc::CallbackServerContext* call,
                const v1::ExportSessionRequest& req)
      : log_(ctx, "ExportSession") {
    absl::Status st = CheckAuth(*ctx, call);
    if (st.ok()) st = CheckSessionId(req.session_id());
    if (st.ok()) st = CheckWireRequest(req.version(), req.dtype());
    if (st.ok()) {
      absl::StatusOr<std::string> wire =
          ExportLeased(*ctx, req.session_id(), WireOptionsFrom(req.version(), req.dtype()));
      if (wire.ok()) {
        wire_ = *std::move(wire);
      } else {
        st = wire.status();
      }
    }
    if (!st.ok()) {
      Done(ToGrpcStatus(st));
      return;
    }
    NextWrite();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Done(grpc::Status(grpc::StatusCode::CANCELLED, "export stream broken"));
      return;
    }
    NextWrite();
  }
  void OnCancel() override { Done(grpc::Status::CANCELLED); }
  void OnDone() override {
    log_.Done(status_.error_code(), status_.error_message(), absl::StrCat("bytes=", wire_.size()));
    delete this;
  }

 private:
  // One write in flight: called from the constructor and OnWriteDone only.
  void NextWrite() {
    std::lock_guard lock(mu_);
    if (finished_) return;
    if (offset_ >= wire_.size() && offset_ > 0) {
      finished_ = true;
      status_ = grpc::Status::OK;
      Finish(status_);
      return;
    }
    const size_t n = std::min(kChunkBytes, wire_.size() - offset_);
    chunk_.set_data(wire_.data() + offset_, n);
    offset_ += n;
    StartWrite(&chunk_);
  }
  void Done(const grpc::Status& s) {
    std::lock_guard lock(mu_);
    if (finished_) return;
    finished_ = true;
    status_ = s;
    Finish(s);
  }

  CallLog log_;
  std::mutex mu_;
  std::string wire_;
  size_t offset_ = 0;
  bool finished_ = false;
  grpc::Status status_;
  v1::WireChunk chunk_;
};

class ImportReactor final : public grpc::ServerReadReactor<v1::WireChunk> {
 public:
  ImportReactor(ServiceContext* ctx, grpc::CallbackServerContext* call,
                v1::ImportSessionResponse* response)
      : ctx_(ctx), response_(response), log_(ctx, "ImportSession") {
    absl::Status st = CheckAuth(*ctx, call);
    if (st.ok()) st = Unavailable(*ctx);
    if (!st.ok()) {
      Done(ToGrpcStatus(st));
      return;
    }
    StartRead(&chunk_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client finished sending: validate and install
      Done(ToGrpcStatus(Install()));
      return;
    }
    const size_t limit = ctx_->config->max_import_bytes;
    if (received_ + chunk_.data().size() > limit) {
      Done(ToGrpcStatus(absl::ResourceExhaustedError(
          absl::StrCat("import: the stream exceeds --max-import-bytes ", limit,
                       " (refused before buffering more)"))));
      return;
    }
    // Chunks are kept as they come (no reallocation of a growing buffer);
    // they are joined once, into a buffer of the exact size, at the end.
    received_ += chunk_.data().size();
    chunks_.push_back(std::move(*chunk_.mutable_data()));
    StartRead(&chunk_);
  }
  void OnCancel() override { Done(grpc::Status::CANCELLED); }
  void OnDone() override {
    if (ctx_->metrics) {
      ctx_->metrics->CountMigration(MigrationDirection::kIn,
                                    status_.ok() ? MigrationResult::kOk : MigrationResult::kFailed);
    }
    log_.Done(status_.error_code(), status_.error_message(),
              absl::StrCat("bytes=", received_, " session=", id_.empty() ? "-" : id_));
    delete this;
  }

 private:
  absl::Status Install() {
    if (received_ == 0) return absl::DataLossError("import: empty stream");
    std::string buffer;
    buffer.reserve(received_);
    for (std::string& c : chunks_) {
      buffer.append(c);
      std::string().swap(c);  // free each chunk once copied
    }
    chunks_.clear();
    CORTIQ_ASSIGN_OR_RETURN(
        std::unique_ptr<session::Session> s,
        session::ImportSessionWire(buffer, *ctx_->model, ctx_->wire_fingerprint,
                                   session::SessionStore::RandomId()));
    CORTIQ_ASSIGN_OR_RETURN(session::SessionStore::Lease lease, ctx_->store->Install(std::move(s)));
    id_ = lease->id();
    lease.Return();
    auto snap = ctx_->store->Get(id_);
    if (snap) ToProto(*snap, response_->mutable_session());
    return absl::OkStatus();
  }
  void Done(const grpc::Status& s) {
    std::lock_guard lock(mu_);
    if (finished_) return;
    finished_ = true;
    status_ = s;
    Finish(s);
  }

  ServiceContext* ctx_;
  v1::ImportSessionResponse* response_;
  CallLog log_;
  std::mutex mu_;
  bool finished_ = false;
  grpc::Status status_;
  std::vector<std::string> chunks_;
  size_t received_ = 0;
  std::string id_;
  v1::WireChunk chunk_;
};

// The client side of a migration: the peer's versions, then its ImportSession.
absl::StatusOr<v1::ImportSessionResponse> SendToPeer(ServiceContext& ctx, const std::string& peer,
                                                     const std::string& peer_token, bool f16,
                                                     session::SessionStore::Lease& lease,
                                                     uint32_t* version, size_t* wire_bytes) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  auto channel = grpc::CreateCustomChannel(peer, grpc::InsecureChannelCredentials(), args);
  auto stub = v1::Inference::NewStub(channel);
  auto with_token = [&](grpc::ClientContext& c, int seconds) {
    if (!peer_token.empty()) c.AddMetadata("authorization", "Bearer " + peer_token);
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  };
  v1::ModelInfo info;
  {
    grpc::ClientContext c;
    with_token(c, 10);
    grpc::Status st = stub->GetModelInfo(&c, {}, &info);
    if (!st.ok()) {
      return absl::UnavailableError(absl::StrCat("peer ", peer, ": GetModelInfo: ",
                                                 st.error_message(), " (",
                                                 util::Sv(GrpcCodeName(st.error_code())), ")"));
    }
  }
  std::vector<uint32_t> versions(info.wire_versions().begin(), info.wire_versions().end());
  CORTIQ_ASSIGN_OR_RETURN(*version, session::NegotiateWireVersion(versions));
  session::SessionWireOptions o;
  o.version = *version;
  o.f16 = f16;
  absl::StatusOr<std::string> wire = session::ExportSessionWire(*lease, ctx.wire_fingerprint, o);
  if (!wire.ok()) return wire.status();
  *wire_bytes = wire->size();

  grpc::ClientContext c;
  with_token(c, 600);
  v1::ImportSessionResponse resp;
  auto writer = stub->ImportSession(&c, &resp);
  v1::WireChunk chunk;
  for (size_t off = 0; off < wire->size(); off += kChunkBytes) {
    chunk.set_data(wire->data() + off, std::min(kChunkBytes, wire->size() - off));
    if (!writer->Write(chunk)) break;  // the peer ended the call: Finish says why
  }
  writer->WritesDone();
  grpc::Status st = writer->Finish();
  if (!st.ok()) {
    const absl::StatusCode code = st.error_code() == grpc::StatusCode::UNAVAILABLE ||
                                          st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
                                      ? absl::StatusCode::kUnavailable
                                      : static_cast<absl::StatusCode>(st.error_code());
    return absl::Status(code, absl::StrCat("peer ", peer, " refused the import: ",
                                           util::Sv(GrpcCodeName(st.error_code())), ": ",
                                           st.error_message()));
  }
  return resp;
}

}  // namespace

absl::StatusOr<MigrateOutcome> MigrateOut(ServiceContext& ctx, const std::string& session_id,
                                          const std::string& peer, const std::string& peer_token,
                                          bool f16) {
  absl::StatusOr<MigrateOutcome> result;
  {
    absl::StatusOr<session::SessionStore::Lease> lease = ctx.store->Acquire(session_id);
    if (!lease.ok()) {
      result = lease.status();
    } else {
      MigrateOutcome out;
      absl::StatusOr<v1::ImportSessionResponse> sent =
          SendToPeer(ctx, peer, peer_token, f16, *lease, &out.version, &out.wire_bytes);
      if (sent.ok()) {
        // The peer holds a complete copy: only now does the source let go.
        lease->ReleaseOnReturn(session::ReleaseReason::kMigrated);
        out.peer_session_id = sent->session().session_id();
        result = out;
      } else {
        result = sent.status();
      }
    }  // the lease returns here: released (migrated) or intact
  }
  if (ctx.metrics) {
    ctx.metrics->CountMigration(MigrationDirection::kOut,
                                result.ok() ? MigrationResult::kOk : MigrationResult::kFailed);
  }
  return result;
}

grpc::ServerWriteReactor<v1::WireChunk>* InferenceService::ExportSession(
    grpc::CallbackServerContext* context, const v1::ExportSessionRequest* request) {
  return new ExportReactor(ctx_, context, *request);
}

grpc::ServerReadReactor<v1::WireChunk>* InferenceService::ImportSession(
    grpc::CallbackServerContext* context, v1::ImportSessionResponse* response) {
  return new ImportReactor(ctx_, context, response);
}

namespace {

// Finishes a unary call refused before any work (logged and counted).
grpc::ServerUnaryReactor* FinishRefused(grpc::ServerUnaryReactor* reactor, CallLog& log,
                                        const absl::Status& st) {
  const grpc::Status gs = ToGrpcStatus(st);
  log.Done(gs.error_code(), gs.error_message());
  reactor->Finish(gs);
  return reactor;
}

// Runs a blocking unary call (a client of a peer) on a thread of its own, so
// it never holds a gRPC callback thread; Server::Shutdown waits for it
// (migrations_in_flight). `body` returns the call's status and a log detail;
// `then` runs after the reply is sent.
template <typename Body>
grpc::ServerUnaryReactor* RunDetached(ServiceContext* ctx, grpc::ServerUnaryReactor* reactor,
                                      std::shared_ptr<CallLog> log, Body body,
                                      std::function<void()> then = nullptr) {
  ctx->migrations_in_flight.fetch_add(1);
  std::thread([ctx, reactor, log, body = std::move(body), then = std::move(then)]() mutable {
    const auto [status, detail] = body();
    const grpc::Status gs = ToGrpcStatus(status);
    log->Done(gs.error_code(), gs.error_message(), detail);
    reactor->Finish(gs);
    ctx->migrations_in_flight.fetch_sub(1);
    if (then) then();
  }).detach();
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* InferenceService::MigrateSession(grpc::CallbackServerContext* context,
                                                           const v1::MigrateSessionRequest* request,
                                                           v1::MigrateSessionResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto log = std::make_shared<CallLog>(ctx_, "MigrateSession");
  absl::Status st = CheckAuth(*ctx_, context);
  if (st.ok()) st = CheckSessionId(request->session_id());
  if (st.ok() && request->peer().empty()) st = absl::InvalidArgumentError("peer: empty (HOST:PORT)");
  if (st.ok()) st = CheckWireRequest(0, request->dtype());
  if (!st.ok()) return FinishRefused(reactor, *log, st);
  return RunDetached(ctx_, reactor, log, [ctx = ctx_, request, response] {
    absl::StatusOr<MigrateOutcome> out =
        MigrateOut(*ctx, request->session_id(), request->peer(), request->peer_token(),
                   request->dtype() == v1::WIRE_DTYPE_F16);
    if (out.ok()) {
      response->set_peer_session_id(out->peer_session_id);
      response->set_wire_bytes(out->wire_bytes);
      response->set_version(out->version);
    }
    return std::make_pair(out.status(), absl::StrCat("session=", request->session_id(),
                                                     " peer=", request->peer()));
  });
}

grpc::ServerUnaryReactor* InferenceService::Drain(grpc::CallbackServerContext* context,
                                                  const v1::DrainRequest* request,
                                                  v1::DrainResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto log = std::make_shared<CallLog>(ctx_, "Drain");
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
  return RunDetached(
      ctx_, reactor, log,
      [ctx = ctx_, response, grace] {
        const DrainReport report = ctx->drain(grace);
        for (const DrainReport::Entry& e : report.sessions) {
          v1::DrainedSession* d = response->add_sessions();
          d->set_session_id(e.session_id);
          d->set_migrated(e.migrated);
          d->set_peer(e.peer);
          d->set_peer_session_id(e.peer_session_id);
          d->set_error(e.error);
        }
        response->set_migrated(static_cast<uint32_t>(report.migrated));
        response->set_failed(static_cast<uint32_t>(report.failed));
        return std::make_pair(absl::OkStatus(), absl::StrCat("migrated=", report.migrated,
                                                             " failed=", report.failed));
      },
      ctx_->after_drain);
}

}  // namespace cortiq::server
