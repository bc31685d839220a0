// HttpServer: the OpenAI-compatible HTTP front of cortiq-server
// (cpp-httplib), beside the gRPC one and sharing its ServiceContext: the same
// model, store, engine, tokens and request plan.
//
// Endpoints: POST /v1/completions, POST /v1/chat/completions (stream: SSE),
// GET /v1/models, GET /v1/models/{model}, GET /health. Request and answer
// shapes: server/http/openai_request.h, openai_response.h; errors:
// api_error.h (401 without a valid bearer token, 404 unknown model or route,
// 405 wrong method, 411 a chunked body or a POST without Content-Length,
// 413 oversize body, 415 a compressed body, 429 admission, 503 draining,
// 500 a handler that threw). A body is read only with its Content-Length
// and uncompressed, as httplib bounds nothing else: the rest is refused
// from its headers, unread, and the connection closed.
//
// Threads: httplib's accept thread and a pool of --http-threads workers,
// one per connection being served; a connection beyond them waits in
// httplib's queue for a free worker. A worker only reads, validates
// (ParseCommon/ParseChat, then session::PlanRequest inside
// SubmitGeneration), submits the job and writes its events as the engine
// produces them: every forward pass runs on the engine's thread. A
// conversation whose session another node holds is relayed to that node
// instead (owner_relay.h: the owner lookup and a gRPC Generate, waited for
// on the worker within the request's deadline), and written through the
// same GenerationStream. Every wait
// is bounded: the body read and each write by the read / write timeouts,
// a generation by --http-timeout (its engine deadline; the wait gives up
// kDeadlineSlack after it), keep-alive by its idle timeout. A failed SSE
// write, or a closed socket seen while a stream waits, cancels the job (its
// one-shot session is released when the engine lets go of it). A request
// that is not streamed notices a vanished client only when its answer is
// written; --http-timeout bounds it. Not bounded here (httplib reads the
// head before any hook, and its connection loop is private): the number of
// header lines, and a client that sends slowly (the read timeout restarts
// at each byte); docs/API.md ("Request bodies") says what to put in front.
//
// Each request writes one request-log line (server/log_format.h: rpc is
// "METHOD /path", code the gRPC code name of its status, http_status, the
// caller, tokens, session; never the prompt text).
//
// Example:
//   CORTIQ_ASSIGN_OR_RETURN(auto http, HttpServer::Start(ctx, renderer));
//   ... http->port() ...
//   http->Stop();  // after the server's Quiesce: in-flight jobs are cancelled
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "server/http/openai_request.h"
#include "server/service.h"

namespace cortiq::server::http {

// The model's chat template, as the chat endpoint uses it.
struct ChatRenderer {
  // Renders a chat request into the prompt text (INVALID_ARGUMENT naming
  // "messages" when the template refuses the conversation).
  std::function<absl::StatusOr<std::string>(const ChatRequest&)> render;
  bool thinks = false;  // the template writes <think> blocks (Qwen3)
};

// A chat template the model file carries itself (a GGUF's
// tokenizer.chat_template) with the text of its bos / eos tokens; an empty
// source: none (a model directory's lives in tokenizer_config.json).
struct EmbeddedChatTemplate {
  std::string source, bos_token, eos_token;
};

// The chat endpoint's template: --chat-template FILE (rendered with the
// model's bos / eos tokens), else the model's own (`embedded`, or
// tokenizer_config.json's "chat_template"), else ChatML
// (chat::ChatMlTemplate). `thinks` when the template's text writes <think>.
// INVALID_ARGUMENT naming --chat-template or the file for a template the
// Jinja subset cannot render (at start-up, not at the first request).
absl::StatusOr<ChatRenderer> LoadChatRenderer(const ServerConfig& config,
                                              const EmbeddedChatTemplate& embedded = {});

class HttpServer {
 public:
  // Binds ctx->config->http_listen (HOST:PORT, [V6]:PORT; port 0 = any free
  // port) with TLS when --tls-cert/--tls-key are set, and serves on its own
  // threads. UNAVAILABLE naming --http-listen when it cannot bind;
  // INVALID_ARGUMENT naming the flag for a malformed address or unusable
  // certificate. `ctx` outlives the server.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(ServiceContext* ctx, ChatRenderer chat);
  ~HttpServer();  // Stop()

  int port() const { return port_; }
  // Stops accepting, closes idle keep-alive connections and joins the
  // workers, waiting for the requests in flight (each bounded, see the
  // banner; the server's Quiesce cancels their jobs first, and this cancels
  // the generations relayed to other nodes). Idempotent.
  void Stop();

  class Impl;

 private:
  HttpServer() = default;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
  std::thread thread_;  // httplib's accept loop (listen_after_bind)
};

}  // namespace cortiq::server::http
