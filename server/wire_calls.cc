// ExportSession and ImportSession: sessions leaving and entering this node
// in the session wire format (core/session/session_wire.h,
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
// under the cap and the budget.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/session/session_persister.h"
#include "core/session/session_wire.h"
#include "core/util/status_macros.h"
#include "core/util/tsan_annotations.h"
#include "grpcpp/alarm.h"
#include "grpcpp/grpcpp.h"
#include "server/call_util.h"
#include "server/forwarding.h"
#include "server/service.h"
#include "server/session_router.h"
#include "server/status_util.h"
#include "server/wire_chunk.h"
#include "spdlog/spdlog.h"

namespace cortiq::server {

namespace {


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

// A snapshot of a session's stream as chunk slices, read under its lease
// (which returns before a byte is sent, so a slow client never holds the
// session). Each chunk is read from the caches into its own buffer, which
// gRPC sends as is and frees once sent. `tenant`: the sessions the caller
// sees (Caller::sessions): another tenant's is NOT_FOUND.
// A spilled session is read back first, or refused (session::
// SpilledRefusal) with `read_back` kRefuse.
// The snapshot's bytes are `held`'s (an export reservation) before one is
// copied: RESOURCE_EXHAUSTED naming --memory-budget when they do not fit.
absl::StatusOr<std::vector<grpc::Slice>> ExportChunks(
    ServiceContext& ctx, const std::string& id, const session::TenantFilter& tenant,
    const session::SessionWireOptions& options, session::ReadBack read_back,
    session::SessionStore::ImportReservation& held) {
  CORTIQ_ASSIGN_OR_RETURN(
      session::SessionStore::Lease lease,
      ctx.store->Acquire(id, session::Clock::time_point::max(), tenant, read_back));
  CORTIQ_ASSIGN_OR_RETURN(session::SessionWireSource src, ExportSource(ctx, *lease, options));
  CORTIQ_RETURN_IF_ERROR(held.Update(static_cast<size_t>(src.size())));
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
// buffer it was read into. A spilled session is read back and exported on a
// ctx->read_back worker, not on the gRPC thread: until it is done there,
// OnCancel only marks the call (setting_up_) and Ready finishes it, and the
// worker holds a reference (refs_) so that OnDone leaves `this` to it.
// The snapshot is memory a client makes the node hold for as long as it
// takes to read it: one of --max-concurrent-exports slots, and its bytes
// count against --memory-budget (cortiq_export_bytes_in_flight) until sent.
class ExportReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  ExportReactor(ServiceContext* ctx, grpc::CallbackServerContext* call,
                const grpc::ByteBuffer& request)
      : log_(ctx, call, "ExportSession") {
    AddNodeMetadata(*ctx, call);
    absl::StatusOr<v1::ExportSessionRequest> req =
        ParseRequest<v1::ExportSessionRequest>(*ctx, call, "ExportSession", request);
    absl::StatusOr<Caller> caller =
        req.ok() ? Authorize(*ctx, call, "ExportSession") : req.status();
    absl::Status st = caller.status();
    if (st.ok()) st = CheckSessionId(req->session_id());
    if (st.ok()) st = CheckWireRequest(req->version(), req->dtype());
    if (st.ok()) {
      absl::StatusOr<session::SessionStore::ImportReservation> r = ctx->store->BeginExport();
      if (r.ok()) {
        held_ = *std::move(r);
      } else {
        st = r.status();
      }
    }
    if (!st.ok()) {
      Done(ToGrpcStatus(st));
      return;
    }
    const session::SessionWireOptions options = WireOptionsFrom(req->version(), req->dtype());
    absl::StatusOr<std::vector<grpc::Slice>> chunks = ExportChunks(
        *ctx, req->session_id(), caller->sessions(), options, session::ReadBack::kRefuse, held_);
    if (session::IsSpilledRefusal(chunks.status()) && ctx->read_back != nullptr) {
      {
        std::lock_guard lock(mu_);
        setting_up_ = true;
      }
      refs_.fetch_add(1, std::memory_order_relaxed);
      st = SubmitReadBack(
          *ctx, req->session_id(),
          [this, ctx, id = req->session_id(), tenant = caller->sessions(), options] {
            Ready(ExportChunks(*ctx, id, tenant, options, session::ReadBack::kInline, held_));
            Unref();
          });
      if (st.ok()) return;
      refs_.fetch_sub(1, std::memory_order_relaxed);
      chunks = st;
    }
    Ready(std::move(chunks));
  }

  void OnWriteDone(bool ok) override {
    util::TsanAcquire(this);  // gRPC ran this after the op we started
    if (!ok) {
      Done(grpc::Status(grpc::StatusCode::CANCELLED, "export stream broken"));
      return;
    }
    NextWrite();
  }
  void OnCancel() override {
    util::TsanAcquire(this);
    {
      std::lock_guard lock(mu_);
      if (setting_up_) {  // a read_back worker exports: Ready finishes
        cancelled_ = true;
        return;
      }
    }
    Done(grpc::Status::CANCELLED);
  }
  void OnDone() override {
    util::TsanAcquire(this);
    {
      std::lock_guard lock(mu_);
      chunks_.clear();  // what was not sent
      held_.Release();
    }
    log_.Done(status_.error_code(), status_.error_message(),
              {{"bytes", static_cast<int64_t>(bytes_)}});
    Unref();
  }

 private:
  // The export's chunks, or why there are none: the stream starts, or the
  // call finishes (CANCELLED when OnCancel came while a worker exported).
  void Ready(absl::StatusOr<std::vector<grpc::Slice>> chunks) {
    bool cancelled = false;
    {
      std::lock_guard lock(mu_);
      setting_up_ = false;
      cancelled = cancelled_;
      if (chunks.ok()) chunks_ = *std::move(chunks);
    }
    if (cancelled) return Done(grpc::Status::CANCELLED);
    if (!chunks.ok()) return Done(ToGrpcStatus(chunks.status()));
    NextWrite();
  }
  // Drops one reference: gRPC's (OnDone) or a read_back worker's.
  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  // One write in flight: called from the constructor and OnWriteDone only.
  // Each chunk's slice moves into the message; gRPC frees it once sent.
  void NextWrite() {
    std::lock_guard lock(mu_);
    if (finished_) return;
    // The chunk just written is freed: the snapshot holds what is queued
    // and the chunk about to be written (gRPC's until then).
    (void)held_.Update(held_.bytes() - std::min(held_.bytes(), writing_bytes_));
    writing_bytes_ = 0;
    if (next_ == chunks_.size()) {
      finished_ = true;
      status_ = grpc::Status::OK;
      util::TsanRelease(this);
      Finish(status_);
      return;
    }
    writing_bytes_ = chunks_[next_].size();
    bytes_ += chunks_[next_].size();
    message_ = ChunkMessage(std::move(chunks_[next_++]));
    util::TsanRelease(this);
    StartWrite(&message_);
  }
  void Done(const grpc::Status& s) {
    std::lock_guard lock(mu_);
    if (finished_) return;
    finished_ = true;
    status_ = s;
    util::TsanRelease(this);
    Finish(s);
  }

  CallLog log_;
  std::mutex mu_;
  std::vector<grpc::Slice> chunks_;  // the stream, at most kChunkBytes each
  size_t next_ = 0;                  // the next chunk to send
  size_t bytes_ = 0;                 // sent so far
  size_t writing_bytes_ = 0;         // the chunk being written
  bool finished_ = false;
  bool setting_up_ = false;  // a read_back worker exports (the constructor)
  bool cancelled_ = false;   // OnCancel came meanwhile
  std::atomic<int> refs_{1};  // gRPC's until OnDone, plus a read_back worker's
  grpc::Status status_;
  grpc::ByteBuffer message_;  // the chunk being written
  // The snapshot's bytes against --memory-budget (--max-concurrent-exports).
  session::SessionStore::ImportReservation held_;
};

// Ends an import that goes quiet: fires on_idle (once) when no Touch came
// for `timeout`. A grpc::Alarm (the callback form, gRPC >= 1.39) wakes it at
// the deadline the last message set; a message that came since re-arms it
// for the new deadline, on a fresh Alarm (an Alarm's callback must not set
// that same Alarm again: Set replaces the std::function that is running).
// The Alarm's callback holds this watch (shared_ptr), never the reactor:
// on_idle runs under mu_, and Stop (from OnDone, before the reactor is
// deleted) takes mu_ and clears it, so on_idle never runs on a deleted
// reactor. on_idle must not wait for OnDone (Finish never runs OnDone
// inline: gRPC schedules it).
class IdleWatch : public std::enable_shared_from_this<IdleWatch> {
 public:
  using Clock = std::chrono::steady_clock;
  IdleWatch(std::chrono::milliseconds timeout, std::function<void()> on_idle)
      : timeout_(timeout), last_(Clock::now()), on_idle_(std::move(on_idle)) {}

  void Start() {
    std::lock_guard lock(mu_);
    ArmLocked(last_ + timeout_);
  }
  void Touch() {
    std::lock_guard lock(mu_);
    last_ = Clock::now();
  }
  // No on_idle after this returns; cancels the pending Alarm (its callback
  // then runs with ok=false and drops its reference to this watch).
  void Stop() {
    std::unique_ptr<grpc::Alarm> alarm;  // destroyed (cancelled) after mu_ is released
    {
      std::lock_guard lock(mu_);
      on_idle_ = nullptr;
      alarm = std::move(alarm_);
    }
  }

 private:
  void ArmLocked(Clock::time_point deadline) {
    // Destroying the previous Alarm from inside its own callback is safe:
    // its state lives until the callback returns (gRPC refcounts it).
    alarm_ = std::make_unique<grpc::Alarm>();
    alarm_->Set(std::chrono::system_clock::now() + (deadline - Clock::now()),
                [self = shared_from_this()](bool ok) {
                  util::TsanAcquire(&alarm_handoff_);  // before the capture is read
                  self->Fired(ok);
                });
    // gRPC runs the callback on its timer thread, after Set returned (the
    // deadline is in the future): mark that hand-off for ThreadSanitizer,
    // which cannot see it inside Debian's uninstrumented gRPC.
    util::TsanRelease(&alarm_handoff_);
  }
  void Fired(bool ok) {
    if (!ok) return;  // cancelled by Stop
    std::lock_guard lock(mu_);
    if (!on_idle_) return;
    const Clock::time_point deadline = last_ + timeout_;
    if (Clock::now() < deadline) {
      ArmLocked(deadline);
      return;
    }
    std::function<void()> fire = std::exchange(on_idle_, nullptr);
    fire();
  }

  static inline char alarm_handoff_ = 0;  // only its address: a TSan sync point
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  Clock::time_point last_;              // the last message's arrival
  std::function<void()> on_idle_;       // null once fired or stopped
  std::unique_ptr<grpc::Alarm> alarm_;  // the pending wake-up
};

// ImportSession on the raw (byte) API, so that each chunk's data goes from
// the received slices straight into the new session's caches.
//
// Bounded from the first byte: the call takes one of
// --max-concurrent-imports slots (RESOURCE_EXHAUSTED beyond), and after
// every chunk the bytes it holds (the sink's allocations and the chunk's
// received slices) are the reservation it holds against --memory-budget
// (SessionStore::ImportReservation; RESOURCE_EXHAUSTED when it does not
// fit). The sink allocates a layer's rows when it reads the layer's
// header, so a refusal comes after that one allocation, never after more.
// A stream with no message for --import-idle-timeout ends with
// DEADLINE_EXCEEDED. Whatever ends an import short frees the sink and the
// reservation at once (see ReturnFreedMemory).
// An import of a session this node already holds: a session lives in one
// place only.
absl::Status AlreadyHeld(const std::string& id) {
  return absl::AlreadyExistsError(absl::StrCat(
      "import: session '", id,
      "' is already live on this node (a session lives in one place; release it here first)"));
}

class ImportReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  ImportReactor(ServiceContext* ctx, grpc::CallbackServerContext* call, grpc::ByteBuffer* response)
      : ctx_(ctx), response_(response), log_(ctx, call, "ImportSession") {
    AddNodeMetadata(*ctx, call);
    // The imported session keeps the tenant its stream carries (set on the
    // sink's session before Install; a stream without one: tenant "").
    absl::Status st = Authorize(*ctx, call, "ImportSession").status();
    if (st.ok()) st = Unavailable(*ctx);
    if (st.ok()) {
      absl::StatusOr<session::SessionStore::ImportReservation> r = ctx->store->BeginImport();
      if (r.ok()) {
        held_ = *std::move(r);
      } else {
        st = r.status();
      }
    }
    if (!st.ok()) {
      Done(ToGrpcStatus(st));
      return;
    }
    sink_.emplace(*ctx->model, ctx->wire_fingerprint, session::SessionStore::RandomId(),
                  ctx->config->max_import_bytes);
    // Every allocation the stream's layers make is admitted against the
    // budget before it is made (the reservation grows by it; the update
    // after the message then sets it to what the stream holds).
    sink_->SetAdmit([this](size_t bytes) { return held_.Update(held_.bytes() + bytes); });
    const std::chrono::milliseconds timeout = ctx->config->import_idle_timeout;
    watch_ = std::make_shared<IdleWatch>(timeout, [this, timeout] {
      Done(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        absl::StrCat("import: no message for ", timeout.count() / 1000.0,
                                     " s (--import-idle-timeout); the stream is dropped")));
    });
    watch_->Start();
    util::TsanRelease(this);
    StartRead(&message_);
  }

  void OnReadDone(bool ok) override {
    util::TsanAcquire(this);  // gRPC ran this after the op we started
    if (watch_) watch_->Touch();
    if (!ok) {  // the client finished sending: validate and install
      // The stream is whole: no timeout may answer for an installed session.
      if (watch_) watch_->Stop();
      if (finished()) return;
      absl::StatusOr<session::SessionStore::Lease> lease = Install();
      if (!lease.ok()) {
        Done(ToGrpcStatus(lease.status()));
        return;
      }
      {
        std::lock_guard lock(mu_);
        installed_ = true;
      }
      std::optional<session::SessionPersister::Pending> record;
      if (ctx_->persister != nullptr) record = ctx_->persister->Prepare(**lease);
      if (record) {
        // The session's file is written on this node before the import
        // answers: a migration's source deletes its own only after that.
        // Queued before the lease returns, as the engine's records are, so
        // a release that comes next deletes the file after this write. The
        // writer's callback holds a reference: the call may end (cancelled,
        // its deadline) and OnDone run before the write is done.
        refs_.fetch_add(1, std::memory_order_relaxed);
        ctx_->persister->Submit(*std::move(record), [this] {
          Answer();
          Unref();
        });
        lease->Return();
        return;
      }
      lease->Return();
      Answer();
      return;
    }
    if (finished()) return;  // ended (timed out, cancelled): read no more
    const size_t message_bytes = message_.Length();  // Parse consumes the message
    if (!chunk_.Parse(message_)) {
      Done(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("ImportSession: a message is not a cortiq.v1.WireChunk (",
                                     message_bytes, " bytes do not parse)")));
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
      if (refused_.ok()) refused_ = sink_->Write(piece);
    }
    if (refused_.code() == absl::StatusCode::kResourceExhausted) {  // the budget: stop now
      Done(ToGrpcStatus(refused_));
      return;
    }
    // A stream that carries its session's id (wire version 4) names it in
    // its first section: an id this node already holds is refused at once,
    // before the rows arrive (Install checks again, under the store's lock).
    if (id_.empty()) {
      if (std::optional<std::string> id = sink_->session_id()) {
        id_ = *std::move(id);
        if (ctx_->store->Get(id_).has_value()) {
          Done(ToGrpcStatus(AlreadyHeld(id_)));
          return;
        }
      }
    }
    // What the stream holds now, the received message included (its
    // slices live until the next read replaces them).
    absl::Status fits = held_.Update(sink_->held_bytes() + message_bytes);
    if (!fits.ok()) {
      Done(ToGrpcStatus(fits));
      return;
    }
    util::TsanRelease(this);
    StartRead(&message_);
  }
  void OnCancel() override {
    util::TsanAcquire(this);
    Done(grpc::Status::CANCELLED);
  }
  void OnDone() override {
    util::TsanAcquire(this);
    if (watch_) watch_->Stop();  // no timer reaches this reactor from here on
    if (!status_.ok()) {
      ReturnFreedMemory();
      TakeBackInstalled();
    }
    if (ctx_->metrics) {
      ctx_->metrics->CountMigration(MigrationDirection::kIn,
                                    status_.ok() ? MigrationResult::kOk : MigrationResult::kFailed);
    }
    log_.Done(status_.error_code(), status_.error_message(),
              {{"bytes", static_cast<int64_t>(received_)}, {"session", id_}});
    Unref();
  }

 private:
  // Drops one reference: gRPC's (OnDone) or the persister's callback's.
  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }
  // The installed session's file is written (or there is none): the import
  // answers OK, unless the call ended first.
  void Answer() {
    std::lock_guard lock(mu_);
    if (finished_) return;  // cancelled meanwhile: OnDone takes the session back
    finished_ = true;
    status_ = grpc::Status::OK;
    util::TsanRelease(this);
    Finish(status_);
  }
  // A call that ended without answering OK (cancelled, its deadline passed
  // while the file was written) after its session was installed: the
  // source was told the import failed and keeps its session, so this copy
  // goes (released, its file deleted after the write queued for it). On a
  // background worker: the release waits for that write, which a gRPC
  // thread must not.
  void TakeBackInstalled() {
    {
      std::lock_guard lock(mu_);
      if (!installed_) return;
    }
    auto release = [store = ctx_->store, id = id_] {
      store->Release(id, session::ReleaseReason::kCancelled);
    };
    if (ctx_->background == nullptr || !ctx_->background->Submit(release).ok()) release();
    spdlog::warn(
        "ImportSession: session {} was installed, but the call ended {} before it "
        "answered: released again (its source keeps it)",
        id_, GrpcCodeName(status_.error_code()));
  }

  absl::StatusOr<session::SessionStore::Lease> Install() {
    if (received_ == 0) return absl::DataLossError("import: empty stream");
    if (!refused_.ok()) return refused_;
    CORTIQ_ASSIGN_OR_RETURN(std::unique_ptr<session::Session> s, sink_->Finish());
    id_ = s->id();
    absl::StatusOr<session::SessionStore::Lease> installed =
        ctx_->store->Install(std::move(s), held_);
    if (installed.status().code() == absl::StatusCode::kAlreadyExists) return AlreadyHeld(id_);
    CORTIQ_ASSIGN_OR_RETURN(session::SessionStore::Lease lease, std::move(installed));
    if (ctx_->router) ctx_->router->Forget(id_);  // it lives here again
    v1::ImportSessionResponse reply;
    auto snap = ctx_->store->Get(id_);
    if (snap) ToProto(*snap, ctx_->node_name, reply.mutable_session());
    bool own = false;
    const grpc::Status st =
        grpc::SerializationTraits<v1::ImportSessionResponse>::Serialize(reply, response_, &own);
    if (!st.ok()) return absl::InternalError(st.error_message());
    return lease;
  }
  void Done(const grpc::Status& s) {
    std::lock_guard lock(mu_);
    if (finished_) return;
    finished_ = true;
    status_ = s;
    util::TsanRelease(this);
    Finish(s);
  }
  bool finished() {
    std::lock_guard lock(mu_);
    return finished_;
  }
  // An import that ended short gives back what it held: the sink (the
  // session under construction, its reserved rows), the last message's
  // slices and the reservation. Large blocks are mappings
  // (ConfigureAllocator in server.cc), unmapped here. The smaller ones
  // (gRPC's received slices and call state, the sections being gathered)
  // go back to glibc's arenas, which keep their pages; gRPC frees the
  // call's own state only after OnDone returns, so trimming here would come
  // too early: the reaper trims shortly after (Server::ReaperLoop).
  void ReturnFreedMemory() {
    sink_.reset();
    message_.Clear();
    held_.Release();
    ctx_->import_ended_short.store(std::chrono::steady_clock::now().time_since_epoch().count());
  }

  ServiceContext* ctx_;
  grpc::ByteBuffer* response_;  // a serialised ImportSessionResponse
  CallLog log_;
  // finished_ and status_: Done may come from the idle watch's thread.
  std::mutex mu_;
  bool finished_ = false;
  grpc::Status status_;
  // The rest belongs to the reactions (OnReadDone, then OnDone; gRPC never
  // runs them at once). The session being built, invisible until
  // installed; gone once the import ended short.
  std::optional<session::SessionWireSink> sink_;
  session::SessionStore::ImportReservation held_;  // what the stream holds, against the budget
  std::shared_ptr<IdleWatch> watch_;               // ends a quiet stream
  absl::Status refused_;  // the sink's verdict once the stream is known to be refused
  size_t received_ = 0;
  std::string id_;
  grpc::ByteBuffer message_;
  ChunkView chunk_;
  bool installed_ = false;    // under mu_: Install succeeded
  std::atomic<int> refs_{1};  // gRPC's until OnDone, plus the persister callback's
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* InferenceService::ExportSession(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  // The export of a session another node holds is relayed there.
  if (auto* forwarded =
          MaybeForwardStream<v1::ExportSessionRequest>(ctx_, context, *request, "ExportSession")) {
    return forwarded;
  }
  return new ExportReactor(ctx_, context, *request);
}

grpc::ServerReadReactor<grpc::ByteBuffer>* InferenceService::ImportSession(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  return new ImportReactor(ctx_, context, response);
}

}  // namespace cortiq::server
