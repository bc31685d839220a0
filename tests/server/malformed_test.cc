// Requests that do not parse, sent as raw bytes (grpc::GenericStub) to every
// method of cortiq.v1.Inference on a real server: each gets INVALID_ARGUMENT
// naming the RPC and the message type, is counted in
// cortiq_requests_total{rpc,code="INVALID_ARGUMENT"} and leaves one log line.
// Without the bearer token the same bytes get UNAUTHENTICATED (the token is
// checked first); well-formed requests still work (a Generate after the
// garbage).
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "google/protobuf/descriptor.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/log_format.h"
#include "server/server.h"
#include "spdlog/spdlog.h"
#include "tests/common/log_capture.h"
#include "tests/common/model_test_util.h"
#include "tests/common/prom_text.h"
#include "tests/common/raw_call.h"
#include "tests/common/server_test_util.h"

namespace cortiq::server {
namespace {

namespace v1 = ::cortiq::v1;

// Bytes no protobuf message parses from: a length-delimited field 1 that
// claims 5 bytes and has 2, a varint that never ends, a field with wire
// type 7 (there is none).
const std::vector<std::string>& Garbage() {
  static const std::vector<std::string> g = {std::string("\x0a\x05"
                                                         "ab",
                                                         4),
                                             std::string(11, '\xff'), std::string("\x0f", 1)};
  return g;
}

using testing::CaptureSink;

using testing::CallRaw;

struct RawNode {
  std::unique_ptr<Server> server;
  std::unique_ptr<grpc::GenericStub> stub;
};

RawNode StartRawNode(const std::string& token = "") {
  ServerConfig c;
  c.model_dir = testing::TempModel("tiny");
  c.listen = "127.0.0.1:0";
  c.metrics_listen = "127.0.0.1:0";
  c.threads = 1;
  c.grace = std::chrono::milliseconds(0);
  c.auth_token = token;
  auto s = Server::Start(c);
  EXPECT_TRUE(s.ok()) << s.status();
  RawNode n;
  if (!s.ok()) return n;
  n.server = *std::move(s);
  n.stub = std::make_unique<grpc::GenericStub>(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(n.server->port()), grpc::InsecureChannelCredentials()));
  return n;
}

const google::protobuf::ServiceDescriptor& Service() {
  const auto* s = google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
      v1::Inference::service_full_name());
  EXPECT_NE(s, nullptr);
  return *s;
}

std::string Path(const google::protobuf::MethodDescriptor& m) {
  return "/" + m.service()->full_name() + "/" + m.name();
}

// The message type a method's (client) messages must parse as.
std::string RequestType(const google::protobuf::MethodDescriptor& m) {
  return m.input_type()->full_name();
}

TEST(MalformedTest, EveryRpcAnswersInvalidArgumentNamingRpcAndTypeCountedAndLogged) {
  auto sink = std::make_shared<CaptureSink>();
  const std::shared_ptr<spdlog::logger> saved = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("", sink));
  ConfigureLogging(LogFormat::kText);

  RawNode n = StartRawNode();
  ASSERT_NE(n.server, nullptr);
  const google::protobuf::ServiceDescriptor& service = Service();
  ASSERT_EQ(service.method_count(), 11);
  for (int i = 0; i < service.method_count(); ++i) {
    const google::protobuf::MethodDescriptor& m = *service.method(i);
    // ImportSession's messages are chunks: its "request" is a WireChunk.
    const std::string type = m.name() == "ImportSession" ? "cortiq.v1.WireChunk" : RequestType(m);
    for (const std::string& bytes : Garbage()) {
      SCOPED_TRACE(m.name() + " with " + std::to_string(bytes.size()) + " bytes");
      const grpc::Status st = CallRaw(*n.stub, Path(m), {bytes});
      EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
      const std::string want_prefix = m.name() + ": ";
      EXPECT_EQ(st.error_message().rfind(want_prefix, 0), 0u) << st.error_message();
      EXPECT_NE(st.error_message().find("not a " + type + " (" + std::to_string(bytes.size()) +
                                        " bytes do not parse)"),
                std::string::npos)
          << st.error_message();
    }
  }

  // A well-formed request still works through the raw entry points.
  v1::GenerateRequest ok_request;
  ok_request.set_prompt("hello");
  ok_request.set_max_tokens(3);
  auto typed = v1::Inference::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(n.server->port()), grpc::InsecureChannelCredentials()));
  const testing::StreamOut out = testing::RunGenerate(*typed, ok_request);
  EXPECT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_GT(out.ids.size(), 0u);

  // A Generate is counted when its reactor is done, which gRPC may run just
  // after the client has its status: scrape until it shows (at most 5 s).
  testing::Exposition e;
  for (int tries = 0; tries < 100; ++tries) {
    e = testing::Parse(testing::HttpGet(n.server->metrics_port()));
    if (e.Value("cortiq_requests_total", {{"rpc", "Generate"}, {"code", "OK"}}) == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (int i = 0; i < service.method_count(); ++i) {
    const std::string rpc = service.method(i)->name();
    EXPECT_EQ(e.Value("cortiq_requests_total", {{"rpc", rpc}, {"code", "INVALID_ARGUMENT"}}),
              static_cast<double>(Garbage().size()))
        << rpc;
  }
  EXPECT_EQ(e.Value("cortiq_requests_total", {{"rpc", "Generate"}, {"code", "OK"}}), 1);
  n.server->Shutdown(std::chrono::milliseconds(0));

  // One line per refused call, naming the RPC and the code. A Generate's
  // line is written when its reactor is done, which gRPC may run after the
  // client has its status: Shutdown above has waited for every stream.
  const std::vector<std::string> lines = sink->Lines();
  for (int i = 0; i < service.method_count(); ++i) {
    const std::string rpc = service.method(i)->name();
    size_t refused = 0;
    for (const std::string& l : lines) {
      if (l.find(" rpc=" + rpc + " code=INVALID_ARGUMENT") != std::string::npos &&
          l.find("bytes do not parse") != std::string::npos) {
        ++refused;
      }
    }
    EXPECT_EQ(refused, Garbage().size()) << rpc;
  }
  spdlog::set_default_logger(saved);
  ConfigureLogging(LogFormat::kText);
}

TEST(MalformedTest, WithoutTheTokenGarbageIsUnauthenticated) {
  RawNode n = StartRawNode("s3cret");
  ASSERT_NE(n.server, nullptr);
  const google::protobuf::ServiceDescriptor& service = Service();
  for (int i = 0; i < service.method_count(); ++i) {
    const google::protobuf::MethodDescriptor& m = *service.method(i);
    SCOPED_TRACE(m.name());
    EXPECT_EQ(CallRaw(*n.stub, Path(m), {Garbage()[0]}).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    const grpc::Status st = CallRaw(*n.stub, Path(m), {Garbage()[0]}, "s3cret");
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  }
}

// proto3 forbids invalid UTF-8 in a string field: such a request does not
// parse either.
TEST(MalformedTest, InvalidUtf8InAStringFieldIsInvalidArgument) {
  RawNode n = StartRawNode();
  ASSERT_NE(n.server, nullptr);
  const std::string bytes("\x0a\x02\xff\xfe", 4);  // session_id (1): 2 bytes, not UTF-8
  const grpc::Status st = CallRaw(*n.stub, "/cortiq.v1.Inference/GetSession", {bytes});
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(st.error_message(),
            "GetSession: the request is not a cortiq.v1.GetSessionRequest (4 bytes do not parse)");
}

// Server reflection still describes the service (its methods are raw on
// the server, typed in the descriptors reflection serves).
TEST(MalformedTest, ReflectionStillDescribesTheService) {
  RawNode n = StartRawNode();
  ASSERT_NE(n.server, nullptr);
  // ServerReflectionRequest{file_containing_symbol (4): "cortiq.v1.Inference"}
  const std::string symbol = v1::Inference::service_full_name();
  std::string request = "\x22";
  request += static_cast<char>(symbol.size());
  request += symbol;
  std::string replies;
  const grpc::Status st =
      CallRaw(*n.stub, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", {request},
              "", &replies);
  EXPECT_TRUE(st.ok()) << st.error_message();
  for (const char* name : {"GenerateRequest", "MigrateSession", "Drain", "WireChunk"}) {
    EXPECT_NE(replies.find(name), std::string::npos) << name;
  }
}

}  // namespace
}  // namespace cortiq::server
