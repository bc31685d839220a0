#include "server/session_router.h"

#include <algorithm>
#include <charconv>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cortiq/v1/inference.grpc.pb.h"
#include "grpcpp/client_context.h"

namespace cortiq::server {

int ParseHops(std::string_view value) {
  int hops = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), hops);
  if (ec != std::errc() || end != value.data() + value.size() || hops < 0) return 0;
  return std::min(hops, kMaxForwardHops);
}

// One lookup: a GetSession to every peer, at once. Each peer call's callback
// holds the state (shared_ptr), so it lives until the last one has run; the
// router counts it until then (its destructor waits).
class SessionRouter::LookupState final : public SessionRouter::Pending {
 public:
  struct Ask {
    std::string peer;
    grpc::ClientContext context;
    v1::GetSessionRequest request;
    v1::SessionInfo response;
    std::unique_ptr<v1::Inference::Stub> stub;
  };

  LookupState(SessionRouter* router, std::string id,
              std::function<void(absl::StatusOr<std::string>)> done)
      : router_(router), id_(std::move(id)), done_(std::move(done)) {}

  void Cancel() override {
    Answer(absl::CancelledError(absl::StrCat("session lookup of '", id_, "' cancelled")));
  }

  // Starts the peer calls; `self` is this state's own shared_ptr.
  void Start(const std::shared_ptr<LookupState>& self, const std::vector<std::string>& peers,
             const LookupCall& call, std::chrono::milliseconds timeout, const Dial& dial) {
    const auto deadline = std::min(call.deadline, std::chrono::system_clock::now() + timeout);
    std::vector<Ask*> started;
    {
      std::lock_guard lock(mu_);
      for (const std::string& peer : peers) {
        absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = dial(peer);
        if (!channel.ok()) {
          failures_.push_back(absl::StrCat(peer, ": ", channel.status().message()));
          continue;
        }
        auto ask = std::make_unique<Ask>();
        ask->peer = peer;
        ask->context.set_deadline(deadline);
        for (const auto& [key, value] : call.metadata) ask->context.AddMetadata(key, value);
        // At the hop limit the peer answers from its own sessions only.
        ask->context.AddMetadata(kHopsHeader, std::to_string(kMaxForwardHops));
        ask->request.set_session_id(id_);
        ask->stub = v1::Inference::NewStub(*channel);
        started.push_back(ask.get());
        asks_.push_back(std::move(ask));
      }
      pending_ = started.size();
      if (answered_) {  // cancelled before it began
        for (Ask* a : started) a->context.TryCancel();
      }
    }
    if (started.empty()) {
      Finish();
      return;
    }
    for (Ask* a : started) {
      a->stub->async()->GetSession(&a->context, &a->request, &a->response,
                                   [self, a](grpc::Status st) { self->Answered(a, st); });
    }
  }

 private:
  void Answered(Ask* a, const grpc::Status& st) {
    bool last = false;
    {
      std::lock_guard lock(mu_);
      if (st.ok()) {
        if (!found_) found_ = a->peer;
      } else if (st.error_code() == grpc::StatusCode::NOT_FOUND) {
        ++not_found_;
      } else if (st.error_code() != grpc::StatusCode::CANCELLED || !answered_) {
        failures_.push_back(absl::StrCat(a->peer, ": ", st.error_message()));
      }
      last = --pending_ == 0;
    }
    if (st.ok()) {
      // The first holder wins: the other peer calls are not needed.
      Answer(a->peer);
    }
    if (last) Finish();
  }

  // All peer calls have ended: the verdict when nobody had it, then the
  // router stops counting this lookup.
  void Finish() {
    std::string verdict;
    absl::Status st;
    {
      std::lock_guard lock(mu_);
      if (failures_.empty()) {
        st = absl::NotFoundError(absl::StrCat("session_id: no session '", id_,
                                              "' on this node or its ", not_found_, " peer",
                                              not_found_ == 1 ? "" : "s"));
      } else {
        st = absl::UnavailableError(absl::StrCat(
            "session_id: no session '", id_, "' on this node or the ", not_found_,
            " peer(s) that answered; ", failures_.size(),
            " did not: ", absl::StrJoin(failures_, "; ")));
      }
    }
    Answer(st);
    router_->Ended(this);
  }

  // Runs `done` once, and cancels the peer calls still out.
  void Answer(absl::StatusOr<std::string> result) {
    std::function<void(absl::StatusOr<std::string>)> done;
    {
      std::lock_guard lock(mu_);
      if (answered_) return;
      answered_ = true;
      done = std::move(done_);
      for (auto& a : asks_) a->context.TryCancel();  // ended calls ignore it
    }
    if (result.ok()) router_->Remember(router_->owners_, id_, *result, kOwnerCacheTtl);
    done(std::move(result));
  }

  SessionRouter* const router_;
  const std::string id_;
  std::mutex mu_;
  std::function<void(absl::StatusOr<std::string>)> done_;
  std::vector<std::unique_ptr<Ask>> asks_;
  size_t pending_ = 0, not_found_ = 0;
  std::optional<std::string> found_;
  std::vector<std::string> failures_;
  bool answered_ = false;
};

SessionRouter::SessionRouter(Options options, PeerList peers, Dial dial)
    : options_(options), peers_(std::move(peers)), dial_(std::move(dial)) {}

SessionRouter::~SessionRouter() {
  std::vector<std::shared_ptr<LookupState>> live;
  {
    std::lock_guard lock(mu_);
    for (const auto& w : in_flight_) {
      if (auto s = w.lock()) live.push_back(std::move(s));
    }
  }
  for (auto& s : live) s->Cancel();
  live.clear();
  std::unique_lock lock(mu_);
  ended_.wait(lock, [&] { return lookups_in_flight_ == 0; });
}

void SessionRouter::Remember(std::unordered_map<std::string, Entry>& table, const std::string& id,
                             const std::string& peer, Clock::duration ttl) {
  const auto now = Clock::now();
  std::lock_guard lock(mu_);
  if (table.size() >= options_.max_entries && !table.contains(id)) {
    std::erase_if(table, [&](const auto& kv) { return kv.second.expires <= now; });
    // Still full of live entries: the oldest half by expiry goes.
    if (table.size() >= options_.max_entries) {
      std::vector<Clock::time_point> expiries;
      expiries.reserve(table.size());
      for (const auto& [k, e] : table) expiries.push_back(e.expires);
      auto mid = expiries.begin() + static_cast<std::ptrdiff_t>(expiries.size() / 2);
      std::nth_element(expiries.begin(), mid, expiries.end());
      const Clock::time_point cut = *mid;
      std::erase_if(table, [&](const auto& kv) { return kv.second.expires <= cut; });
    }
  }
  table[id] = Entry{peer, now + ttl};
}

void SessionRouter::Moved(const std::string& id, const std::string& peer) {
  Remember(moved_, id, peer, options_.forward_ttl);
  std::lock_guard lock(mu_);
  owners_.erase(id);
}

void SessionRouter::Forget(const std::string& id) {
  std::lock_guard lock(mu_);
  moved_.erase(id);
  owners_.erase(id);
}

void SessionRouter::Stale(const std::string& id, const std::string& peer) {
  std::lock_guard lock(mu_);
  for (auto* table : {&moved_, &owners_}) {
    auto it = table->find(id);
    if (it != table->end() && it->second.peer == peer) table->erase(it);
  }
}

std::optional<std::string> SessionRouter::Known(const std::string& id) const {
  const auto now = Clock::now();
  std::lock_guard lock(mu_);
  for (const auto* table : {&moved_, &owners_}) {
    auto it = table->find(id);
    if (it != table->end() && it->second.expires > now) return it->second.peer;
  }
  return std::nullopt;
}

std::shared_ptr<SessionRouter::Pending> SessionRouter::Lookup(
    const std::string& id, LookupCall call,
    std::function<void(absl::StatusOr<std::string>)> done) {
  bool admitted = false;
  {
    std::lock_guard lock(mu_);
    if (lookups_in_flight_ < options_.max_lookups) {
      ++lookups_in_flight_;
      ++lookups_started_;
      admitted = true;
    }
  }
  if (!admitted) {
    done(absl::ResourceExhaustedError(
        absl::StrCat("session lookup: ", options_.max_lookups,
                     " lookups of sessions on other nodes are in flight; try again")));
    return nullptr;
  }
  auto state = std::make_shared<LookupState>(this, id, std::move(done));
  {
    std::lock_guard lock(mu_);
    std::erase_if(in_flight_, [](const auto& w) { return w.expired(); });
    in_flight_.push_back(state);
  }
  state->Start(state, peers_(), call, options_.lookup_timeout, dial_);
  return state;
}

void SessionRouter::Ended(LookupState*) {
  std::lock_guard lock(mu_);
  --lookups_in_flight_;
  ended_.notify_all();
}

size_t SessionRouter::lookups_in_flight() const {
  std::lock_guard lock(mu_);
  return lookups_in_flight_;
}

size_t SessionRouter::lookups_started() const {
  std::lock_guard lock(mu_);
  return lookups_started_;
}

}  // namespace cortiq::server
