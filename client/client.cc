// Client: see client.h.
#include "client/client.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <fstream>
#include <future>
#include <iterator>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/util/status_macros.h"

namespace cortiq::client {

namespace v1 = ::cortiq::v1;

namespace {

constexpr char kHealthCheckMethod[] = "/grpc.health.v1.Health/Check";
// WireChunk.data is at most 1 MiB (inference.proto).
constexpr size_t kImportChunkBytes = size_t{1} << 20;

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("tls_ca_file: cannot open ", path));
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return absl::DataLossError(absl::StrCat("tls_ca_file: cannot read ", path));
  return data;
}

std::string ByteBufferToString(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

}  // namespace

absl::Status FromGrpcStatus(const grpc::Status& status) {
  const int code = static_cast<int>(status.error_code());
  // grpc::StatusCode and absl::StatusCode both number google.rpc.Code 0..16.
  if (code < 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return absl::UnknownError(status.error_message());
  }
  return absl::Status(static_cast<absl::StatusCode>(code), status.error_message());
}

// Attaches a call's context to a CancelToken for the lifetime of the call.
// Declared after the ClientContext it points to, so it detaches first.
class CancelScope {
 public:
  CancelScope(CancelToken* token, grpc::ClientContext* context) : token_(token) {
    if (token_ == nullptr) return;
    std::lock_guard<std::mutex> lock(token_->mu_);
    token_->context_ = context;
    if (token_->cancelled_) context->TryCancel();
  }
  ~CancelScope() {
    if (token_ == nullptr) return;
    std::lock_guard<std::mutex> lock(token_->mu_);
    token_->context_ = nullptr;
  }
  CancelScope(const CancelScope&) = delete;
  CancelScope& operator=(const CancelScope&) = delete;

 private:
  CancelToken* token_;
};

void CancelToken::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
  // TryCancel is thread-safe and may run while another thread reads the stream.
  if (context_ != nullptr) context_->TryCancel();
}

bool CancelToken::cancelled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

const char* ServingStatusName(ServingStatus status) {
  switch (status) {
    case ServingStatus::kUnknown:
      return "UNKNOWN";
    case ServingStatus::kServing:
      return "SERVING";
    case ServingStatus::kNotServing:
      return "NOT_SERVING";
    case ServingStatus::kServiceUnknown:
      return "SERVICE_UNKNOWN";
  }
  return "UNKNOWN";
}

std::string EncodeHealthCheckRequest(const std::string& service) {
  // HealthCheckRequest { string service = 1; }: proto3 omits the empty default.
  std::string out;
  if (service.empty()) return out;
  out.push_back(static_cast<char>((1 << 3) | 2));  // field 1, length-delimited
  uint64_t n = service.size();                     // the length as a base-128 varint
  for (; n >= 0x80; n >>= 7) out.push_back(static_cast<char>((n & 0x7f) | 0x80));
  out.push_back(static_cast<char>(n));
  out += service;
  return out;
}

absl::StatusOr<ServingStatus> DecodeHealthCheckResponse(const std::string& bytes) {
  using google::protobuf::internal::WireFormatLite;
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            static_cast<int>(bytes.size()));
  uint64_t status = 0;
  for (uint32_t tag = in.ReadTag(); tag != 0; tag = in.ReadTag()) {
    if (tag == ((1 << 3) | 0)) {  // ServingStatus status = 1 (varint)
      if (!in.ReadVarint64(&status)) {
        return absl::DataLossError("HealthCheckResponse: truncated status");
      }
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      return absl::DataLossError("HealthCheckResponse: malformed field");
    }
  }
  if (!in.ConsumedEntireMessage()) return absl::DataLossError("HealthCheckResponse: malformed");
  // An enum value this client does not know reads as UNKNOWN (as proto3 would
  // after a round trip through an older schema).
  if (status > static_cast<uint64_t>(ServingStatus::kServiceUnknown)) {
    return ServingStatus::kUnknown;
  }
  return static_cast<ServingStatus>(status);
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (options.server.empty()) return absl::InvalidArgumentError("server: empty address");
  if (options.timeout.count() < 0) return absl::InvalidArgumentError("timeout: negative");
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (options.tls) {
    grpc::SslCredentialsOptions ssl;
    if (!options.tls_ca_file.empty()) {
      absl::StatusOr<std::string> pem = ReadWholeFile(options.tls_ca_file);
      if (!pem.ok()) return pem.status();
      ssl.pem_root_certs = *std::move(pem);
    }
    credentials = grpc::SslCredentials(ssl);
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  std::shared_ptr<grpc::Channel> channel = grpc::CreateChannel(options.server, credentials);
  if (channel == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("server: cannot create a channel to ", options.server));
  }
  return std::unique_ptr<Client>(new Client(options, std::move(channel)));
}

Client::Client(ClientOptions options, std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)),
      channel_(std::move(channel)),
      stub_(v1::Inference::NewStub(channel_)) {}

Client::~Client() = default;

void Client::Configure(grpc::ClientContext& context) const {
  if (!options_.token.empty()) context.AddMetadata("authorization", "Bearer " + options_.token);
  if (options_.timeout.count() > 0) {
    context.set_deadline(std::chrono::system_clock::now() + options_.timeout);
  }
}

template <typename Response, typename Call>
absl::StatusOr<Response> Client::Unary(Call call) const {
  grpc::ClientContext context;
  Configure(context);
  Response response;
  grpc::Status status = call(&context, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<v1::GenerateSummary> Client::Generate(
    const v1::GenerateRequest& request,
    const std::function<void(const v1::GeneratedToken&)>& on_token, CancelToken* cancel) const {
  CORTIQ_ASSIGN_OR_RETURN(std::vector<v1::GenerateSummary> summaries,
                          GenerateChoices(request, on_token, cancel));
  return std::move(summaries.front());
}

absl::StatusOr<std::vector<v1::GenerateSummary>> Client::GenerateChoices(
    const v1::GenerateRequest& request,
    const std::function<void(const v1::GeneratedToken&)>& on_token, CancelToken* cancel) const {
  grpc::ClientContext context;
  Configure(context);
  CancelScope scope(cancel, &context);
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      stub_->Generate(&context, request);
  v1::GenerateResponse response;
  std::vector<v1::GenerateSummary> summaries;
  bool out_of_order = false;
  while (reader->Read(&response)) {
    if (response.has_token()) {
      // Read on after a bad message: Finish needs a drained stream.
      out_of_order = out_of_order || !summaries.empty();
      if (on_token && !out_of_order) on_token(response.token());
    } else if (response.has_summary()) {
      out_of_order = out_of_order || response.summary().index() != summaries.size();
      summaries.push_back(std::move(*response.mutable_summary()));
    }
    // A message with neither field (a newer server's event) is skipped.
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) return FromGrpcStatus(status);
  const size_t n = std::max<uint32_t>(request.n(), 1);
  if (summaries.empty()) return absl::InternalError("stream ended without a summary");
  if (out_of_order || summaries.size() != n) {
    return absl::InternalError(absl::StrCat("stream continued after its summary, or sent ",
                                            summaries.size(), " summaries for n = ", n,
                                            " out of index order"));
  }
  return summaries;
}

absl::StatusOr<v1::SessionInfo> Client::CreateSession(
    const v1::CreateSessionRequest& request) const {
  return Unary<v1::SessionInfo>([&](grpc::ClientContext* c, v1::SessionInfo* r) {
    return stub_->CreateSession(c, request, r);
  });
}

absl::StatusOr<v1::SessionInfo> Client::GetSession(const v1::GetSessionRequest& request) const {
  return Unary<v1::SessionInfo>(
      [&](grpc::ClientContext* c, v1::SessionInfo* r) { return stub_->GetSession(c, request, r); });
}

absl::StatusOr<v1::ListSessionsResponse> Client::ListSessions(
    const v1::ListSessionsRequest& request) const {
  return Unary<v1::ListSessionsResponse>([&](grpc::ClientContext* c, v1::ListSessionsResponse* r) {
    return stub_->ListSessions(c, request, r);
  });
}

absl::StatusOr<v1::ReleaseSessionResponse> Client::ReleaseSession(
    const v1::ReleaseSessionRequest& request) const {
  return Unary<v1::ReleaseSessionResponse>(
      [&](grpc::ClientContext* c, v1::ReleaseSessionResponse* r) {
        return stub_->ReleaseSession(c, request, r);
      });
}

absl::StatusOr<v1::TokenizeResponse> Client::Tokenize(const v1::TokenizeRequest& request) const {
  return Unary<v1::TokenizeResponse>([&](grpc::ClientContext* c, v1::TokenizeResponse* r) {
    return stub_->Tokenize(c, request, r);
  });
}

absl::StatusOr<v1::ModelInfo> Client::GetModelInfo(const v1::GetModelInfoRequest& request) const {
  return Unary<v1::ModelInfo>(
      [&](grpc::ClientContext* c, v1::ModelInfo* r) { return stub_->GetModelInfo(c, request, r); });
}

absl::StatusOr<v1::DrainResponse> Client::Drain(const v1::DrainRequest& request) const {
  return Unary<v1::DrainResponse>([&](grpc::ClientContext* c, v1::DrainResponse* r) {
    return stub_->Drain(c, request, r);
  });
}

absl::StatusOr<v1::MigrateSessionResponse> Client::MigrateSession(
    const v1::MigrateSessionRequest& request) const {
  return Unary<v1::MigrateSessionResponse>(
      [&](grpc::ClientContext* c, v1::MigrateSessionResponse* r) {
        return stub_->MigrateSession(c, request, r);
      });
}

absl::StatusOr<uint64_t> Client::ExportSession(
    const v1::ExportSessionRequest& request,
    const std::function<absl::Status(const v1::WireChunk&)>& on_chunk, CancelToken* cancel) const {
  grpc::ClientContext context;
  Configure(context);
  CancelScope scope(cancel, &context);
  std::unique_ptr<grpc::ClientReader<v1::WireChunk>> reader =
      stub_->ExportSession(&context, request);
  v1::WireChunk chunk;
  uint64_t total_bytes = 0;
  absl::Status sink_status;
  while (reader->Read(&chunk)) {
    if (!sink_status.ok()) continue;  // cancelled below; drain what is in flight
    total_bytes += chunk.data().size();
    if (on_chunk) sink_status = on_chunk(chunk);
    if (!sink_status.ok()) context.TryCancel();
  }
  grpc::Status status = reader->Finish();
  if (!sink_status.ok()) return sink_status;
  if (!status.ok()) return FromGrpcStatus(status);
  return total_bytes;
}

absl::StatusOr<v1::ImportSessionResponse> Client::ImportSession(std::istream& in) const {
  grpc::ClientContext context;
  Configure(context);
  v1::ImportSessionResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::WireChunk>> writer =
      stub_->ImportSession(&context, &response);
  std::string buffer(kImportChunkBytes, '\0');
  v1::WireChunk chunk;
  bool read_failed = false;
  while (true) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const std::streamsize n = in.gcount();
    if (in.bad()) {
      read_failed = true;
      context.TryCancel();  // the server must not install a partial session
      break;
    }
    if (n > 0) {
      chunk.set_data(buffer.data(), static_cast<size_t>(n));
      // false: the stream is broken; Finish below returns why.
      if (!writer->Write(chunk)) break;
    }
    if (!in) break;  // end of input
  }
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  if (read_failed) return absl::DataLossError("import: reading the input failed");
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<ServingStatus> Client::Health(const std::string& service) const {
  grpc::GenericStub stub(channel_);
  grpc::ClientContext context;
  Configure(context);
  const std::string request_bytes = EncodeHealthCheckRequest(service);
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  // The generic stub only has the callback form for unary calls; wait for it.
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, kHealthCheckMethod, grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  grpc::Status status = done.get_future().get();
  if (!status.ok()) return FromGrpcStatus(status);
  return DecodeHealthCheckResponse(ByteBufferToString(response));
}

}  // namespace cortiq::client
