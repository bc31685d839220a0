// The relay (server/forward.h). A unary call is one generic callback
// UnaryCall whose completion copies the owner's node name and hands the
// status on. A stream is one StreamRelay: the server-side reactor and,
// inside it, the client-side reactor of the upstream call, sharing one
// mutex and one state machine.
#include "server/forward.h"

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

grpc::Status NoChannel(const ForwardTarget& target) {
  return grpc::Status(grpc::StatusCode::INTERNAL,
                      "forward to '" + target.address + "': no channel to the node");
}

// The server call's OnCancel at its deadline cancels the upstream call,
// usually before the upstream's own deadline fires: that CANCELLED is the
// deadline's. (The client, whose own deadline passed, sees
// DEADLINE_EXCEEDED whatever the server sends; this is for the caller's log.)
grpc::Status AtDeadline(const grpc::Status& status,
                        std::chrono::system_clock::time_point deadline) {
  if (status.error_code() == grpc::StatusCode::CANCELLED &&
      deadline <= std::chrono::system_clock::now() + kDeadlineSlack) {
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

// One upstream unary call: the client context (deadline, metadata), the
// method name (gRPC's RpcMethod keeps a pointer to it) and the request
// (sharing the server call's slices). Shared by the completion callback and
// the ForwardCancel handles; freed by the last.
struct UnaryUpstream {
  grpc::ClientContext context;
  std::string method;
  grpc::ByteBuffer request;
};

std::shared_ptr<UnaryUpstream> PrepareUnary(std::string method,
                                            const grpc::CallbackServerContext* call,
                                            const grpc::ByteBuffer& request,
                                            const ForwardOptions& options) {
  auto up = std::make_shared<UnaryUpstream>();
  up->method = std::move(method);
  up->request = request;
  up->context.set_deadline(call->deadline());
  for (const auto& [key, value] : options.metadata) up->context.AddMetadata(key, value);
  return up;
}

ForwardCancel CancelOf(const std::shared_ptr<UnaryUpstream>& up) {
  return ForwardCancel(std::shared_ptr<grpc::ClientContext>(up, &up->context));
}

void StartUnary(std::shared_ptr<UnaryUpstream> up, const ForwardTarget& target,
                grpc::CallbackServerContext* call, grpc::ByteBuffer* response,
                std::string forwarded_by, std::function<void(const grpc::Status&)> done) {
  if (!target.channel) {
    done(NoChannel(target));
    return;
  }
  UnaryUpstream* u = up.get();
  grpc::GenericStub stub(target.channel);
  util::TsanRelease(u);  // the completion runs on a gRPC thread
  stub.UnaryCall(
      &u->context, u->method, grpc::StubOptions(), &u->request, response,
      [up = std::move(up), call, deadline = call->deadline(),
       forwarded_by = std::move(forwarded_by), done = std::move(done)](grpc::Status status) {
        util::TsanAcquire(up.get());
        AddOwnerMetadata(call, OwnerNode(up->context), forwarded_by);
        done(AtDeadline(status, deadline));
      });
}

// ---- streams ----

// Relays one server-streaming call. Two reactors in one object: this
// (downstream, the server call) and upstream_ (the generic bidi call to the
// owner). Every reaction of either takes mu_; the object is deleted by
// whichever OnDone runs last, after both have run.
//
// Upstream: AddHold, the request as the last message (write + half-close),
// one read, StartCall. The hold keeps the upstream call open while a
// message is being written down (no read in flight then: gRPC would
// otherwise be free to run its OnDone); it is removed once no read will be
// started again (the owner's stream ended, or the downstream call is over).
//
// A message read is written down once the owner's initial metadata is in
// (x-cortiq-node goes down before it); the next read starts only when that
// write is done. The owner's status finishes the downstream call once no
// write is in flight. OnCancel (client cancel, deadline, disconnect) and a
// failed write finish the downstream call at once and TryCancel upstream.
class StreamRelay final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  StreamRelay(const ForwardTarget& target, std::string method, grpc::CallbackServerContext* call,
              const grpc::ByteBuffer& request, ForwardOptions options, ForwardStreamDone done)
      : call_(call),
        deadline_(call->deadline()),
        method_(std::move(method)),
        request_(request),
        forwarded_by_(std::move(options.forwarded_by)),
        stats_(std::move(options.stats)),
        done_(std::move(done)),
        upstream_(this) {
    if (stats_) stats_->streams.fetch_add(1);
    std::lock_guard lock(mu_);
    if (!target.channel) {
      owner_done_ = true;  // no upstream call: nothing to wait for on that side
      hold_ = false;
      FinishLocked(NoChannel(target));
      return;
    }
    context_.set_deadline(deadline_);
    for (const auto& [key, value] : options.metadata) context_.AddMetadata(key, value);
    grpc::GenericStub stub(target.channel);
    stub.PrepareBidiStreamingCall(&context_, method_, grpc::StubOptions(), &upstream_);
    reading_ = true;
    upstream_.AddHold();
    upstream_.StartWriteLast(&request_, grpc::WriteOptions());
    upstream_.StartRead(&in_);
    util::TsanRelease(Sync());
    upstream_.StartCall();
  }

  // ---- downstream reactions ----

  void OnWriteDone(bool ok) override {
    util::TsanAcquire(Sync());  // gRPC ran this after the op we started
    Actions act;
    {
      std::lock_guard lock(mu_);
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
        util::TsanRelease(Sync());
        upstream_.StartRead(&in_);
      }
      act.remove_hold = TakeHoldLocked();
    }
    Run(act);
  }

  void OnCancel() override {
    util::TsanAcquire(Sync());
    Actions act{.cancel_upstream = true};
    {
      std::lock_guard lock(mu_);
      if (!finished_) cancelled_ = true;
      FinishLocked(grpc::Status::CANCELLED);
      act.remove_hold = TakeHoldLocked();
    }
    Run(act);
  }

  void OnDone() override {
    util::TsanAcquire(Sync());
    bool last;
    {
      std::lock_guard lock(mu_);
      server_done_ = true;
      last = owner_done_;
    }
    if (last) Destroy();
  }

 private:
  // The client side: every reaction goes to the relay.
  class Upstream final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
   public:
    explicit Upstream(StreamRelay* relay) : relay_(relay) {}
    // Each acquires first: relay_ was written before the call started.
    void OnReadInitialMetadataDone(bool ok) override {
      util::TsanAcquire(this);
      relay_->OnOwnerHeaders(ok);
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

   private:
    StreamRelay* relay_;
  };

  // The one address both reactors' TSan edges use (core/util/
  // tsan_annotations.h): the Upstream's, which its reactions can name
  // before reading anything.
  const void* Sync() const { return &upstream_; }

  // What a reaction does after releasing mu_ (neither may run under it:
  // RemoveHold may schedule the upstream OnDone, which takes mu_).
  struct Actions {
    bool cancel_upstream = false;
    bool remove_hold = false;
  };
  void Run(const Actions& act) {
    if (act.cancel_upstream) context_.TryCancel();  // safe after the call ended
    if (act.remove_hold) {
      util::TsanRelease(Sync());
      upstream_.RemoveHold();
    }
  }

  // ---- upstream reactions ----

  void OnOwnerHeaders(bool ok) {
    util::TsanAcquire(Sync());
    Actions act;
    {
      std::lock_guard lock(mu_);
      headers_ = true;
      if (ok) node_ = OwnerNode(context_);
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
      reading_ = false;
      if (!ok) {
        eof_ = true;  // the owner's stream ended (or failed): its status follows
      } else {
        Took();
        if (headers_ || finished_) ReleaseHeldLocked();
      }
      act.remove_hold = TakeHoldLocked();
    }
    Run(act);
  }

  void OnOwnerDone(const grpc::Status& status) {
    util::TsanAcquire(Sync());
    bool last;
    {
      std::lock_guard lock(mu_);
      owner_done_ = true;
      owner_status_ = status;
      // gRPC runs OnReadInitialMetadataDone before OnDone, so nothing is
      // held here; a write in flight finishes the call from OnWriteDone.
      if (held_) ReleaseHeldLocked();
      if (!writing_) FinishLocked(status);
      last = server_done_;
    }
    if (last) Destroy();
  }

  // ---- state machine (under mu_) ----

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

  // The owner's node name (and this node's) into the downstream initial
  // metadata, once, before the first message or the status.
  void SendHeadersLocked() {
    if (headers_sent_) return;
    headers_sent_ = true;
    AddOwnerMetadata(call_, node_, forwarded_by_);
  }

  // Ends the downstream call (once). call_ is not touched after this.
  void FinishLocked(const grpc::Status& status) {
    if (finished_) return;
    finished_ = true;
    sent_ = status;
    SendHeadersLocked();
    util::TsanRelease(Sync());
    Finish(status);
  }

  // True (once) when the hold on the upstream call can go: no read in
  // flight and none will start again.
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

  // Runs when both calls are done: reports, then frees everything.
  void Destroy() {
    util::TsanAcquire(Sync());
    grpc::Status reported = sent_;
    if (cancelled_) {
      reported = owner_status_.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
                     ? owner_status_
                     : AtDeadline(sent_, deadline_);
    }
    if (done_) done_(reported, messages_);
    delete this;
  }

  grpc::CallbackServerContext* const call_;  // the downstream call; unused after Finish
  const std::chrono::system_clock::time_point deadline_;
  const std::string method_;  // gRPC's RpcMethod keeps a pointer to it
  grpc::ByteBuffer request_;  // shares the server call's request slices
  const std::string forwarded_by_;
  const std::shared_ptr<ForwardStats> stats_;
  ForwardStreamDone done_;
  grpc::ClientContext context_;  // the upstream call's
  Upstream upstream_;

  std::mutex mu_;
  grpc::ByteBuffer in_;              // the upstream read in flight, or the message held
  grpc::ByteBuffer out_;             // the downstream write in flight
  std::optional<std::string> node_;  // the owner's x-cortiq-node
  bool headers_ = false;             // the owner's initial metadata is in
  bool headers_sent_ = false;        // ours went into the downstream call
  bool held_ = false;                // in_ holds a message waiting for the headers
  uint64_t holding_ = 0;             // messages read and not yet written down: 0 or 1
  bool reading_ = false;             // an upstream read is in flight
  bool writing_ = false;             // a downstream write is in flight
  bool hold_ = true;                 // our hold on the upstream call
  bool eof_ = false;                 // the owner sends no more messages
  bool owner_done_ = false;          // the upstream OnDone ran (owner_status_ set)
  grpc::Status owner_status_;
  bool finished_ = false;   // Finish was called downstream (sent_ set)
  bool cancelled_ = false;  // ... because of a cancel or a failed write
  grpc::Status sent_;
  bool server_done_ = false;  // the downstream OnDone ran
  uint64_t messages_ = 0;     // written down
};

}  // namespace

void ForwardCancel::Cancel() const {
  if (upstream_) upstream_->TryCancel();
}

ForwardCancel ForwardUnary(const ForwardTarget& target, std::string method_path,
                           grpc::CallbackServerContext* call, const grpc::ByteBuffer& request,
                           grpc::ByteBuffer* response, ForwardOptions options,
                           std::function<void(const grpc::Status&)> done) {
  std::shared_ptr<UnaryUpstream> up = PrepareUnary(std::move(method_path), call, request, options);
  ForwardCancel cancel = CancelOf(up);
  StartUnary(std::move(up), target, call, response, std::move(options.forwarded_by),
             std::move(done));
  return cancel;
}

void ForwardUnaryCall(const ForwardTarget& target, std::string method_path,
                      grpc::CallbackServerContext* call, UnaryReactor* reactor,
                      ForwardOptions options, std::function<void(const grpc::Status&)> done) {
  std::shared_ptr<UnaryUpstream> up =
      PrepareUnary(std::move(method_path), call, reactor->request_bytes(), options);
  // Before the call starts: the reply (which frees the reactor) cannot come
  // before the reactor knows how to cancel.
  reactor->OnCancelled([cancel = CancelOf(up)] { cancel.Cancel(); });
  StartUnary(std::move(up), target, call, reactor->response_bytes(),
             std::move(options.forwarded_by),
             [reactor, done = std::move(done)](const grpc::Status& status) {
               if (done) done(status);
               reactor->ReplyRaw(status);
             });
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ForwardStream(
    const ForwardTarget& target, std::string method_path, grpc::CallbackServerContext* call,
    const grpc::ByteBuffer& request, ForwardOptions options, ForwardStreamDone done) {
  return new StreamRelay(target, std::move(method_path), call, request, std::move(options),
                         std::move(done));
}

}  // namespace cortiq::server
