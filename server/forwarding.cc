#include "server/forwarding.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cortiq/v1/inference.grpc.pb.h"
#include "server/call_util.h"
#include "server/config.h"
#include "server/forward.h"
#include "server/migration.h"
#include "server/peer_dialer.h"
#include "server/session_router.h"

namespace cortiq::server {

namespace {

// The method path of `rpc` on the Inference service.
std::string MethodPath(std::string_view rpc) {
  return absl::StrCat("/", v1::Inference::service_full_name(), "/", util::Sv(rpc));
}

// OnBehalfMetadata with the server call's trace context.
std::vector<std::pair<std::string, std::string>> OnBehalfMetadata(const ServiceContext& ctx,
                                                                  const grpc::CallbackServerContext* call,
                                                                  const Caller& caller) {
  return OnBehalfMetadata(ctx, caller, ClientMetadata(call, "traceparent").value_or(""));
}

// One forwarded call: finds the owner (a record, the cache, a lookup),
// starts the relay on it, and retries once through a fresh lookup when a
// known owner proves stale. Shared by the relay's retry hook and the lookup
// callback; lives until both are done with it.
class OwnerCall : public std::enable_shared_from_this<OwnerCall> {
 public:
  OwnerCall(ServiceContext* ctx, grpc::CallbackServerContext* call, std::string_view rpc,
            std::string id, const Caller& caller, std::function<void()> nowhere,
            bool serve_here_if_nowhere = false)
      : ctx_(ctx),
        rpc_(rpc),
        id_(std::move(id)),
        deadline_(call->deadline()),
        metadata_(OnBehalfMetadata(*ctx, call, caller)),
        hops_(CallHops(call)),
        nowhere_(std::move(nowhere)),
        here_metadata_(serve_here_if_nowhere ? HereMetadata(call) : std::nullopt) {}

  // The options every attempt's relay gets: the metadata, one more hop, and
  // the retry hook.
  ForwardOptions Options() {
    ForwardOptions o;
    o.metadata = metadata_;
    o.metadata.emplace_back(kHopsHeader, std::to_string(hops_ + 1));
    o.forwarded_by = ctx_->node_name;
    o.retry = [self = shared_from_this()](const grpc::Status& status) {
      return self->Retry(status);
    };
    o.unary_limit = UnaryLimit();
    return o;
  }

  // How long a unary relay waits for the owner at most (a client with no
  // deadline included): the longest the owner's own answer may
  // legitimately take, plus a connection. A migration streams up to
  // --max-import-bytes at --peer-min-throughput; a release waits for a
  // generating session's lease (the store's release_wait); a read waits
  // --lease-wait for an ending call.
  std::chrono::milliseconds UnaryLimit() const {
    const ServerConfig& c = *ctx_->config;
    if (rpc_ == "MigrateSession") {
      return c.peer_connect_timeout +
             PeerStreamBudget(c.peer_connect_timeout, c.peer_min_throughput, c.max_import_bytes);
    }
    return c.peer_connect_timeout + ctx_->store->options().release_wait + c.lease_wait;
  }

  // Starts: a known owner at once, else a lookup. `pending` is the relay.
  void Start(ForwardPending* pending) {
    pending_ = pending;
    if (std::optional<std::string> owner = ctx_->router->Known(id_)) {
      Begin(*owner, /*known=*/true);
      return;
    }
    Lookup();
  }

  // The relay's retry hook: a stale known owner is forgotten and a lookup
  // runs (once per call); anything else is the answer.
  bool Retry(const grpc::Status& status) {
    {
      std::lock_guard lock(mu_);
      if (!known_ || retried_ || !StaleOwner(status)) return false;
      retried_ = true;
    }
    ctx_->router->Stale(id_, owner_);
    Lookup();
    return true;
  }

  std::string owner() const {
    std::lock_guard lock(mu_);
    return owner_;
  }

 private:
  void Lookup() {
    SessionRouter::LookupCall lc;
    lc.deadline = deadline_;
    lc.metadata = metadata_;
    ctx_->router->Lookup(id_, std::move(lc),
                         [self = shared_from_this()](absl::StatusOr<std::string> owner) {
                           if (!owner.ok()) {
                             self->Fail(owner.status());
                             return;
                           }
                           self->Begin(*owner, /*known=*/false);
                         });
  }

  void Begin(const std::string& owner, bool known) {
    {
      std::lock_guard lock(mu_);
      owner_ = owner;
      known_ = known;
    }
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        ctx_->peers->Channel(owner, PeerDialer::Wait::kNo);
    if (!channel.ok()) {  // no longer a peer (a DNS peer that left)
      ctx_->router->Stale(id_, owner);
      if (known) {
        Lookup();
      } else {
        Fail(channel.status());
      }
      return;
    }
    pending_->Begin(ForwardTarget{*std::move(channel), owner});
  }

  void Fail(const absl::Status& status) {
    if (status.code() == absl::StatusCode::kNotFound && nowhere_) {
      nowhere_();  // wrote the call's answer
      pending_->Fail(grpc::Status::OK);
      return;
    }
    if (status.code() == absl::StatusCode::kNotFound && here_metadata_) {
      ServeHere(status);
      return;
    }
    pending_->Fail(ToGrpcStatus(status));
  }

  // No node holds the session and the call creates it: relayed to this
  // node, which serves it itself (the hop limit) as the caller's own call.
  void ServeHere(const absl::Status& nowhere) {
    std::shared_ptr<grpc::Channel> self = ctx_->self_channel.load();
    if (!self) {  // not serving yet, or stopping
      pending_->Fail(ToGrpcStatus(nowhere));
      return;
    }
    {
      std::lock_guard lock(mu_);
      owner_ = ctx_->node_name;
      known_ = false;  // its answer is final: no retry
    }
    pending_->Begin(ForwardTarget{self, ctx_->node_name, here_metadata_});
  }

  // What the call relayed to this node carries: the caller's own
  // credentials (as it sent them: its token, or a peer's token with the
  // caller it acts for), its trace context, and the hop limit.
  static std::optional<std::vector<std::pair<std::string, std::string>>> HereMetadata(
      const grpc::CallbackServerContext* call) {
    std::vector<std::pair<std::string, std::string>> md;
    for (std::string_view key : {std::string_view("authorization"),
                                 std::string_view(kOnBehalfOfHeader),
                                 std::string_view("traceparent")}) {
      if (auto value = ClientMetadata(call, key)) md.emplace_back(key, *value);
    }
    md.emplace_back(kHopsHeader, std::to_string(kMaxForwardHops));
    return md;
  }

  ServiceContext* const ctx_;
  const std::string rpc_;
  const std::string id_;
  const std::chrono::system_clock::time_point deadline_;
  const std::vector<std::pair<std::string, std::string>> metadata_;
  const int hops_;
  const std::function<void()> nowhere_;
  // Set for a call that creates its session when no node holds it: the
  // metadata of its relay to this node (ServeHere).
  const std::optional<std::vector<std::pair<std::string, std::string>>> here_metadata_;
  ForwardPending* pending_ = nullptr;

  mutable std::mutex mu_;
  std::string owner_;
  bool known_ = false;    // owner_ came from a record or the cache, not a lookup
  bool retried_ = false;  // one retry per call
};

}  // namespace

std::vector<std::pair<std::string, std::string>> OnBehalfMetadata(const ServiceContext& ctx,
                                                                  const Caller& caller,
                                                                  std::string_view traceparent) {
  std::vector<std::pair<std::string, std::string>> md;
  if (!ctx.config->peer_token.empty()) {
    md.emplace_back("authorization", "Bearer " + ctx.config->peer_token);
  }
  md.emplace_back(kOnBehalfOfHeader, OnBehalfOfValue(caller));
  if (IsValidTraceparent(traceparent)) md.emplace_back("traceparent", std::string(traceparent));
  return md;
}

bool StaleOwner(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE ||
         status.error_code() == grpc::StatusCode::NOT_FOUND;
}

int CallHops(const grpc::CallbackServerContext* call) {
  return ParseHops(ClientMetadata(call, kHopsHeader).value_or(""));
}

bool ShouldForward(const ServiceContext& ctx, const grpc::CallbackServerContext* call,
                   const std::string& id, const Caller& caller) {
  if (ctx.router == nullptr || ctx.peers == nullptr) return false;
  if (CallHops(call) >= kMaxForwardHops) return false;
  if (!session::SessionStore::IsIdForm(id)) return false;  // no session anywhere has it: answered here
  if (ctx.store->Get(id, caller.sessions()).has_value()) return false;
  // A node without peers answers for itself.
  return !ctx.peers->Peers(PeerDialer::Wait::kNo).empty();
}

grpc::ServerUnaryReactor* ForwardUnaryToOwner(ServiceContext* ctx,
                                              grpc::CallbackServerContext* call,
                                              UnaryReactor* reactor, std::string_view rpc,
                                              const std::string& id, const Caller& caller,
                                              std::function<void()> nowhere) {
  auto log = std::make_shared<CallLog>(ctx, call, rpc);
  auto owner_call =
      std::make_shared<OwnerCall>(ctx, call, rpc, id, caller, std::move(nowhere));
  ForwardPending* pending = ForwardUnaryLater(
      MethodPath(rpc), call, reactor, owner_call->Options(),
      [log, owner_call, id](const grpc::Status& status) {
        log->Done(status.error_code(), status.error_message(),
                  {{"session", id}, {"forwarded_to", owner_call->owner()}});
      });
  owner_call->Start(pending);
  return reactor;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ForwardStreamToOwner(
    ServiceContext* ctx, grpc::CallbackServerContext* call, const grpc::ByteBuffer& request,
    std::string_view rpc, const std::string& id, const Caller& caller,
    bool serve_here_if_nowhere) {
  auto log = std::make_shared<CallLog>(ctx, call, rpc);
  auto owner_call =
      std::make_shared<OwnerCall>(ctx, call, rpc, id, caller, nullptr, serve_here_if_nowhere);
  auto [reactor, pending] = ForwardStreamLater(
      MethodPath(rpc), call, request, owner_call->Options(),
      [log, owner_call, id](const grpc::Status& status, uint64_t messages) {
        log->Done(status.error_code(), status.error_message(),
                  {{"session", id},
                   {"forwarded_to", owner_call->owner()},
                   {"messages", static_cast<int64_t>(messages)}});
      });
  owner_call->Start(pending);
  return reactor;
}

namespace {

// ListSessions of the whole cluster: one ListSessions (this node's only: at
// the hop limit) to every peer at once; the reply goes when the last
// answers. Each peer call's callback holds the state.
class ClusterList {
 public:
  struct Ask {
    std::string peer;
    grpc::ClientContext context;
    v1::ListSessionsResponse response;
    std::unique_ptr<v1::Inference::Stub> stub;
  };

  ClusterList(ServiceContext* ctx, grpc::CallbackServerContext* call, UnaryReactor* reactor,
              v1::ListSessionsResponse* response)
      : ctx_(ctx), reactor_(reactor), response_(response), log_(ctx, call, "ListSessions") {}

  static void Start(const std::shared_ptr<ClusterList>& self, grpc::CallbackServerContext* call,
                    const Caller& caller) {
    ServiceContext& ctx = *self->ctx_;
    // This node's own, first.
    for (const auto& s : ctx.store->List(caller.sessions())) {
      ToProto(s, ctx.node_name, self->response_->add_sessions());
    }
    const auto deadline = std::min(call->deadline(), std::chrono::system_clock::now() +
                                                         ctx.config->peer_connect_timeout);
    std::vector<std::pair<std::string, std::string>> md = OnBehalfMetadata(ctx, call, caller);
    md.emplace_back(kHopsHeader, std::to_string(kMaxForwardHops));
    std::vector<Ask*> asks;
    {
      std::lock_guard lock(self->mu_);
      for (const std::string& peer : ctx.peers->Peers(PeerDialer::Wait::kNo)) {
        absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
            ctx.peers->Channel(peer, PeerDialer::Wait::kNo);
        if (!channel.ok()) {
          self->response_->add_unreachable_peers(
              absl::StrCat(peer, ": ", channel.status().message()));
          continue;
        }
        auto ask = std::make_unique<Ask>();
        ask->peer = peer;
        ask->context.set_deadline(deadline);
        for (const auto& [k, v] : md) ask->context.AddMetadata(k, v);
        ask->stub = v1::Inference::NewStub(*channel);
        asks.push_back(ask.get());
        self->asks_.push_back(std::move(ask));
      }
      self->pending_ = asks.size();
    }
    // The caller's cancel ends the peer calls (they answer CANCELLED).
    self->reactor_->OnCancelled([self] {
      std::lock_guard lock(self->mu_);
      for (auto& a : self->asks_) a->context.TryCancel();
    });
    if (asks.empty()) {
      self->Reply();
      return;
    }
    for (Ask* a : asks) {
      a->stub->async()->ListSessions(&a->context, &self->request_, &a->response,
                                     [self, a](grpc::Status st) { self->Answered(a, st); });
    }
  }

 private:
  void Answered(Ask* a, const grpc::Status& st) {
    bool last;
    {
      std::lock_guard lock(mu_);
      if (!st.ok()) {
        response_->add_unreachable_peers(absl::StrCat(a->peer, ": ", st.error_message()));
      } else {
        for (auto& s : *a->response.mutable_sessions()) {
          // --peer-dns lists this node too: its own sessions are in already.
          if (s.node() == ctx_->node_name) continue;
          response_->add_sessions()->Swap(&s);
        }
      }
      last = --pending_ == 0;
    }
    if (last) Reply();
  }

  void Reply() {
    std::set<std::string> seen;
    auto* sessions = response_->mutable_sessions();
    // A session seen twice (a migration between two answers) counts once.
    sessions->erase(std::remove_if(sessions->begin(), sessions->end(),
                                   [&](const v1::SessionInfo& s) {
                                     return !seen.insert(s.session_id()).second;
                                   }),
                    sessions->end());
    v1::SessionMemory* total = response_->mutable_total_memory();
    total->Clear();
    for (const auto& s : *sessions) {
      const v1::SessionMemory& m = s.memory();
      total->set_kv_f32_bytes(total->kv_f32_bytes() + m.kv_f32_bytes());
      total->set_kv_int8_bytes(total->kv_int8_bytes() + m.kv_int8_bytes());
      total->set_o1_bytes(total->o1_bytes() + m.o1_bytes());
      total->set_qsa_bytes(total->qsa_bytes() + m.qsa_bytes());
      total->set_total_bytes(total->total_bytes() + m.total_bytes());
    }
    log_.Done(grpc::StatusCode::OK, "",
              {{"cluster", static_cast<int64_t>(1)},
               {"unreachable", static_cast<int64_t>(response_->unreachable_peers_size())}});
    reactor_->Reply(grpc::Status::OK);
  }

  ServiceContext* const ctx_;
  UnaryReactor* const reactor_;
  v1::ListSessionsResponse* const response_;
  CallLog log_;
  const v1::ListSessionsRequest request_;  // cluster = false: each peer's own
  std::mutex mu_;
  std::vector<std::unique_ptr<Ask>> asks_;
  size_t pending_ = 0;
};

}  // namespace

grpc::ServerUnaryReactor* ListClusterSessions(ServiceContext* ctx,
                                              grpc::CallbackServerContext* call,
                                              UnaryReactor* reactor,
                                              v1::ListSessionsResponse* response,
                                              const Caller& caller) {
  auto list = std::make_shared<ClusterList>(ctx, call, reactor, response);
  ClusterList::Start(list, call, caller);
  return reactor;
}

}  // namespace cortiq::server
