#include "server/http/http_server.h"

#include <httplib.h>

#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/chat/chat_template.h"
#include "core/util/status_macros.h"
#include "core/util/strings.h"
#include "server/call_util.h"
#include "server/generation.h"
#include "server/http/api_error.h"
#include "server/http/generation_stream.h"
#include "server/http/openai_response.h"
#include "server/http/owner_relay.h"
#include "server/log_format.h"
#include "server/peer_dialer.h"
#include "server/session_router.h"
#include "spdlog/spdlog.h"

namespace cortiq::server::http {

namespace {

using session::Clock;
using OJson = nlohmann::ordered_json;

constexpr char kJsonType[] = "application/json";
constexpr char kConversationHeader[] = "x-cortiq-session";
constexpr char kSessionIdHeader[] = "x-cortiq-session-id";
// The node that served the request, and the one that relayed it to the
// conversation's owner (the gRPC front's x-cortiq-node and
// x-cortiq-forwarded-by metadata).
constexpr char kNodeHeader[] = "x-cortiq-node";
constexpr char kForwardedByHeader[] = "x-cortiq-forwarded-by";
// How often a stream waiting for the engine looks whether its client is
// still there (a closed socket cancels the job).
constexpr auto kAlivePoll = std::chrono::milliseconds(200);
// The wait for a job outlasts its engine deadline by this much: the engine
// ends the job at its next step after the deadline, and the wait must not
// give up before the engine's own answer.
constexpr auto kDeadlineSlack = std::chrono::seconds(5);
// Socket timeouts: reading a request, writing each piece of an answer.
constexpr time_t kReadTimeoutS = 30, kWriteTimeoutS = 30;
// Keep-alive: requests per connection, and how long an idle one is kept.
constexpr size_t kKeepAliveMax = 100;
constexpr time_t kKeepAliveTimeoutS = 5;
// The request body may hold the prompt several times over (JSON escapes,
// token ids as decimal text, a chat's tools and messages around it).
constexpr size_t kBodyPerPromptByte = 4;
constexpr size_t kBodySlack = 64 << 10;
// SSE: events batched into one write while the engine has more queued.
constexpr size_t kSseBatchBytes = 16 << 10;

size_t BodyLimit(const ServerConfig& c) {
  return c.max_prompt_bytes * kBodyPerPromptByte + kBodySlack;
}

// HOST:PORT or [V6]:PORT → (host, port); port 0 allowed.
absl::StatusOr<std::pair<std::string, int>> SplitListen(const std::string& listen) {
  std::string host;
  std::string_view port;
  if (listen.starts_with("[")) {
    const size_t close = listen.find("]:");
    if (close == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--http-listen: '", listen, "' is not HOST:PORT, [V6]:PORT or off"));
    }
    host = listen.substr(1, close - 1);
    port = std::string_view(listen).substr(close + 2);
  } else {
    const size_t colon = listen.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--http-listen: '", listen, "' is not HOST:PORT, [V6]:PORT or off"));
    }
    host = listen.substr(0, colon);
    port = std::string_view(listen).substr(colon + 1);
  }
  int p = 0;
  if (!absl::SimpleAtoi(util::Sv(port), &p) || p < 0 || p > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http-listen: '", listen, "' has no port in 0..65535"));
  }
  return std::make_pair(host, p);
}

std::optional<std::string_view> Header(const httplib::Request& req, const char* key) {
  // httplib's headers are a case-insensitive multimap; the value lives as
  // long as the request.
  auto it = req.headers.find(key);
  if (it == req.headers.end()) return std::nullopt;
  return std::string_view(it->second);
}

void SetError(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.status == 401) res.set_header("WWW-Authenticate", "Bearer");
  res.set_content(ErrorJson(e), kJsonType);
}

bool ReadsBody(std::string_view method) {
  // The methods whose body httplib 0.11.4 reads (detail::expect_content).
  return method == "POST" || method == "PUT" || method == "PATCH" || method == "DELETE" ||
         method == "PRI";
}

// Why a request's body may not be read, from its headers alone; nullopt
// when it may. httplib 0.11.4 bounds a body by set_payload_max_length only
// when it has a Content-Length: a chunked body, one without a length (read
// until the client closes) and a compressed one (inflated as it is read)
// would reach a handler whole, whatever their size, before any route or
// token is checked. So the body must come as it is sent, with its length.
// A Content-Length above `limit` is left to httplib: its 413 skips the body
// and keeps the connection.
std::optional<ApiError> BodyFramingError(const httplib::Request& req, size_t limit) {
  // `status` with `what`, then the limit: every refusal names its header first.
  auto refuse = [limit](int status, std::string_view what) {
    ApiError e;
    e.status = status;
    e.message = absl::StrCat(util::Sv(what), ", at most ", limit,
                             " bytes (4 x --max-prompt-bytes + 64 KiB)");
    return e;
  };
  if (req.has_header("Transfer-Encoding")) {
    return refuse(411,
                  "Transfer-Encoding: not accepted (chunked bodies are refused); send the body "
                  "with Content-Length");
  }
  if (auto v = Header(req, "Content-Encoding");
      v && !absl::EqualsIgnoreCase(util::Sv(*v), "identity")) {
    return refuse(415,
                  "Content-Encoding: not accepted (compressed bodies are refused); send the body "
                  "uncompressed");
  }
  const size_t lengths = req.get_header_value_count("Content-Length");
  uint64_t length = 0;
  if (lengths > 1 ||
      (lengths == 1 && !absl::SimpleAtoi(util::Sv(*Header(req, "Content-Length")), &length))) {
    return refuse(400, "Content-Length: must be one decimal byte count");
  }
  if (lengths == 0 && ReadsBody(req.method)) {
    return refuse(411, absl::StrCat("Content-Length: required for a ", req.method, " body"));
  }
  return std::nullopt;
}

// Answers `e` and closes the connection after it: the body of a refused
// request is still unread, and httplib 0.11.4 would read it as the next
// request on a kept connection. It keeps a connection unless writing the
// answer fails, so the answer is written by a content provider that then
// reports failure (the whole answer is on the wire by then).
void RefuseAndClose(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_header("Connection", "close");
  std::string body = ErrorJson(e);
  const size_t size = body.size();
  res.set_content_provider(
      size, kJsonType,
      [body = std::move(body)](size_t offset, size_t length, httplib::DataSink& sink) {
        sink.write(body.data() + offset, length);
        return false;
      });
}

// Wakes a consumer when its job has news (the job's notify, engine thread).
class Signal {
 public:
  void Notify() {
    {
      std::lock_guard lock(mu_);
      set_ = true;
    }
    cv_.notify_all();
  }
  // True when notified since the last wait; false at `until`.
  bool WaitUntil(Clock::time_point until) {
    std::unique_lock lock(mu_);
    const bool got = cv_.wait_until(lock, until, [&] { return set_; });
    set_ = false;
    return got;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool set_ = false;
};

// A submitted job as its HTTP consumer sees it: its events, waited for
// with a bound, and its place in jobs_in_flight until the engine is done.
// Destroying it cancels the job (a no-op once finished).
class JobWatch final : public GenerationStream {
 public:
  JobWatch(ServiceContext* ctx, std::shared_ptr<session::Job> job)
      : job_(std::move(job)),
        token_(std::make_shared<util::InFlight::Token>(ctx->jobs_in_flight.Enter())) {
    job_->SetNotify([signal = signal_] { signal->Notify(); });
  }
  ~JobWatch() override {
    ReleaseWhenFinished(job_, token_);
    job_->Cancel();
  }
  JobWatch(const JobWatch&) = delete;
  JobWatch& operator=(const JobWatch&) = delete;

  Next Wait(session::GenerationEvent* ev, Clock::time_point until) override {
    for (;;) {
      if (job_->Pop(ev)) return Next::kEvent;
      if (job_->Drained()) return Next::kDrained;
      if (!signal_->WaitUntil(until) && Clock::now() >= until) return Next::kWaiting;
    }
  }
  bool Pop(session::GenerationEvent* ev) override { return job_->Pop(ev); }
  void Cancel() override { job_->Cancel(); }
  const session::GenerationResult& result() const override { return job_->result(); }

 private:
  std::shared_ptr<session::Job> job_;
  std::shared_ptr<util::InFlight::Token> token_;
  std::shared_ptr<Signal> signal_ = std::make_shared<Signal>();
};

// The relayed generations in flight (owner_relay.h), so that Stop can
// cancel them: Quiesce cancels this node's jobs, not a call running on
// another node, and Stop waits for every worker.
class RelaySet {
 public:
  // `stream`, cancelled by CancelAll (at once when that has run) until the
  // returned wrapper is destroyed.
  std::unique_ptr<GenerationStream> Track(std::unique_ptr<GenerationStream> stream) {
    return std::make_unique<Tracked>(this, std::move(stream));
  }
  void CancelAll() {
    std::lock_guard lock(mu_);
    stopping_ = true;
    for (GenerationStream* s : live_) s->Cancel();
  }

 private:
  class Tracked final : public GenerationStream {
   public:
    Tracked(RelaySet* set, std::unique_ptr<GenerationStream> inner)
        : set_(set), inner_(std::move(inner)) {
      std::lock_guard lock(set_->mu_);
      set_->live_.insert(inner_.get());
      if (set_->stopping_) inner_->Cancel();
    }
    ~Tracked() override {
      std::lock_guard lock(set_->mu_);
      set_->live_.erase(inner_.get());
    }
    Next Wait(session::GenerationEvent* ev, Clock::time_point until) override {
      return inner_->Wait(ev, until);
    }
    bool Pop(session::GenerationEvent* ev) override { return inner_->Pop(ev); }
    void Cancel() override { inner_->Cancel(); }
    const session::GenerationResult& result() const override { return inner_->result(); }

   private:
    RelaySet* const set_;
    std::unique_ptr<GenerationStream> inner_;  // destroyed after the erase above
  };

  std::mutex mu_;
  std::set<GenerationStream*> live_;
  bool stopping_ = false;
};

// The route="..." label of a request's "METHOD /path": its path, with
// /v1/models/{model} counted as /v1/models. Metrics::ObserveHttpRequest
// keeps the label bounded (a path outside its list counts as "other").
std::string_view MetricsRoute(std::string_view rpc) {
  const size_t space = rpc.find(' ');
  std::string_view path = space == std::string_view::npos ? rpc : rpc.substr(space + 1);
  if (path.starts_with("/v1/models/")) path = "/v1/models";
  return path;
}

// One request's log line (see the banner) and its metrics, written once by Done.
class HttpCall {
 public:
  HttpCall(ServiceContext* ctx, const httplib::Request& req, std::string rpc)
      : ctx_(ctx),
        rpc_(std::move(rpc)),
        id_(ctx->next_request_id.fetch_add(1)),
        start_(Clock::now()),
        peer_(absl::StrCat(req.remote_addr, ":", req.remote_port)) {
    if (auto v = Header(req, "traceparent"); v && IsValidTraceparent(*v)) traceparent_ = *v;
  }
  void set_caller(const Caller& c) { caller_ = c; }
  void Add(std::string key, std::variant<std::string, int64_t> value) {
    fields_.push_back({std::move(key), std::move(value)});
  }
  void Done(int http_status, std::string_view message) {
    if (done_) return;
    done_ = true;
    fields_.push_back({"http_status", static_cast<int64_t>(http_status)});
    if (caller_) {
      fields_.push_back({"tenant", caller_->tenant});
      fields_.push_back({"role", std::string(RoleName(caller_->role))});
    }
    const double seconds = session::Seconds(Clock::now() - start_);
    if (ctx_->metrics) ctx_->metrics->ObserveHttpRequest(MetricsRoute(rpc_), http_status, seconds);
    LogRequest({.request_id = id_,
                .rpc = rpc_,
                .code = CodeNameOfHttpStatus(http_status),
                .error = message,
                .duration_ms = seconds * 1e3,
                .peer = peer_,
                .traceparent = traceparent_,
                .fields = std::move(fields_)});
  }

 private:
  ServiceContext* ctx_;
  std::string rpc_;
  uint64_t id_;
  Clock::time_point start_;
  std::string peer_;
  std::string traceparent_;
  std::optional<Caller> caller_;
  LogFields fields_;
  bool done_ = false;
};

// What a generation endpoint makes of its request before submitting it.
struct Prepared {
  session::GenerationRequest g;
  GenerationTarget target;
  OutputOptions out;
  AssistantOutputParser::Options parse;
  ParamRenames renames;
  bool conversation = false;
};

// A job's outcome as the HTTP answer sees it: its status, or — for a job
// cancelled by the server (a drain, a shutdown, a release of its session;
// a vanished client never reads this) — UNAVAILABLE: OpenAI has no finish
// reason for it, and a truncated answer must not pass for a whole one.
absl::Status Outcome(const session::GenerationResult& r) {
  if (!r.status.ok()) return r.status;
  if (r.finish_reason == session::FinishReason::kCancelled) {
    return absl::UnavailableError(
        "the generation was cancelled by the server (draining, or its session was released)");
  }
  return absl::OkStatus();
}

// A streamed answer: lives in the response's content provider until httplib
// has written (or abandoned) it.
class SseStream {
 public:
  SseStream(std::unique_ptr<HttpCall> call, util::InFlight::Token in_flight,
            std::unique_ptr<GenerationStream> watch, ResponseBuilder builder,
            Clock::time_point deadline, std::string session_id)
      : call_(std::move(call)),
        in_flight_(std::move(in_flight)),
        watch_(std::move(watch)),
        builder_(std::move(builder)),
        deadline_(deadline),
        session_id_(std::move(session_id)) {}
  ~SseStream() {
    watch_.reset();  // cancels the job unless it finished
    const session::GenerationResult* r = finished_ ? &result_ : nullptr;
    call_->Add("session", session_id_);
    call_->Add("completion_tokens", static_cast<int64_t>(r ? r->completion_tokens : tokens_));
    call_->Add("finish", finish_);
    call_->Done(status_, message_);
  }

  // httplib's chunked content provider: writes the next piece; false when
  // the client is gone (httplib then closes the connection).
  bool Pump(httplib::DataSink& sink) {
    if (!started_) {
      started_ = true;
      std::string first = builder_.StreamStart();
      if (!first.empty()) return Write(sink, first);
    }
    for (;;) {
      const auto now = Clock::now();
      if (now >= deadline_) {
        watch_->Cancel();
        return End(sink,
                   ResponseBuilder::StreamError(ErrorFromStatus(
                       absl::DeadlineExceededError("the generation outlived --http-timeout"))),
                   504, "deadline");
      }
      session::GenerationEvent ev;
      switch (watch_->Wait(&ev, std::min(now + kAlivePoll, deadline_))) {
        case GenerationStream::Next::kEvent: {
          ++tokens_;
          std::string out = builder_.Add(std::move(ev));
          while (out.size() < kSseBatchBytes && watch_->Pop(&ev)) {
            ++tokens_;
            out += builder_.Add(std::move(ev));
          }
          if (out.empty()) continue;
          return Write(sink, out);
        }
        case GenerationStream::Next::kDrained: {
          result_ = watch_->result();
          finished_ = true;
          finish_ = std::string(session::FinishReasonName(result_.finish_reason));
          if (absl::Status st = Outcome(result_); !st.ok()) {
            const ApiError e = ErrorFromStatus(st);
            return End(sink, ResponseBuilder::StreamError(e), e.status, e.message);
          }
          return End(sink, builder_.StreamEnd(result_), 200, "");
        }
        case GenerationStream::Next::kWaiting:
          if (!sink.is_writable()) return Gone();
          break;
      }
    }
  }

 private:
  bool Write(httplib::DataSink& sink, const std::string& data) {
    if (!sink.write(data.data(), data.size())) return Gone();
    return true;
  }
  bool End(httplib::DataSink& sink, const std::string& data, int status, std::string message) {
    status_ = status;
    message_ = std::move(message);
    if (!sink.write(data.data(), data.size())) return Gone();
    sink.done();
    return true;
  }
  // The client went away: the job stops (the destructor cancels it).
  bool Gone() {
    status_ = 499;
    message_ = "client closed the stream";
    watch_->Cancel();
    return false;
  }

  std::unique_ptr<HttpCall> call_;
  util::InFlight::Token in_flight_;          // in streams_in_flight until written
  std::unique_ptr<GenerationStream> watch_;  // a local job or a relayed call
  ResponseBuilder builder_;
  const Clock::time_point deadline_;
  const std::string session_id_;
  bool started_ = false;
  bool finished_ = false;
  session::GenerationResult result_;
  size_t tokens_ = 0;
  std::string finish_;
  int status_ = 499;  // until the stream ends well
  std::string message_ = "stream not finished";
};

}  // namespace

class HttpServer::Impl {
 public:
  Impl(ServiceContext* ctx, ChatRenderer chat) : ctx_(ctx), chat_(std::move(chat)) {}

  absl::Status Init();
  int Bind(const std::string& host, int port);
  void Run() { svr_->listen_after_bind(); }
  void Stop() {
    relays_.CancelAll();
    svr_->stop();
  }

 private:
  void Routes();
  // Authenticates the bearer token and checks the role may call `rpc` (the
  // gRPC method the endpoint stands for).
  absl::StatusOr<Caller> Authorize(const httplib::Request& req, std::string_view rpc) const;
  void Generate(const httplib::Request& req, httplib::Response& res, ResponseBuilder::Kind kind);
  absl::Status Prepare(const Json& body, const httplib::Request& req, const Caller& caller,
                       ResponseBuilder::Kind kind, Prepared* p) const;
  absl::Status CheckModel(const std::string& model) const;
  void Models(const httplib::Request& req, httplib::Response& res, const std::string* one);

  ServiceContext* ctx_;
  ChatRenderer chat_;
  RelaySet relays_;
  std::unique_ptr<httplib::Server> svr_;
  const int64_t created_ = std::chrono::duration_cast<std::chrono::seconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
};

absl::Status HttpServer::Impl::Init() {
  const ServerConfig& c = *ctx_->config;
  if (!c.tls_cert.empty()) {
    auto ssl = std::make_unique<httplib::SSLServer>(c.tls_cert.c_str(), c.tls_key.c_str());
    if (!ssl->is_valid()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tls-cert / --tls-key: the HTTP front cannot use '", c.tls_cert, "' and '",
                       c.tls_key, "' (not a PEM certificate chain and its key)"));
    }
    svr_ = std::move(ssl);
  } else {
    svr_ = std::make_unique<httplib::Server>();
  }
  const size_t threads = c.http_threads;
  svr_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr_->set_read_timeout(kReadTimeoutS, 0);
  svr_->set_write_timeout(kWriteTimeoutS, 0);
  svr_->set_keep_alive_max_count(kKeepAliveMax);
  svr_->set_keep_alive_timeout(kKeepAliveTimeoutS);
  svr_->set_payload_max_length(BodyLimit(c));
  Routes();
  return absl::OkStatus();
}

int HttpServer::Impl::Bind(const std::string& host, int port) {
  if (port == 0) return svr_->bind_to_any_port(host);
  return svr_->bind_to_port(host, port) ? port : -1;
}

absl::StatusOr<Caller> HttpServer::Impl::Authorize(const httplib::Request& req,
                                                   std::string_view rpc) const {
  // No x-cortiq-on-behalf-of over HTTP: it is a node-to-node header, and no
  // node calls another over HTTP.
  CORTIQ_ASSIGN_OR_RETURN(Caller caller,
                          ctx_->auth->Authenticate(Header(req, "Authorization"), std::nullopt));
  CORTIQ_RETURN_IF_ERROR(CheckPermission(caller, rpc));
  return caller;
}

absl::Status HttpServer::Impl::CheckModel(const std::string& model) const {
  if (model.empty() || model == ctx_->model_name) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat(
      "model: '", model, "' is not served here (this server serves '", ctx_->model_name, "')"));
}

void HttpServer::Impl::Routes() {
  httplib::Server& s = *svr_;
  // After the headers, before the body is read (httplib 0.11.4's routing
  // runs this first): a body that could not be bounded is refused
  // (BodyFramingError), and a wrong method on a known path gets 405
  // (httplib would answer 404); both close the connection.
  s.set_pre_routing_handler([this](const httplib::Request& req,
                                   httplib::Response& res) -> httplib::Server::HandlerResponse {
    if (std::optional<ApiError> e = BodyFramingError(req, BodyLimit(*ctx_->config))) {
      HttpCall call(ctx_, req, absl::StrCat(req.method, " ", req.path));
      RefuseAndClose(res, *e);
      call.Done(e->status, e->message);
      return httplib::Server::HandlerResponse::Handled;
    }
    struct Route {
      const char* path;
      const char* method;
    };
    static constexpr Route kRoutes[] = {{"/v1/completions", "POST"},
                                        {"/v1/chat/completions", "POST"},
                                        {"/v1/models", "GET"},
                                        {"/health", "GET"}};
    std::string_view path = req.path;
    if (path.starts_with("/v1/models/")) path = "/v1/models";
    for (const Route& r : kRoutes) {
      if (path != r.path) continue;
      if (req.method == r.method || (req.method == "HEAD" && std::string_view(r.method) == "GET")) {
        return httplib::Server::HandlerResponse::Unhandled;
      }
      HttpCall call(ctx_, req, absl::StrCat(req.method, " ", req.path));
      ApiError e;
      e.status = 405;
      e.message =
          absl::StrCat(req.method, " ", req.path, ": method not allowed (use ", r.method, ")");
      e.code = "method_not_allowed";
      // Answered before its body is read (a POST to /v1/models): closed,
      // or the body would be read as the next request.
      RefuseAndClose(res, e);
      res.set_header("Allow", r.method);
      call.Done(405, e.message);
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // httplib's own refusals (no route, an oversize body, a malformed
  // request) arrive here without a body: they get the OpenAI shape and a
  // log line. Answers the handlers wrote pass untouched.
  s.set_error_handler(httplib::Server::HandlerWithResponse(
      [this](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty() || res.content_provider_) {
          return httplib::Server::HandlerResponse::Unhandled;
        }
        HttpCall call(ctx_, req, absl::StrCat(req.method, " ", req.path));
        ApiError e;
        if (res.status == 404) {
          e.status = 404;
          e.type = "not_found_error";
          e.message = absl::StrCat(req.method, " ", req.path, ": no such route");
        } else if (res.status == 413) {
          e.status = 413;
          e.param = "body";
          e.message = absl::StrCat("body: more than ", BodyLimit(*ctx_->config),
                                   " bytes (4 x --max-prompt-bytes + 64 KiB)");
        } else {
          e = ErrorOfHttpStatus(res.status);
        }
        SetError(res, e);
        call.Done(e.status, e.message);
        return httplib::Server::HandlerResponse::Handled;
      }));
  // A handler that throws (a bug, std::bad_alloc) would get httplib's bare
  // 500, which the error handler above cannot tell from its own, and no log
  // line (the handler's HttpCall is gone): answered and logged here. What
  // was thrown goes to the log, not to the client.
  s.set_exception_handler(
      [this](const httplib::Request& req, httplib::Response& res, std::exception_ptr thrown) {
        std::string what = "an exception that is not a std::exception";
        try {
          std::rethrow_exception(thrown);
        } catch (const std::exception& ex) {
          what = ex.what();
        } catch (...) {
        }
        HttpCall call(ctx_, req, absl::StrCat(req.method, " ", req.path));
        ApiError e = ErrorOfHttpStatus(500);
        e.message = "internal error: the server failed on this request (its log says why)";
        res.headers.clear();  // what the handler set before it threw
        SetError(res, e);
        call.Done(e.status, absl::StrCat("internal error: ", what));
      });
  s.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    Generate(req, res, ResponseBuilder::Kind::kCompletion);
  });
  s.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    Generate(req, res, ResponseBuilder::Kind::kChat);
  });
  s.Get("/v1/models",
        [this](const httplib::Request& req, httplib::Response& res) { Models(req, res, nullptr); });
  s.Get("/v1/models/(.+)", [this](const httplib::Request& req, httplib::Response& res) {
    const std::string name = req.matches[1];
    Models(req, res, &name);
  });
  s.Get("/health", [this](const httplib::Request& req, httplib::Response& res) {
    HttpCall call(ctx_, req, "GET /health");
    if (ctx_->draining.load()) {
      const ApiError e = ErrorFromStatus(Unavailable(*ctx_));
      SetError(res, e);
      call.Done(e.status, e.message);
      return;
    }
    res.set_content(R"({"status":"ok"})", kJsonType);
    call.Done(200, "");
  });
}

void HttpServer::Impl::Models(const httplib::Request& req, httplib::Response& res,
                              const std::string* one) {
  HttpCall call(ctx_, req, one ? "GET /v1/models/{model}" : "GET /v1/models");
  absl::StatusOr<Caller> caller = Authorize(req, "GetModelInfo");
  absl::Status st = caller.status();
  if (caller.ok()) {
    call.set_caller(*caller);
    if (one != nullptr) st = CheckModel(*one);
  }
  if (!st.ok()) {
    const ApiError e = ErrorFromStatus(st);
    SetError(res, e);
    call.Done(e.status, e.message);
    return;
  }
  OJson model;
  model["id"] = ctx_->model_name;
  model["object"] = "model";
  model["created"] = created_;
  model["owned_by"] = "cortiq";
  model["max_model_len"] = ctx_->engine->max_context();
  OJson body = model;
  if (one == nullptr) body = OJson{{"object", "list"}, {"data", OJson::array({model})}};
  res.set_content(body.dump(-1, ' ', false, OJson::error_handler_t::replace), kJsonType);
  call.Done(200, "");
}

absl::Status HttpServer::Impl::Prepare(const Json& body, const httplib::Request& req,
                                       const Caller& caller, ResponseBuilder::Kind kind,
                                       Prepared* p) const {
  const bool chat = kind == ResponseBuilder::Kind::kChat;
  CORTIQ_ASSIGN_OR_RETURN(CommonRequest common, ParseCommon(body, chat));
  CORTIQ_RETURN_IF_ERROR(CheckModel(common.model));
  session::GenerationRequest& g = p->g;
  g = std::move(common.g);
  p->out = common.out;
  if (chat) {
    p->renames = {{"prompt", "messages"}, {"prompt_tokens", "messages"}};
    if (common.max_tokens && body.contains("max_completion_tokens")) {
      p->renames.push_back({"max_tokens", "max_completion_tokens"});
    }
    CORTIQ_ASSIGN_OR_RETURN(ChatRequest c, ParseChat(body));
    if (!chat_.render) {
      return absl::UnimplementedError("messages: this server has no chat template yet");
    }
    CORTIQ_ASSIGN_OR_RETURN(std::string text, chat_.render(c));
    CORTIQ_RETURN_IF_ERROR(CheckPromptBytes(*ctx_, "messages", text.size()));
    g.prompt = ctx_->tokenizer->Encode(text, /*parse_special=*/true);
    // A ChatML turn ends at <|im_end|> (Qwen's generation_config lists it
    // among the end-of-sequence ids; a model whose config.json does not
    // would otherwise run on past its turn): a stop id, not streamed.
    // Unless ignore_eos (benchmark clients), which runs to max_tokens past
    // it, as vLLM does.
    if (auto im_end = ctx_->tokenizer->im_end_id();
        !g.ignore_eos && im_end && text.find("<|im_end|>") != std::string::npos &&
        std::find(g.stop_token_ids.begin(), g.stop_token_ids.end(), *im_end) ==
            g.stop_token_ids.end()) {
      g.stop_token_ids.push_back(*im_end);
    }
    p->parse.tools = c.parse_tools;
    p->parse.reasoning = chat_.thinks && c.thinking;
    // The generation prompt may already open the think block (Qwen3).
    const size_t end = text.find_last_not_of(" \t\r\n");
    p->parse.start_in_reasoning =
        end != std::string::npos && std::string_view(text).substr(0, end + 1).ends_with("<think>");
  } else {
    p->renames = {{"prompt_tokens", "prompt"}};
    CORTIQ_ASSIGN_OR_RETURN(CompletionPrompt prompt, ParseCompletionPrompt(body));
    if (prompt.text) {
      CORTIQ_RETURN_IF_ERROR(CheckPromptBytes(*ctx_, "prompt", prompt.text->size()));
      g.prompt = ctx_->tokenizer->Encode(*prompt.text);
    } else {
      CORTIQ_RETURN_IF_ERROR(CheckPromptIds(*ctx_, "prompt", prompt.ids.size()));
      g.prompt = std::move(prompt.ids);
    }
  }
  // max_tokens: completions default to 16 (the API's default); chat to what
  // the context leaves, within --max-tokens.
  if (common.max_tokens) {
    g.max_tokens = *common.max_tokens;
  } else if (chat) {
    const size_t context = ctx_->engine->max_context();
    const size_t left = context > g.prompt.size() ? context - g.prompt.size() : 1;
    g.max_tokens = std::min(ctx_->config->max_tokens_limit, left);
  } else {
    g.max_tokens = 16;
  }
  // A conversation: x-cortiq-session, or the user field with --session-from-user.
  std::string name;
  if (auto h = Header(req, kConversationHeader)) {
    name = std::string(*h);
  } else if (ctx_->config->session_from_user && !common.user.empty()) {
    name = common.user;
  }
  if (!name.empty()) {
    // The conversation's session: reused across turns (only the new suffix
    // is prefilled), created by the first, kept.
    p->conversation = true;
    p->target.session_id = ConversationSessionId(caller.tenant, name);
    p->target.create_if_missing = true;
    g.reuse_prefix = true;
  }
  // The API's seed is optional and a missing one means a fresh draw each
  // call (the gRPC default, seed 0, would repeat itself); a conversation
  // without one keeps its session's generator running across turns (the
  // draw seeds its first turn).
  if (!common.seed_given) {
    g.sampling.seed = std::random_device{}() | uint64_t{std::random_device{}()} << 32;
  }
  g.seed_given = common.seed_given || !p->conversation;
  g.deadline = Clock::now() + ctx_->config->http_timeout;
  g.frontend = session::Frontend::kHttp;  // the latency series' frontend="http"
  return absl::OkStatus();
}

void HttpServer::Impl::Generate(const httplib::Request& req, httplib::Response& res,
                                ResponseBuilder::Kind kind) {
  auto call = std::make_unique<HttpCall>(ctx_, req, absl::StrCat("POST ", req.path));
  Prepared p;
  // The node that answers: this one, or the conversation's owner.
  std::string node = ctx_->node_name;
  auto fail = [&](const absl::Status& st) {
    ApiError e = ErrorFromStatus(st, p.renames);
    if (e.status == 404 && e.param == "model") e.code = "model_not_found";
    SetError(res, e);
    if (!res.has_header(kNodeHeader)) res.set_header(kNodeHeader, node);
    call->Done(e.status, e.message);
  };
  absl::StatusOr<Caller> caller = Authorize(req, "Generate");
  if (!caller.ok()) return fail(caller.status());
  call->set_caller(*caller);
  // Draining: no new work here. A node with peers still relays the
  // conversations it moved away (as its gRPC front forwards them);
  // SubmitGeneration refuses the rest.
  if (ctx_->router == nullptr || ctx_->peers == nullptr ||
      ctx_->peers->Peers(PeerDialer::Wait::kNo).empty()) {
    if (absl::Status st = Unavailable(*ctx_); !st.ok()) return fail(st);
  }
  absl::StatusOr<Json> body = ParseBody(req.body);
  if (!body.ok()) return fail(body.status());
  if (absl::Status st = Prepare(*body, req, *caller, kind, &p); !st.ok()) return fail(st);
  call->Add("priority", std::string(session::PriorityName(p.g.priority)));
  const size_t prompt_tokens = p.g.prompt.size();
  const Clock::time_point deadline = p.g.deadline + kDeadlineSlack;
  util::InFlight::Token in_flight = ctx_->streams_in_flight.Enter();
  std::unique_ptr<GenerationStream> watch;
  std::string session_id;
  // A conversation whose session another node holds runs there
  // (owner_relay.h); one that no node holds is created here.
  if (ShouldRelay(*ctx_, p.target, *caller)) {
    absl::StatusOr<std::optional<Relayed>> relayed =
        RelayToOwner(ctx_, *caller, p.g, p.target, Header(req, "traceparent").value_or(""));
    if (!relayed.ok()) return fail(relayed.status());
    if (*relayed) {
      watch = relays_.Track(std::move((*relayed)->stream));
      node = std::move((*relayed)->node);
      session_id = p.target.session_id;
      res.set_header(kForwardedByHeader, ctx_->node_name);
      call->Add("forwarded_to", node);
    }
  }
  if (!watch) {
    absl::StatusOr<SubmittedGeneration> s =
        SubmitGeneration(*ctx_, *caller, std::move(p.g), p.target);
    if (!s.ok()) return fail(s.status());
    session_id = std::move(s->session_id);
    watch = std::make_unique<JobWatch>(ctx_, std::move(s->job));
  }
  call->Add("prompt_tokens", static_cast<int64_t>(prompt_tokens));
  res.set_header(kNodeHeader, node);
  if (p.conversation) res.set_header(kSessionIdHeader, session_id);
  ResponseBuilder builder(kind, *ctx_->tokenizer, ctx_->model_name, p.out, p.parse);
  if (p.out.stream) {
    auto stream =
        std::make_shared<SseStream>(std::move(call), std::move(in_flight), std::move(watch),
                                    std::move(builder), deadline, session_id);
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [stream](size_t, httplib::DataSink& sink) { return stream->Pump(sink); });
    return;
  }
  // Not streamed: the worker waits for the whole answer, at most the deadline.
  for (;;) {
    session::GenerationEvent ev;
    const GenerationStream::Next next = watch->Wait(&ev, deadline);
    if (next == GenerationStream::Next::kEvent) {
      builder.Add(std::move(ev));
      continue;
    }
    if (next == GenerationStream::Next::kWaiting) {
      watch->Cancel();
      call->Add("session", session_id);
      return fail(absl::DeadlineExceededError("the generation outlived --http-timeout"));
    }
    break;
  }
  const session::GenerationResult& r = watch->result();
  call->Add("session", session_id);
  call->Add("completion_tokens", static_cast<int64_t>(r.completion_tokens));
  call->Add("finish", std::string(session::FinishReasonName(r.finish_reason)));
  if (absl::Status st = Outcome(r); !st.ok()) return fail(st);
  res.set_content(builder.Body(r), kJsonType);
  call->Done(200, "");
}

absl::StatusOr<ChatRenderer> LoadChatRenderer(const ServerConfig& config,
                                              const EmbeddedChatTemplate& embedded) {
  const std::filesystem::path model_config =
      std::filesystem::path(config.model_dir) / "tokenizer_config.json";
  absl::StatusOr<chat::ChatTemplate> model_template =
      embedded.source.empty()
          ? chat::ChatTemplate::FromTokenizerConfig(model_config)
          : chat::ChatTemplate::Parse(embedded.source, embedded.bos_token, embedded.eos_token);
  if (!model_template.ok() && !embedded.source.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--model ", config.model_dir,
                     ": tokenizer.chat_template: ", model_template.status().message()));
  }
  if (!model_template.ok() && !absl::IsNotFound(model_template.status())) {
    return model_template.status();
  }
  std::string text;  // the template's source (or where it lives), to see whether it thinks
  std::optional<chat::ChatTemplate> t;
  if (!config.chat_template.empty()) {
    CORTIQ_ASSIGN_OR_RETURN(text, ReadFlagFile(config.chat_template, "--chat-template"));
    absl::StatusOr<chat::ChatTemplate> parsed =
        chat::ChatTemplate::Parse(text, model_template.ok() ? model_template->bos_token() : "",
                                  model_template.ok() ? model_template->eos_token() : "");
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--chat-template ", config.chat_template, ": ", parsed.status().message()));
    }
    t = *std::move(parsed);
  } else if (model_template.ok()) {
    if (embedded.source.empty()) {
      CORTIQ_ASSIGN_OR_RETURN(text, ReadFlagFile(model_config.string(), "--model"));
    } else {
      text = embedded.source;
    }
    t = *std::move(model_template);
  } else {
    text = std::string(chat::ChatMlTemplate());
    CORTIQ_ASSIGN_OR_RETURN(t, chat::ChatTemplate::Parse(chat::ChatMlTemplate(), "", "<|im_end|>"));
  }
  ChatRenderer r;
  r.thinks = text.find("<think>") != std::string::npos;
  r.render = [t = *std::move(t)](const ChatRequest& c) -> absl::StatusOr<std::string> {
    chat::ChatTemplate::Inputs in;
    in.messages = c.messages;
    in.tools = c.tools;
    in.add_generation_prompt = c.add_generation_prompt;
    in.extra = c.template_kwargs;
    absl::StatusOr<std::string> out = t.Render(in);
    // The template's refusals (raise_exception, a limit) are about the
    // conversation the request sent.
    if (!out.ok())
      return absl::InvalidArgumentError(absl::StrCat("messages: ", out.status().message()));
    return out;
  };
  return r;
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(ServiceContext* ctx,
                                                              ChatRenderer chat) {
  CORTIQ_ASSIGN_OR_RETURN(auto hp, SplitListen(ctx->config->http_listen));
  std::unique_ptr<HttpServer> s(new HttpServer());
  s->impl_ = std::make_unique<Impl>(ctx, std::move(chat));
  CORTIQ_RETURN_IF_ERROR(s->impl_->Init());
  const int port = s->impl_->Bind(hp.first, hp.second);
  if (port <= 0) {
    return absl::UnavailableError(
        absl::StrCat("--http-listen: cannot listen on '", ctx->config->http_listen, "'"));
  }
  s->port_ = port;
  s->thread_ = std::thread([impl = s->impl_.get()] { impl->Run(); });
  spdlog::info("HTTP (OpenAI API) listening on {}:{}{}", hp.first, port,
               ctx->config->tls_cert.empty() ? "" : " (TLS)");
  return s;
}

void HttpServer::Stop() {
  if (!impl_) return;
  impl_->Stop();
  if (thread_.joinable()) thread_.join();
}

HttpServer::~HttpServer() { Stop(); }

}  // namespace cortiq::server::http
