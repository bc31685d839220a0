// Client: a blocking C++ client for the cortiq.v1.Inference service (and the
// standard grpc.health.v1 health check) with absl::Status errors.
//
// One Client owns one gRPC channel. Connecting is lazy: Connect() validates the
// options and builds the channel; the first call dials the server. Every
// method is thread-safe (gRPC stubs are), blocks until the call ends, and
// returns the server's status code and message unchanged (FromGrpcStatus).
//
// Example:
//   CORTIQ_ASSIGN_OR_RETURN(auto client, Client::Connect({.server = "host:50051"}));
//   cortiq::v1::GenerateRequest req;
//   req.set_prompt("Hello");
//   req.set_max_tokens(16);
//   CORTIQ_ASSIGN_OR_RETURN(cortiq::v1::GenerateSummary summary,
//       client->Generate(req, [](const cortiq::v1::GeneratedToken& t) {
//         std::cout << t.text() << std::flush;
//       }));
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <istream>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cortiq/v1/inference.grpc.pb.h"
#include "cortiq/v1/inference.pb.h"

namespace grpc {
class Channel;
class ClientContext;
class Status;
}  // namespace grpc

namespace cortiq::client {

// Every member has an initializer so that `Connect({.server = "h:1"})` is
// -Wmissing-field-initializers clean.
struct ClientOptions {
  // HOST:PORT (or any gRPC target such as unix:/path).
  std::string server = "127.0.0.1:50051";
  // Bearer token; when non-empty every call carries `authorization: Bearer <token>`.
  std::string token{};
  // TLS with the roots in tls_ca_file (PEM), or the system roots when empty.
  bool tls = false;
  std::string tls_ca_file{};
  // Deadline of every call, measured from its start (a Generate call: the whole
  // stream); 0 = no deadline.
  std::chrono::milliseconds timeout{0};
};

// grpc::Status -> absl::Status with the same code and message. The two code
// enums share their numbering (both follow google.rpc.Code); the only
// conversion between them in the client.
absl::Status FromGrpcStatus(const grpc::Status& status);

// Lets another thread cancel a running Generate (or ExportSession) call. Cancel()
// before the call starts cancels it as soon as it starts; after it ends it is a
// no-op. A token serves one call at a time; it stays cancelled once cancelled.
// Thread-safe.
class CancelToken {
 public:
  void Cancel();
  bool cancelled() const;

 private:
  friend class CancelScope;
  mutable std::mutex mu_;
  grpc::ClientContext* context_ = nullptr;  // the running call's, not owned
  bool cancelled_ = false;
};

// grpc.health.v1.HealthCheckResponse.ServingStatus.
enum class ServingStatus : int {
  kUnknown = 0,
  kServing = 1,
  kNotServing = 2,
  kServiceUnknown = 3,
};
// "SERVING", "NOT_SERVING", ... (the proto enum's names).
const char* ServingStatusName(ServingStatus status);

class Client {
 public:
  // Builds the channel (no network I/O). INVALID_ARGUMENT for an empty server
  // or a negative timeout; NOT_FOUND when tls_ca_file cannot be read.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);

  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  ~Client();

  // Streams a generation: on_token (may be empty) runs on the calling thread
  // for each GeneratedToken in order; the result is the final summary. A stream
  // that ends OK without a summary is INTERNAL. `cancel` (may be null) lets
  // another thread, or on_token itself, end the call early (CANCELLED).
  absl::StatusOr<cortiq::v1::GenerateSummary> Generate(
      const cortiq::v1::GenerateRequest& request,
      const std::function<void(const cortiq::v1::GeneratedToken&)>& on_token,
      CancelToken* cancel = nullptr) const;
  // Generate for a request with n > 1 choices (GeneratedToken.index says
  // whose a token is): every choice's summary, index order — what the
  // server sends as the stream's last messages. INTERNAL when a token
  // follows a summary, or the summaries are not one per choice in order.
  // Generate(request) is GenerateChoices(request)[0].
  absl::StatusOr<std::vector<cortiq::v1::GenerateSummary>> GenerateChoices(
      const cortiq::v1::GenerateRequest& request,
      const std::function<void(const cortiq::v1::GeneratedToken&)>& on_token,
      CancelToken* cancel = nullptr) const;

  absl::StatusOr<cortiq::v1::SessionInfo> CreateSession(
      const cortiq::v1::CreateSessionRequest& request) const;
  absl::StatusOr<cortiq::v1::SessionInfo> GetSession(
      const cortiq::v1::GetSessionRequest& request) const;
  absl::StatusOr<cortiq::v1::ListSessionsResponse> ListSessions(
      const cortiq::v1::ListSessionsRequest& request = {}) const;
  absl::StatusOr<cortiq::v1::ReleaseSessionResponse> ReleaseSession(
      const cortiq::v1::ReleaseSessionRequest& request) const;
  absl::StatusOr<cortiq::v1::TokenizeResponse> Tokenize(
      const cortiq::v1::TokenizeRequest& request) const;
  absl::StatusOr<cortiq::v1::ModelInfo> GetModelInfo(
      const cortiq::v1::GetModelInfoRequest& request = {}) const;

  // Streams a session's wire format: on_chunk runs for each chunk in order; an
  // error from on_chunk cancels the call and is returned. Returns the total
  // bytes received.
  absl::StatusOr<uint64_t> ExportSession(
      const cortiq::v1::ExportSessionRequest& request,
      const std::function<absl::Status(const cortiq::v1::WireChunk&)>& on_chunk,
      CancelToken* cancel = nullptr) const;
  // Sends everything `in` holds, in chunks of 1 MiB, as one ImportSession
  // stream. A read error on `in` cancels the call (nothing is installed).
  absl::StatusOr<cortiq::v1::ImportSessionResponse> ImportSession(std::istream& in) const;
  absl::StatusOr<cortiq::v1::MigrateSessionResponse> MigrateSession(
      const cortiq::v1::MigrateSessionRequest& request) const;
  absl::StatusOr<cortiq::v1::DrainResponse> Drain(const cortiq::v1::DrainRequest& request) const;

  // grpc.health.v1.Health/Check for `service` ("" = the server as a whole).
  // A server without the health service answers UNIMPLEMENTED.
  absl::StatusOr<ServingStatus> Health(const std::string& service = "") const;

  const ClientOptions& options() const { return options_; }

 private:
  Client(ClientOptions options, std::shared_ptr<grpc::Channel> channel);

  // Token metadata and deadline on a fresh context.
  void Configure(grpc::ClientContext& context) const;
  // One unary call: `call(context, response)` returns the grpc::Status.
  // Defined (and only used) in client.cc.
  template <typename Response, typename Call>
  absl::StatusOr<Response> Unary(Call call) const;

  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<cortiq::v1::Inference::Stub> stub_;
};

// The health check's two messages in protobuf wire format, written by hand:
// Debian's gRPC ships no generated grpc.health.v1 code. Exposed for tests.
std::string EncodeHealthCheckRequest(const std::string& service);
// DATA_LOSS for bytes that are not a HealthCheckResponse.
absl::StatusOr<ServingStatus> DecodeHealthCheckResponse(const std::string& bytes);

}  // namespace cortiq::client
