// The relay (server/forward.h). A unary call is one UnaryRelay: the
// ForwardPending handle, one generic callback UnaryCall per attempt, and
// the reply (the answering attempt's bytes and node name, or this node's own
// status). A stream is one StreamRelay: the server-side reactor, the handle,
// and one client-side reactor per upstream attempt, sharing one mutex and
// one state machine.
#include "server/forward.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <optional>

#include "core/util/tsan_annotations.h"
#include "grpcpp/generic/generic_stub.h"
#include "server/call_util.h"

namespace cortiq::server {

namespace {

// As in service.cc's GenerateReactor: gRPC ends a call at its deadline by
// its own clock, which runs a little ahead of system_clock; a cancel this
// close to the deadline is reported as DEADLINE_EXCEEDED.
constexpr auto kDeadlineSlack = std::chrono::milliseconds(25);

// The owner's x-cortiq-node (its initial metadata), if it sent one. Call
// only once the upstream call's initial metadata is in.
std::optional<std::string> OwnerNode(const grpc::ClientContext& upstream) {
  const auto& md = upstream.GetServerInitialMetadata();
  auto it = md.find(grpc::string_ref(kNodeMetadata.data(), kNodeMetadata.size()));
  if (it == md.end()) return std::nullopt;
  return std::string(it->second.data(), it->second.size());
}

// Puts the owner's node name (and this node's, as the relay) into the
// server call's initial metadata. Before the call sends anything.
void AddOwnerMetadata(grpc::CallbackServerContext* call, const std::optional<std::string>& node,
                      const std::string& forwarded_by) {
  if (node) call->AddInitialMetadata(std::string(kNodeMetadata), *node);
  if (!forwarded_by.empty()) {
    call->AddInitialMetadata(std::string(kForwardedByMetadata), forwarded_by);
  }
}

// For an answer the relay gives itself (Fail, a cancel with no upstream call
// running, no channel): this node (`forwarded_by`, its name) served it.
void AddOwnMetadata(grpc::CallbackServerContext* call, const std::string& forwarded_by) {
  if (!forwarded_by.empty()) call->AddInitialMetadata(std::string(kNodeMetadata), forwarded_by);
}

grpc::Status NoChannel(const ForwardTarget& target) {
  return grpc::Status(grpc::StatusCode::INTERNAL,
                      "forward to '" + target.address + "': no channel to the node");
}

// True once `deadline` has passed, by gRPC's clock (see kDeadlineSlack).
bool Expired(std::chrono::system_clock::time_point deadline) {
  return deadline <= std::chrono::system_clock::now() + kDeadlineSlack;
}

// The server call's OnCancel at its deadline cancels the upstream call,
// usually before the upstream's own deadline fires: that CANCELLED is the
// deadline's. (The client, whose own deadline passed, sees
// DEADLINE_EXCEEDED whatever the server sends; this is for the caller's log.)
grpc::Status AtDeadline(const grpc::Status& status,
                        std::chrono::system_clock::time_point deadline) {
  if (status.error_code() == grpc::StatusCode::CANCELLED && Expired(deadline)) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded");
  }
  return status;
}

void AtomicMax(std::atomic<uint64_t>& a, uint64_t v) {
  uint64_t cur = a.load();
  while (cur < v && !a.compare_exchange_weak(cur, v)) {
  }
}

// ---- unary ----

// One upstream unary call (an attempt): the client context (deadline,
// metadata), the method name (gRPC's RpcMethod keeps a pointer to it), the
// request (sharing the server call's slices) and, for a UnaryRelay, the
// attempt's own reply buffer. Shared by the completion callback, the
// ForwardCancel handles and the relay; freed by the last.
struct UnaryUpstream {
  grpc::ClientContext context;
  std::string method;
  grpc::ByteBuffer request;
  grpc::ByteBuffer response;
};

std::shared_ptr<UnaryUpstream> PrepareUnary(
    std::string method, std::chrono::system_clock::time_point deadline,
    const grpc::ByteBuffer& request,
    const std::vector<std::pair<std::string, std::string>>& metadata) {
  auto up = std::make_shared<UnaryUpstream>();
  up->method = std::move(method);
  up->request = request;
  up->context.set_deadline(deadline);
  for (const auto& [key, value] : metadata) up->context.AddMetadata(key, value);
  return up;
}

// The deadline of a unary relay: the client's, or `limit` from now when
// that is earlier (limit 0: no limit).
std::chrono::system_clock::time_point UnaryDeadline(grpc::CallbackServerContext* call,
                                                    std::chrono::milliseconds limit) {
  if (limit.count() <= 0) return call->deadline();
  return std::min(call->deadline(), std::chrono::system_clock::now() + limit);
}

ForwardCancel CancelOf(const std::shared_ptr<UnaryUpstream>& up) {
  return ForwardCancel(std::shared_ptr<grpc::ClientContext>(up, &up->context));
}

// Starts `up`'s call on `channel`, its reply into `*response`; `ended` runs
// once, on a gRPC thread, with the upstream status as it came.
void CallUnary(std::shared_ptr<UnaryUpstream> up, const std::shared_ptr<grpc::Channel>& channel,
               grpc::ByteBuffer* response,
               std::function<void(UnaryUpstream&, const grpc::Status&)> ended) {
  UnaryUpstream* u = up.get();
  grpc::GenericStub stub(channel);
  util::TsanRelease(u);  // the completion runs on a gRPC thread
  stub.UnaryCall(&u->context, u->method, grpc::StubOptions(), &u->request, response,
                 [up = std::move(up), ended = std::move(ended)](grpc::Status status) {
                   util::TsanAcquire(up.get());
                   ended(*up, status);
                 });
}

// A unary call relayed through a UnaryReactor, its upstream attempts
// started by Begin. Shared: by self_ while the handle is out (between the
// Later call or a retry and the Begin/Fail that answers it), by the
// reactor's cancel callback until gRPC frees the reactor, and by the
// completion of the attempt in flight. Exactly one reply (replied_): the
// answering attempt's, Fail's, or a cancel's when no attempt runs.
class UnaryRelay final : public ForwardPending, public std::enable_shared_from_this<UnaryRelay> {
 public:
  UnaryRelay(std::string method, grpc::CallbackServerContext* call, UnaryReactor* reactor,
             ForwardOptions options, std::function<void(const grpc::Status&)> done)
      : call_(call),
        reactor_(reactor),
        deadline_(UnaryDeadline(call, options.unary_limit)),
        method_(std::move(method)),
        request_(reactor->request_bytes()),
        metadata_(std::move(options.metadata)),
        forwarded_by_(std::move(options.forwarded_by)),
        stats_(std::move(options.stats)),
        retry_(std::move(options.retry)),
        done_(std::move(done)) {}

  // Hands the handle out and wires the reactor's cancel; before anything can
  // reply (the reply frees the reactor).
  static ForwardPending* Start(std::shared_ptr<UnaryRelay> relay) {
    UnaryRelay* r = relay.get();
    {
      std::lock_guard lock(r->mu_);
      r->self_ = relay;
    }
    r->reactor_->OnCancelled([relay = std::move(relay)] { relay->Cancel(); });
    return r;
  }

  void Begin(const ForwardTarget& target) override {
    std::shared_ptr<UnaryRelay> self;  // this lives to the end of Begin
    std::shared_ptr<UnaryUpstream> up;
    {
      std::lock_guard lock(mu_);
      self = std::move(self_);
      if (replied_) return;  // cancelled before the owner was known
      if (target.channel) {
        up = PrepareUnary(method_, deadline_, request_, target.metadata.value_or(metadata_));
        running_ = up;  // a cancel from now on cancels it
      } else {
        replied_ = true;
      }
    }
    if (!up) {
      ReplyOwn(NoChannel(target));
      return;
    }
    if (stats_) stats_->attempts.fetch_add(1);
    grpc::ByteBuffer* response = &up->response;
    CallUnary(
        std::move(up), target.channel, response,
        [self = std::move(self)](UnaryUpstream& u, const grpc::Status& s) { self->Ended(u, s); });
  }

  void Fail(const grpc::Status& status) override {
    std::shared_ptr<UnaryRelay> self;
    {
      std::lock_guard lock(mu_);
      self = std::move(self_);
      if (replied_) return;
      replied_ = true;
    }
    ReplyOwn(status);
  }

 private:
  // The reactor's OnCancel (a gRPC thread).
  void Cancel() {
    std::shared_ptr<UnaryUpstream> running;
    {
      std::lock_guard lock(mu_);
      if (replied_) return;
      cancelled_ = true;
      running = running_;
      if (!running) replied_ = true;  // no attempt runs: answer now
    }
    if (running) {
      running->context.TryCancel();  // it ends CANCELLED and answers
      return;
    }
    ReplyOwn(AtDeadline(grpc::Status::CANCELLED, deadline_));
  }

  // An attempt ended (a gRPC thread): offered to retry_, or answered.
  void Ended(UnaryUpstream& up, const grpc::Status& status) {
    bool ask;
    {
      std::lock_guard lock(mu_);
      running_.reset();
      if (replied_) return;
      // Not once the client cancelled or the deadline passed (the attempt
      // has the call's deadline and may see it before OnCancel runs): this
      // attempt's end is theirs, and no other could do better.
      ask = retry_ && !status.ok() && !cancelled_ && !Expired(deadline_);
      if (ask) {
        self_ = shared_from_this();  // the handle is out again
      } else {
        replied_ = true;
      }
    }
    if (ask) {
      if (retry_(status)) return;  // its Begin or Fail answers
      std::lock_guard lock(mu_);
      // A Begin or Fail from inside retry_ took the handle back: it answers.
      if (!self_) return;
      self_.reset();         // the completion's own reference keeps this alive
      if (replied_) return;  // a cancel came while retry_ ran
      replied_ = true;
    }
    AddOwnerMetadata(call_, OwnerNode(up.context), forwarded_by_);
    reactor_->response_bytes()->Swap(&up.response);
    Reply(AtDeadline(status, deadline_));
  }

  // The relay's own answer (this node's name on it).
  void ReplyOwn(const grpc::Status& status) {
    AddOwnMetadata(call_, forwarded_by_);
    Reply(status);
  }

  // Once replied_ was taken: call_ and reactor_ are not touched after this.
  void Reply(const grpc::Status& status) {
    if (done_) done_(status);
    reactor_->ReplyRaw(status);
  }

  grpc::CallbackServerContext* const call_;  // until the reply
  UnaryReactor* const reactor_;              // until the reply (it frees the reactor)
  const std::chrono::system_clock::time_point deadline_;
  const std::string method_;
  const grpc::ByteBuffer request_;  // shares the server call's request slices
  const std::vector<std::pair<std::string, std::string>> metadata_;
  const std::string forwarded_by_;
  const std::shared_ptr<ForwardStats> stats_;
  const std::function<bool(const grpc::Status&)> retry_;
  const std::function<void(const grpc::Status&)> done_;

  std::mutex mu_;
  std::shared_ptr<UnaryRelay> self_;        // set while the handle is out
  std::shared_ptr<UnaryUpstream> running_;  // the attempt in flight, if any
  bool cancelled_ = false;                  // the reactor's OnCancel ran
  bool replied_ = false;                    // the reply is taken (by one thread)
};

// ---- streams ----

// Relays one server-streaming call. The object is the server-side reactor
// (the downstream call), the ForwardPending handle, and the owner of one
// Attempt (a client-side generic bidi reactor with its own client context)
// per Begin that started an upstream call. Attempts run one at a time;
// retired ones stay until the relay goes (gRPC may still be finishing with
// an attempt when its OnDone asks retry_, which may start the next). Every
// reaction and Begin/Fail takes mu_. `done` runs once the downstream OnDone
// has run, no attempt is live and retry_ is not running (the client's call
// is over and no upstream call can start: a later Begin only frees); the
// object is deleted once, besides, `done` has returned and the handle is
// not out (EndLocked), by whichever event got there last.
//
// An attempt: AddHold, the request as the last message (write +
// half-close), one read, StartCall. The hold keeps the upstream call open
// while a message is being written down (no read in flight then: gRPC
// would otherwise be free to run its OnDone); it is removed once no read
// will be started again (the owner's stream ended, or the downstream call
// is over).
//
// A message read is written down once the owner's initial metadata is in
// (x-cortiq-node goes down before it); the next read starts only when that
// write is done. The owner's status finishes the downstream call once no
// write is in flight — or, when nothing was read from that attempt and it
// failed, is first offered to retry_. OnCancel (client cancel, deadline,
// disconnect) and a failed write finish the downstream call at once and
// TryCancel the live attempt.
class StreamRelay final : public grpc::ServerWriteReactor<grpc::ByteBuffer>, public ForwardPending {
 public:
  StreamRelay(std::string method, grpc::CallbackServerContext* call,
              const grpc::ByteBuffer& request, ForwardOptions options, ForwardStreamDone done)
      : call_(call),
        deadline_(call->deadline()),
        method_(std::move(method)),
        request_(request),
        metadata_(std::move(options.metadata)),
        forwarded_by_(std::move(options.forwarded_by)),
        stats_(std::move(options.stats)),
        retry_(std::move(options.retry)),
        done_(std::move(done)) {
    if (stats_) stats_->streams.fetch_add(1);
    util::TsanRelease(Sync());
  }

  // ---- the handle ----

  void Begin(const ForwardTarget& target) override {
    Attempt* started = nullptr;
    Ending end;
    {
      std::lock_guard lock(mu_);
      pending_ = false;
      if (finished_) {
        end = EndLocked();  // cancelled before the owner was known
      } else if (!target.channel) {
        FinishOwnLocked(NoChannel(target));
      } else {
        started = StartAttemptLocked(target);
      }
    }
    if (started) {
      // Outside mu_: a reaction gRPC might run inline takes it. The relay
      // stays (the attempt is live); a cancel meanwhile cancels the call,
      // which exists since PrepareBidiStreamingCall.
      ReleaseFor(started);
      started->StartCall();
    }
    Conclude(end);
  }

  void Fail(const grpc::Status& status) override {
    Ending end;
    {
      std::lock_guard lock(mu_);
      pending_ = false;
      FinishOwnLocked(status);
      end = EndLocked();
    }
    Conclude(end);
  }

  // ---- downstream reactions ----

  void OnWriteDone(bool ok) override {
    util::TsanAcquire(Sync());  // gRPC ran this after the op we started
    Actions act;
    {
      std::lock_guard lock(mu_);
      act.attempt = current_;
      writing_ = false;
      Left();
      if (ok) ++messages_;
      if (!ok) {  // the client is gone: stop the owner's stream
        cancelled_ = true;
        act.cancel_upstream = true;
        FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "stream write failed"));
      } else if (finished_) {
        // cancelled while the write ran: nothing more goes down
      } else if (owner_done_) {
        FinishLocked(owner_status_);
      } else if (!eof_) {
        reading_ = true;
        ReleaseFor(current_);
        current_->StartRead(&in_);
      }
      act.remove_hold = TakeHoldLocked();
    }
    Run(act);
  }

  void OnCancel() override {
    util::TsanAcquire(Sync());
    Actions act;
    {
      std::lock_guard lock(mu_);
      if (!finished_) cancelled_ = true;
      act.attempt = current_;
      if (live_) {
        act.cancel_upstream = true;
        FinishLocked(grpc::Status::CANCELLED);
      } else {
        // Before Begin, or while a retry waits for its Begin: no owner is
        // in this answer.
        FinishOwnLocked(grpc::Status::CANCELLED);
      }
      act.remove_hold = TakeHoldLocked();
    }
    Run(act);
  }

  void OnDone() override {
    util::TsanAcquire(Sync());
    Ending end;
    {
      std::lock_guard lock(mu_);
      server_done_ = true;
      end = EndLocked();
    }
    Conclude(end);
  }

 private:
  // One upstream call: its client context and its client-side reactor,
  // whose reactions go to the relay.
  class Attempt final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
   public:
    explicit Attempt(StreamRelay* relay) : relay_(relay) {}
    // Each acquires first: relay_ was written before the call started.
    void OnReadInitialMetadataDone(bool ok) override {
      util::TsanAcquire(this);
      relay_->OnOwnerHeaders(this, ok);
    }
    void OnReadDone(bool ok) override {
      util::TsanAcquire(this);
      relay_->OnOwnerRead(ok);
    }
    // The request went up (ok) or the call failed (OnDone brings the status).
    void OnWriteDone(bool /*ok*/) override {}
    void OnDone(const grpc::Status& status) override {
      util::TsanAcquire(this);
      relay_->OnOwnerDone(status);
    }

    grpc::ClientContext context;

   private:
    StreamRelay* const relay_;
  };

  // The address every reaction's TSan edge goes through (core/util/
  // tsan_annotations.h); an Attempt's reactions first acquire their own.
  const void* Sync() const { return static_cast<const void*>(this); }
  void ReleaseFor(const Attempt* attempt) const {
    util::TsanRelease(attempt);
    util::TsanRelease(Sync());
  }

  // What a reaction does after releasing mu_ (neither may run under it:
  // RemoveHold may schedule the upstream OnDone, which takes mu_).
  struct Actions {
    Attempt* attempt = nullptr;  // the attempt they act on
    bool cancel_upstream = false;
    bool remove_hold = false;
  };
  void Run(const Actions& act) {
    if (act.cancel_upstream && act.attempt) act.attempt->context.TryCancel();
    if (act.remove_hold) {
      ReleaseFor(act.attempt);
      act.attempt->RemoveHold();
    }
  }

  // A new attempt to `target`, prepared and its first ops queued (not yet
  // started: StartCall comes after mu_ is released).
  Attempt* StartAttemptLocked(const ForwardTarget& target) {
    attempts_.push_back(std::make_unique<Attempt>(this));
    Attempt* a = attempts_.back().get();
    a->context.set_deadline(deadline_);
    for (const auto& [key, value] : target.metadata.value_or(metadata_)) {
      a->context.AddMetadata(key, value);
    }
    grpc::GenericStub stub(target.channel);
    stub.PrepareBidiStreamingCall(&a->context, method_, grpc::StubOptions(), a);
    current_ = a;
    live_ = true;
    headers_ = false;
    node_.reset();  // a retired attempt's headers never go down
    eof_ = false;
    read_from_attempt_ = 0;
    reading_ = true;
    hold_ = true;
    a->AddHold();
    a->StartWriteLast(&request_, grpc::WriteOptions());
    a->StartRead(&in_);
    if (stats_) stats_->attempts.fetch_add(1);
    return a;
  }

  // ---- upstream reactions ----

  void OnOwnerHeaders(Attempt* attempt, bool ok) {
    util::TsanAcquire(Sync());
    Actions act;
    {
      std::lock_guard lock(mu_);
      act.attempt = current_;
      headers_ = true;
      if (ok) node_ = OwnerNode(attempt->context);
      if (held_) ReleaseHeldLocked();
      act.remove_hold = TakeHoldLocked();
    }
    Run(act);
  }

  void OnOwnerRead(bool ok) {
    util::TsanAcquire(Sync());
    Actions act;
    {
      std::lock_guard lock(mu_);
      act.attempt = current_;
      reading_ = false;
      if (!ok) {
        eof_ = true;  // the owner's stream ended (or failed): its status follows
      } else {
        ++read_from_attempt_;
        Took();
        if (headers_ || finished_) ReleaseHeldLocked();
      }
      act.remove_hold = TakeHoldLocked();
    }
    Run(act);
  }

  void OnOwnerDone(const grpc::Status& status) {
    util::TsanAcquire(Sync());
    bool ask = false;
    Ending end;
    {
      std::lock_guard lock(mu_);
      live_ = false;
      // Nothing of this attempt went down (nothing was read from it), and
      // the client still waits (not cancelled, not past its deadline, which
      // the attempt shares and may see before OnCancel runs): the caller
      // may send it elsewhere.
      ask = retry_ && !status.ok() && read_from_attempt_ == 0 && !finished_ && !Expired(deadline_);
      if (ask) {
        pending_ = true;  // the handle is out again
        ++asking_;        // ... and this stays until retry_ has returned
      } else {
        OwnerAnsweredLocked(status);
        end = EndLocked();
      }
    }
    if (ask) {
      const bool again = retry_(status);
      std::lock_guard lock(mu_);
      --asking_;
      // A Begin or Fail from inside retry_ took the handle back (pending_
      // false): they answer, whatever retry_ returned.
      if (!again && pending_) {
        pending_ = false;
        OwnerAnsweredLocked(status);
      }
      end = EndLocked();
    }
    Conclude(end);
  }

  // ---- state machine (under mu_) ----

  // The answering attempt's status: it finishes the downstream call once
  // no write is in flight (else OnWriteDone does).
  void OwnerAnsweredLocked(const grpc::Status& status) {
    owner_done_ = true;
    owner_status_ = status;
    // gRPC runs OnReadInitialMetadataDone before OnDone, so nothing is
    // held here; a write in flight finishes the call from OnWriteDone.
    if (held_) ReleaseHeldLocked();
    if (!writing_) FinishLocked(status);
  }

  // What the event that just changed the state must do after releasing
  // mu_ (Conclude): report (done_), or free the relay, or nothing.
  struct Ending {
    bool report = false;
    bool free = false;
    grpc::Status status;  // to report
    uint64_t messages = 0;
  };
  Ending EndLocked() {
    Ending end;
    if (!reported_ && server_done_ && !live_ && asking_ == 0) {
      reported_ = true;
      reporting_ = true;
      end.report = true;
      end.status = ReportedLocked();
      end.messages = messages_;
    } else {
      end.free = reported_ && !reporting_ && !pending_ && !live_ && asking_ == 0;
    }
    return end;
  }
  void Conclude(const Ending& end) {
    bool free = end.free;
    if (end.report) {
      util::TsanAcquire(Sync());
      if (done_) done_(end.status, end.messages);
      std::lock_guard lock(mu_);
      reporting_ = false;
      free = EndLocked().free;
    }
    if (free) {
      util::TsanAcquire(Sync());
      delete this;  // the retired attempts with it
    }
  }

  // The status `done` reports: the one sent down, but a deadline's cancel
  // as DEADLINE_EXCEEDED.
  grpc::Status ReportedLocked() const {
    if (!cancelled_) return sent_;
    return owner_status_.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
               ? owner_status_
               : AtDeadline(sent_, deadline_);
  }

  // Writes the message in in_ down: one write in flight, headers first.
  void WriteDownLocked() {
    SendHeadersLocked();
    held_ = false;
    writing_ = true;
    out_.Swap(&in_);  // in_ is free for the next read
    util::TsanRelease(Sync());
    StartWrite(&out_);
  }

  // The message held for the headers goes down, or is dropped when the
  // downstream call is over.
  void ReleaseHeldLocked() {
    if (!finished_) {
      WriteDownLocked();
      return;
    }
    held_ = false;
    Left();
  }

  // The owner's node name (and this node's, as the relay) into the
  // downstream initial metadata, once, before the first message or the
  // status.
  void SendHeadersLocked() {
    if (headers_sent_) return;
    headers_sent_ = true;
    AddOwnerMetadata(call_, node_, forwarded_by_);
  }

  // Ends the downstream call (once) with what the owner sent or a cancel
  // while it ran. call_ is not touched after this.
  void FinishLocked(const grpc::Status& status) {
    if (finished_) return;
    SendHeadersLocked();
    FinishDownLocked(status);
  }
  // ... with the relay's own answer (this node's name on it).
  void FinishOwnLocked(const grpc::Status& status) {
    if (finished_) return;
    if (!headers_sent_) {
      headers_sent_ = true;
      AddOwnMetadata(call_, forwarded_by_);
    }
    FinishDownLocked(status);
  }
  void FinishDownLocked(const grpc::Status& status) {
    finished_ = true;
    sent_ = status;
    util::TsanRelease(Sync());
    Finish(status);
  }

  // True (once per attempt) when the hold on the live attempt can go: no
  // read in flight and none will start again.
  bool TakeHoldLocked() {
    if (!hold_ || reading_ || !(eof_ || finished_)) return false;
    hold_ = false;
    return true;
  }

  // A message came in from the owner / left the relay (written down or
  // dropped).
  void Took() {
    held_ = true;
    ++holding_;
    if (stats_) {
      stats_->read.fetch_add(1);
      AtomicMax(stats_->max_held, holding_);
    }
  }
  void Left() {
    --holding_;
    if (stats_) stats_->written.fetch_add(1);
  }

  grpc::CallbackServerContext* const call_;  // the downstream call; unused after Finish
  const std::chrono::system_clock::time_point deadline_;
  const std::string method_;  // gRPC's RpcMethod keeps a pointer to it
  grpc::ByteBuffer request_;  // shares the server call's request slices; sent by each attempt
  const std::vector<std::pair<std::string, std::string>> metadata_;
  const std::string forwarded_by_;
  const std::shared_ptr<ForwardStats> stats_;
  const std::function<bool(const grpc::Status&)> retry_;
  ForwardStreamDone done_;

  std::mutex mu_;
  std::vector<std::unique_ptr<Attempt>> attempts_;  // every attempt started, in order
  Attempt* current_ = nullptr;                      // the latest attempt (live while live_)
  bool live_ = false;                               // current_ started and its OnDone has not run
  bool pending_ = true;                             // the handle is out: a Begin or Fail is awaited
  // retry_ calls running (outside mu_): two when a Begin from inside
  // retry_ started an attempt that failed at once.
  int asking_ = 0;
  grpc::ByteBuffer in_;              // the upstream read in flight, or the message held
  grpc::ByteBuffer out_;             // the downstream write in flight
  std::optional<std::string> node_;  // the live attempt's owner's x-cortiq-node
  bool headers_ = false;             // the live attempt's initial metadata is in
  bool headers_sent_ = false;        // ours went into the downstream call
  bool held_ = false;                // in_ holds a message waiting for the headers
  uint64_t holding_ = 0;             // messages read and not yet written down: 0 or 1
  uint64_t read_from_attempt_ = 0;   // messages read from the live (or last) attempt
  bool reading_ = false;             // an upstream read is in flight
  bool writing_ = false;             // a downstream write is in flight
  bool hold_ = false;                // our hold on the live attempt
  bool eof_ = false;                 // the live attempt sends no more messages
  bool owner_done_ = false;          // an attempt answered (owner_status_ set)
  grpc::Status owner_status_;
  bool finished_ = false;   // Finish was called downstream (sent_ set)
  bool cancelled_ = false;  // ... because of a cancel or a failed write
  grpc::Status sent_;
  bool server_done_ = false;  // the downstream OnDone ran
  uint64_t messages_ = 0;     // written down
  bool reported_ = false;     // done_ was called (or is running: reporting_)
  bool reporting_ = false;
};

}  // namespace

void ForwardCancel::Cancel() const {
  if (upstream_) upstream_->TryCancel();
}

ForwardCancel ForwardUnary(const ForwardTarget& target, std::string method_path,
                           grpc::CallbackServerContext* call, const grpc::ByteBuffer& request,
                           grpc::ByteBuffer* response, ForwardOptions options,
                           std::function<void(const grpc::Status&)> done) {
  const std::chrono::system_clock::time_point deadline = UnaryDeadline(call, options.unary_limit);
  std::shared_ptr<UnaryUpstream> up =
      PrepareUnary(std::move(method_path), deadline, request, options.metadata);
  ForwardCancel cancel = CancelOf(up);
  if (!target.channel) {
    AddOwnMetadata(call, options.forwarded_by);
    done(NoChannel(target));
    return cancel;
  }
  if (options.stats) options.stats->attempts.fetch_add(1);
  CallUnary(std::move(up), target.channel, response,
            [call, deadline, forwarded_by = std::move(options.forwarded_by),
             done = std::move(done)](UnaryUpstream& u, const grpc::Status& status) {
              AddOwnerMetadata(call, OwnerNode(u.context), forwarded_by);
              done(AtDeadline(status, deadline));
            });
  return cancel;
}

ForwardPending* ForwardUnaryLater(std::string method_path, grpc::CallbackServerContext* call,
                                  UnaryReactor* reactor, ForwardOptions options,
                                  std::function<void(const grpc::Status&)> done) {
  return UnaryRelay::Start(std::make_shared<UnaryRelay>(std::move(method_path), call, reactor,
                                                        std::move(options), std::move(done)));
}

void ForwardUnaryCall(const ForwardTarget& target, std::string method_path,
                      grpc::CallbackServerContext* call, UnaryReactor* reactor,
                      ForwardOptions options, std::function<void(const grpc::Status&)> done) {
  options.retry = nullptr;
  ForwardUnaryLater(std::move(method_path), call, reactor, std::move(options), std::move(done))
      ->Begin(target);
}

ForwardStreamStart ForwardStreamLater(std::string method_path, grpc::CallbackServerContext* call,
                                      const grpc::ByteBuffer& request, ForwardOptions options,
                                      ForwardStreamDone done) {
  auto* relay =
      new StreamRelay(std::move(method_path), call, request, std::move(options), std::move(done));
  return {.reactor = relay, .pending = relay};
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ForwardStream(
    const ForwardTarget& target, std::string method_path, grpc::CallbackServerContext* call,
    const grpc::ByteBuffer& request, ForwardOptions options, ForwardStreamDone done) {
  options.retry = nullptr;
  ForwardStreamStart s = ForwardStreamLater(std::move(method_path), call, request,
                                            std::move(options), std::move(done));
  s.pending->Begin(target);
  return s.reactor;
}

}  // namespace cortiq::server
