// One gRPC call made with raw bytes, whatever the method's streaming shape:
// for tests that send what a typed stub cannot (garbage, hand-built
// WireChunk encodings).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace cortiq::testing {

// Calls `method` ("/cortiq.v1.Inference/ImportSession") on `stub` with each
// of `messages` as one raw message (stopping at the first write the server
// refuses), half-closes, appends every reply's bytes to *replies (if given)
// until the server ends the stream, and returns the call's status. `token`:
// a bearer token to send; the call's deadline is `timeout` from now.
inline grpc::Status CallRaw(grpc::GenericStub& stub, const std::string& method,
                            const std::vector<std::string>& messages,
                            const std::string& token = "", std::string* replies = nullptr,
                            std::chrono::seconds timeout = std::chrono::seconds(20)) {
  grpc::CompletionQueue cq;
  grpc::Status status;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    auto call = stub.PrepareCall(&ctx, method, &cq);
    auto wait = [&cq] {  // one operation in flight at a time: its outcome
      void* tag;
      bool ok = false;
      return cq.Next(&tag, &ok) && ok;
    };
    call->StartCall(nullptr);
    bool ok = wait();
    for (const std::string& m : messages) {
      if (!ok) break;
      grpc::Slice slice(m);
      call->Write(grpc::ByteBuffer(&slice, 1), nullptr);
      ok = wait();
    }
    if (ok) {
      call->WritesDone(nullptr);
      ok = wait();
    }
    grpc::ByteBuffer reply;
    while (ok) {  // the replies, if any, until the stream ends
      call->Read(&reply, nullptr);
      ok = wait();
      std::vector<grpc::Slice> slices;
      if (ok && replies != nullptr && reply.Dump(&slices).ok()) {
        for (const grpc::Slice& sl : slices) replies->append(sl.begin(), sl.end());
      }
    }
    call->Finish(&status, nullptr);
    wait();
  }
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

}  // namespace cortiq::testing
