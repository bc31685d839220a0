// ExportSession, ImportSession and MigrateSession: sessions moving between
// nodes in the session wire format (core/session/session_wire.h,
// docs/WIRE_FORMAT.md).
//
// Both directions use the raw (byte) API for the chunks, so the bytes are
// copied once on each side besides the kernel's: Export leases the session
// (ABORTED while it generates), reads its stream from the caches into chunk
// buffers of at most kChunkBytes, returns the lease, then sends the buffers
// as they are, one write in flight. Import feeds each chunk, straight from
// the received slices, to a SessionWireSink, which validates it and writes
// the layers into a new session's caches (no buffer of the whole stream); a
// chunk that would pass --max-import-bytes is refused with
// RESOURCE_EXHAUSTED before it is used (the rest of a stream already known
// to be corrupt is only counted); at the end the new session is installed
// under the cap and the budget. Migrate runs on the server's background
// workers (it is a blocking client of the peer): lease, learn the peer's
// versions (GetModelInfo), stream at the highest common version, reading
// each chunk from the caches while the previous one is sent, to the peer's
// ImportSession, and release locally (reason "migrated") only after the
// peer answered OK; on any failure the lease is returned and the session
// stays as it was.
#include "server/migration.h"

#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/session/session_wire.h"
#include "core/util/status_macros.h"
#include "core/util/strings.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "server/call_util.h"

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

// The session's stream under its lease (the caller holds it while reading);
// counts a refusal by reason.
absl::StatusOr<session::SessionWireSource> ExportSource(
    ServiceContext& ctx, const session::Session& s, const session::SessionWireOptions& options) {
  absl::StatusOr<session::SessionWireSource> src =
      session::SessionWireSource::Make(s, ctx.wire_fingerprint, options);
  // By the typed reason the exporter attached (kv::WireRefusalOf), never by
  // the message text: a reworded message cannot move the count to another
  // label. A refusal without one counts as kOther.
  if (!src.ok() && src.status().code() == absl::StatusCode::kFailedPrecondition && ctx.metrics) {
    ctx.metrics->CountExportRefused(
        kv::WireRefusalOf(src.status()).value_or(ExportRefusal::kOther));
  }
  return src;
}

// WireChunk's data field (bytes data = 1) as protobuf frames it: the tag
// of a length-delimited field numbered as the generated code says.
constexpr uint32_t kChunkDataTag = google::protobuf::internal::WireFormatLite::MakeTag(
    v1::WireChunk::kDataFieldNumber,
    google::protobuf::internal::WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
static_assert(kChunkBytes <= INT32_MAX, "a chunk's length is a protobuf length (< 2^31)");
// The most bytes before a chunk's data: the tag (a varint32, <= 5 bytes) and
// the length (a varint, read as up to 10 bytes).
constexpr size_t kChunkHeadMax = 5 + 10;

// A serialised WireChunk around `data` without copying it: the field's tag
// and length (protobuf's varints) in a slice of their own, then the data
// slice as it is.
grpc::ByteBuffer ChunkMessage(grpc::Slice data) {
  using google::protobuf::io::CodedOutputStream;
  uint8_t head[kChunkHeadMax];
  uint8_t* end = CodedOutputStream::WriteTagToArray(kChunkDataTag, head);
  end = CodedOutputStream::WriteVarint32ToArray(static_cast<uint32_t>(data.size()), end);
  grpc::Slice slices[2] = {grpc::Slice(head, static_cast<size_t>(end - head)), std::move(data)};
  return grpc::ByteBuffer(slices, 2);
}

// A snapshot of a session's stream as chunk slices, read under its lease
// (which returns before a byte is sent, so a slow client never holds the
// session). Each chunk is read from the caches into its own buffer, which
// gRPC sends as is and frees once sent.
absl::StatusOr<std::vector<grpc::Slice>> ExportChunks(ServiceContext& ctx, const std::string& id,
                                                      const session::SessionWireOptions& options) {
  CORTIQ_ASSIGN_OR_RETURN(session::SessionStore::Lease lease, ctx.store->Acquire(id));
  CORTIQ_ASSIGN_OR_RETURN(session::SessionWireSource src, ExportSource(ctx, *lease, options));
  std::vector<grpc::Slice> chunks;
  chunks.reserve((src.size() + kChunkBytes - 1) / kChunkBytes);
  while (src.left() > 0) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunkBytes, src.left()));
    std::unique_ptr<char[]> data = std::make_unique_for_overwrite<char[]>(n);
    src.Read(data.get(), n);
    chunks.emplace_back(data.release(), n, [](void* p) { delete[] static_cast<char*>(p); });
  }
  return chunks;
}

// ExportSession on the raw (byte) API, so that each chunk goes out from the
// buffer it was read into.
class ExportReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  ExportReactor(ServiceContext* ctx, grpc::CallbackServerContext* call,
                const grpc::ByteBuffer& request)
      : log_(ctx, "ExportSession") {
    v1::ExportSessionRequest req;
    absl::Status st = CheckAuth(*ctx, call);
    if (st.ok()) {
      grpc::ByteBuffer copy(request);  // Deserialize consumes its input
      if (!grpc::SerializationTraits<v1::ExportSessionRequest>::Deserialize(&copy, &req).ok()) {
        st = absl::InvalidArgumentError("ExportSession: the request does not parse");
      }
    }
    if (st.ok()) st = CheckSessionId(req.session_id());
    if (st.ok()) st = CheckWireRequest(req.version(), req.dtype());
    if (st.ok()) {
      absl::StatusOr<std::vector<grpc::Slice>> chunks =
          ExportChunks(*ctx, req.session_id(), WireOptionsFrom(req.version(), req.dtype()));
      if (chunks.ok()) {
        chunks_ = *std::move(chunks);
      } else {
        st = chunks.status();
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
    log_.Done(status_.error_code(), status_.error_message(), absl::StrCat("bytes=", bytes_));
    delete this;
  }

 private:
  // One write in flight: called from the constructor and OnWriteDone only.
  // Each chunk's slice moves into the message; gRPC frees it once sent.
  void NextWrite() {
    std::lock_guard lock(mu_);
    if (finished_) return;
    if (next_ == chunks_.size()) {
      finished_ = true;
      status_ = grpc::Status::OK;
      Finish(status_);
      return;
    }
    bytes_ += chunks_[next_].size();
    message_ = ChunkMessage(std::move(chunks_[next_++]));
    StartWrite(&message_);
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
  std::vector<grpc::Slice> chunks_;  // the stream, at most kChunkBytes each
  size_t next_ = 0;                  // the next chunk to send
  size_t bytes_ = 0;                 // sent so far
  bool finished_ = false;
  grpc::Status status_;
  grpc::ByteBuffer message_;  // the chunk being written
};

// One received WireChunk {bytes data = 1}, seen without copying it: views of
// its data inside the message's slices when the message is what protobuf
// encoders write for it (the field's tag, its length, its bytes; nothing at
// all for empty data), else protobuf's parse of it.
class ChunkView {
 public:
  // False: the message is not a WireChunk. Views stay valid until the next Parse.
  bool Parse(grpc::ByteBuffer& message) {
    slices_.clear();
    pieces_.clear();
    size_ = 0;
    if (!message.Dump(&slices_).ok()) return false;
    const size_t total = message.Length();
    if (total == 0) return true;
    uint8_t head[kChunkHeadMax];
    size_t h = 0;
    for (const grpc::Slice& sl : slices_) {
      for (size_t i = 0; i < sl.size() && h < sizeof(head); ++i) head[h++] = sl.begin()[i];
    }
    google::protobuf::io::CodedInputStream in(head, static_cast<int>(h));
    uint64_t len = 0;
    if (in.ReadTag() == kChunkDataTag && in.ReadVarint64(&len) &&
        len == total - static_cast<size_t>(in.CurrentPosition())) {
      size_ = len;
      size_t skip = static_cast<size_t>(in.CurrentPosition());
      for (const grpc::Slice& sl : slices_) {
        std::string_view v(reinterpret_cast<const char*>(sl.begin()), sl.size());
        const size_t drop = std::min(skip, v.size());
        v.remove_prefix(drop);
        skip -= drop;
        if (!v.empty()) pieces_.push_back(v);
      }
      return true;
    }
    if (!grpc::SerializationTraits<v1::WireChunk>::Deserialize(&message, &parsed_).ok()) {
      return false;
    }
    size_ = parsed_.data().size();
    pieces_.push_back(parsed_.data());
    return true;
  }
  size_t size() const { return size_; }
  const std::vector<std::string_view>& pieces() const { return pieces_; }

 private:
  std::vector<grpc::Slice> slices_;  // references, keeping the views valid
  std::vector<std::string_view> pieces_;
  v1::WireChunk parsed_;
  size_t size_ = 0;
};

// ImportSession on the raw (byte) API, so that each chunk's data goes from
// the received slices straight into the new session's caches.
class ImportReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  ImportReactor(ServiceContext* ctx, grpc::CallbackServerContext* call, grpc::ByteBuffer* response)
      : ctx_(ctx),
        response_(response),
        log_(ctx, "ImportSession"),
        sink_(*ctx->model, ctx->wire_fingerprint, session::SessionStore::RandomId(),
              ctx->config->max_import_bytes) {
    absl::Status st = CheckAuth(*ctx, call);
    if (st.ok()) st = Unavailable(*ctx);
    if (!st.ok()) {
      Done(ToGrpcStatus(st));
      return;
    }
    StartRead(&message_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client finished sending: validate and install
      Done(ToGrpcStatus(Install()));
      return;
    }
    if (!chunk_.Parse(message_)) {
      Done(
          grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "import: a message is not a WireChunk"));
      return;
    }
    const size_t limit = ctx_->config->max_import_bytes;
    if (received_ + chunk_.size() > limit) {
      Done(ToGrpcStatus(absl::ResourceExhaustedError(
          absl::StrCat("import: the stream exceeds --max-import-bytes ", limit,
                       " (refused before buffering more)"))));
      return;
    }
    // Each chunk goes straight into the new session's caches. Once the
    // stream is known to be refused (corrupt, an unknown version) the rest
    // is only counted: a stream past the limit is still RESOURCE_EXHAUSTED,
    // whatever it holds.
    received_ += chunk_.size();
    for (std::string_view piece : chunk_.pieces()) {
      if (refused_.ok()) refused_ = sink_.Write(piece);
    }
    StartRead(&message_);
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
    if (!refused_.ok()) return refused_;
    CORTIQ_ASSIGN_OR_RETURN(std::unique_ptr<session::Session> s, sink_.Finish());
    CORTIQ_ASSIGN_OR_RETURN(session::SessionStore::Lease lease, ctx_->store->Install(std::move(s)));
    id_ = lease->id();
    lease.Return();
    v1::ImportSessionResponse reply;
    auto snap = ctx_->store->Get(id_);
    if (snap) ToProto(*snap, reply.mutable_session());
    bool own = false;
    const grpc::Status st =
        grpc::SerializationTraits<v1::ImportSessionResponse>::Serialize(reply, response_, &own);
    if (!st.ok()) return absl::InternalError(st.error_message());
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
  grpc::ByteBuffer* response_;  // a serialised ImportSessionResponse
  CallLog log_;
  std::mutex mu_;
  bool finished_ = false;
  grpc::Status status_;
  session::SessionWireSink sink_;  // the session being built, invisible until installed
  absl::Status refused_;           // the sink's verdict once the stream is known to be refused
  size_t received_ = 0;
  std::string id_;
  grpc::ByteBuffer message_;
  ChunkView chunk_;
};

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
    return b;
  }
  // The slice's destroy callback.
  static void Return(void* p) {
    auto* b = static_cast<Buffer*>(p);
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
  CORTIQ_ASSIGN_OR_RETURN(session::SessionWireSource src,
                          session::SessionWireSource::Make(*lease, ctx.wire_fingerprint, o));
  *wire_bytes = src.size();

  if (ImportSessionPath().empty()) {
    return absl::InternalError("the generated descriptors have no ImportSession(stream WireChunk)");
  }
  grpc::ClientContext c;
  with_token(c, 600);
  v1::ImportSessionResponse resp;
  const grpc::Status st = StreamToPeer(channel, c, src, &resp);
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

grpc::ServerWriteReactor<grpc::ByteBuffer>* InferenceService::ExportSession(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  return new ExportReactor(ctx_, context, *request);
}

grpc::ServerReadReactor<grpc::ByteBuffer>* InferenceService::ImportSession(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
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

// Runs a blocking unary call (a client of a peer) on the server's background
// workers (ctx->background), so it never holds a gRPC callback thread.
// `body` returns the call's status and a log detail; `then` runs after the
// reply is sent, and the task counts as in flight (Server::Shutdown waits
// for it) until `then` has returned. A task the workers refuse (the server
// stops: UNAVAILABLE; too many queued: RESOURCE_EXHAUSTED) is answered at
// once.
template <typename Body>
grpc::ServerUnaryReactor* RunInBackground(ServiceContext* ctx, grpc::ServerUnaryReactor* reactor,
                                          std::shared_ptr<CallLog> log, Body body,
                                          std::function<void()> then = nullptr) {
  const absl::Status queued = ctx->background->Submit(
      [reactor, log, body = std::move(body), then = std::move(then)]() mutable {
        const auto [status, detail] = body();
        const grpc::Status gs = ToGrpcStatus(status);
        log->Done(gs.error_code(), gs.error_message(), detail);
        reactor->Finish(gs);
        if (then) then();
      });
  if (!queued.ok()) return FinishRefused(reactor, *log, queued);
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
  return RunInBackground(ctx_, reactor, log, [ctx = ctx_, request, response] {
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
