// cortiq-bench-migrate: moving a large session between two servers.
//
//   cortiq-bench-migrate [--shape qwen3-0.6b] [--dtype bf16] [--positions 2400]
//                        [--kv f32|int8] [--f16] [--rounds 3] [--path both|export|migrate]
//
// Two cortiq servers run in this process on 127.0.0.1 (each with its own
// store, engine and gRPC server; they share the mmap'ed checkpoint). A kept
// session on A is filled with `positions` random K/V rows per layer (the
// benchmark is about the wire, not the prefill), then:
//   1. Export from A streamed straight into B's Import (client in the middle):
//      end-to-end bytes/s;
//   2. MigrateSession A → B (A is the client of B): bytes/s, wire bytes
//      against the session's MemoryBytes;
//   3. the pause a conversation sees: the last token of a stream on A to the
//      first token of its continuation on B, with the migration in between.
#include <sys/resource.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/strings/numbers.h"
#include "core/model/random_checkpoint.h"
#include "cortiq/v1/inference.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/server.h"
#include "spdlog/spdlog.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace v1 = cortiq::v1;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// CPU seconds (user + system) this process has used, every thread together:
// both servers, the client in the middle, the kernel's loopback copies.
double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) * 1e-6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

struct Node {
  std::unique_ptr<cortiq::server::Server> server;
  std::unique_ptr<v1::Inference::Stub> stub;
  std::string addr;
};

// `peers`: where its sessions may move (a MigrateSession target must be one).
Node Start(const std::string& dir, std::vector<std::string> peers = {}) {
  cortiq::server::ServerConfig c;
  c.model_dir = dir;
  c.peers = std::move(peers);
  c.listen = "127.0.0.1:0";
  c.metrics_listen = "off";
  c.max_import_bytes = size_t{32} << 30;
  auto s = cortiq::server::Server::Start(c);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.status().message()).c_str());
    std::exit(1);
  }
  Node n;
  n.server = *std::move(s);
  n.addr = "127.0.0.1:" + std::to_string(n.server->port());
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  n.stub = v1::Inference::NewStub(
      grpc::CreateCustomChannel(n.addr, grpc::InsecureChannelCredentials(), args));
  return n;
}

// A kept session on `n` with `positions` random rows in every layer, plus one
// real generated turn (so it has a sampler and a history to continue).
std::string MakeBigSession(Node& n, size_t positions, bool int8) {
  v1::GenerateRequest r;
  r.set_prompt("Call me Ishmael.");
  r.set_max_tokens(4);
  r.set_keep_session(true);
  r.set_ignore_eos(true);
  r.mutable_sampling()->set_temperature(0);
  if (int8) r.mutable_session_config()->set_kv_dtype(v1::KV_DTYPE_INT8);
  grpc::ClientContext ctx;
  auto reader = n.stub->Generate(&ctx, r);
  v1::GenerateResponse m;
  std::string id;
  while (reader->Read(&m)) {
    if (m.has_summary()) id = m.summary().session_id();
  }
  if (!reader->Finish().ok() || id.empty()) std::exit(1);
  auto lease = n.server->store().Acquire(id);
  cortiq::model::SequenceKv& kv = lease->sequence();
  const size_t start = kv.position();
  // Pad the history with token 32 so tokens and cached positions stay
  // consistent (cached = tokens - 1).
  std::vector<int32_t> tokens = (*lease)->tokens();
  const int32_t last = tokens.back();
  tokens.pop_back();
  tokens.insert(tokens.end(), positions, 32);
  tokens.push_back(last);
  if (const absl::Status st =
          (*lease)->RestoreHistory(std::move(tokens), start + positions, (*lease)->detok_pending());
      !st.ok()) {
    std::fprintf(stderr, "synthesise history: %s\n", std::string(st.message()).c_str());
    std::exit(1);
  }
  kv.Reserve(start + positions + 64);
  // Uniform in [-2, 2) from a 64-bit LCG: the bytes only have to be
  // incompressible and finite (std::normal_distribution took longer than
  // the migration it sets up).
  uint64_t state = 1;
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return float(int32_t(state >> 32)) * (2.0f / 2147483648.0f);
  };
  for (size_t l = 0; l < kv.num_layers(); ++l) {
    // The layer's rows so far, extended with the synthetic ones.
    cortiq::kv::LayerKvCache layer = kv.layer(l).cache()->Copy();
    std::vector<float> k(layer.num_kv_heads() * layer.head_dim()), v(k.size());
    for (size_t p = 0; p < positions; ++p) {
      for (auto& x : k) x = next();
      for (auto& x : v) x = next();
      layer.Append(k, v);
    }
    const absl::Status st = kv.layer(l).InstallCache(std::move(layer), start + positions);
    if (!st.ok()) {
      std::fprintf(stderr, "synthesise layer %zu: %s\n", l, std::string(st.message()).c_str());
      std::exit(1);
    }
  }
  (*lease)->PublishMemory();
  return id;
}

std::string Continue(Node& n, const std::string& id, Clock::time_point* first_token) {
  v1::GenerateRequest r;
  r.set_prompt(" Some years ago");
  r.set_max_tokens(4);
  r.set_session_id(id);
  r.set_ignore_eos(true);
  r.mutable_sampling()->set_temperature(0);
  grpc::ClientContext ctx;
  auto reader = n.stub->Generate(&ctx, r);
  v1::GenerateResponse m;
  bool first = true;
  while (reader->Read(&m)) {
    if (m.has_token() && first) {
      *first_token = Clock::now();
      first = false;
    }
  }
  grpc::Status st = reader->Finish();
  if (!st.ok()) std::fprintf(stderr, "continue: %s\n", st.error_message().c_str());
  return id;
}

}  // namespace

int main(int argc, char** argv) {
  std::string shape = "qwen3-0.6b", dtype = "bf16";
  size_t positions = 2400, rounds = 3;
  bool f16 = false, int8 = false;
  std::string path = "both";  // which of the two paths each round runs
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--shape")
      shape = next();
    else if (a == "--dtype")
      dtype = next();
    else if (a == "--positions")
      (void)absl::SimpleAtoi(next(), &positions);
    else if (a == "--rounds")
      (void)absl::SimpleAtoi(next(), &rounds);
    else if (a == "--f16")
      f16 = true;
    else if (a == "--kv")
      int8 = next() == "int8";
    else if (a == "--path")
      path = next();
    else {
      std::fprintf(stderr,
                   "usage: cortiq-bench-migrate [--shape S] [--dtype D] [--positions N] "
                   "[--kv f32|int8] [--f16] [--rounds R] [--path both|export|migrate]\n");
      return 2;
    }
  }
  spdlog::set_level(spdlog::level::warn);
  const std::string dir = "/tmp/cortiq-bench-" + shape + "-" + dtype;
  if (!std::filesystem::exists(dir + "/model.safetensors")) {
    cortiq::model::RandomCheckpointOptions o;
    o.dtype = dtype == "f32" ? cortiq::math::DType::kF32 : cortiq::math::DType::kBF16;
    auto cfg = cortiq::model::NamedShape(shape);
    if (!cfg.ok() || !cortiq::model::WriteRandomCheckpoint(*cfg, dir, o).ok()) return 1;
  }
  Node b = Start(dir), a = Start(dir, {b.addr});
  std::printf("shape %s (%s weights), %zu positions, kv %s, wire %s\n", shape.c_str(),
              dtype.c_str(), positions, int8 ? "int8" : "f32", f16 ? "f16" : "f32");
  std::printf("%-26s %12s %12s %10s %10s %10s %12s\n", "path", "session MB", "wire MB", "seconds",
              "cpu s", "GB/s", "pause ms");
  for (size_t round = 0; round < rounds; ++round) {
    // 1. Export → Import through a client in the middle.
    if (path != "migrate") {
      const std::string id = MakeBigSession(a, positions, int8);
      const double mem = double(a.server->store().Get(id)->memory.total());
      const auto t0 = Clock::now();
      const double cpu0 = CpuSeconds();
      grpc::ClientContext ectx, ictx;
      v1::ExportSessionRequest er;
      er.set_session_id(id);
      er.set_dtype(f16 ? v1::WIRE_DTYPE_F16 : v1::WIRE_DTYPE_F32);
      auto reader = a.stub->ExportSession(&ectx, er);
      v1::ImportSessionResponse ir;
      auto writer = b.stub->ImportSession(&ictx, &ir);
      v1::WireChunk chunk;
      size_t bytes = 0;
      while (reader->Read(&chunk)) {
        bytes += chunk.data().size();
        writer->Write(chunk);
      }
      writer->WritesDone();
      grpc::Status es = reader->Finish(), is = writer->Finish();
      const double s = Seconds(Clock::now() - t0), cpu = CpuSeconds() - cpu0;
      if (!es.ok() || !is.ok()) {
        std::fprintf(stderr, "export/import failed: %s %s\n", es.error_message().c_str(),
                     is.error_message().c_str());
        return 1;
      }
      std::printf("%-26s %12.1f %12.1f %10.3f %10.3f %10.2f %12s\n", "export -> import", mem / 1e6,
                  double(bytes) / 1e6, s, cpu, double(bytes) / s / 1e9, "-");
      a.server->store().Release(id);
      b.server->store().Release(ir.session().session_id());
    }
    // 2. + 3. MigrateSession, inside a conversation.
    if (path != "export") {
      const std::string id = MakeBigSession(a, positions, int8);
      const double mem = double(a.server->store().Get(id)->memory.total());
      Clock::time_point unused, first_on_b;
      Continue(a, id, &unused);
      const auto last_on_a = Clock::now();  // the stream on A has ended
      grpc::ClientContext ctx;
      v1::MigrateSessionRequest mr;
      mr.set_session_id(id);
      mr.set_peer(b.addr);
      mr.set_dtype(f16 ? v1::WIRE_DTYPE_F16 : v1::WIRE_DTYPE_F32);
      v1::MigrateSessionResponse resp;
      const auto t0 = Clock::now();
      const double cpu0 = CpuSeconds();
      grpc::Status st = a.stub->MigrateSession(&ctx, mr, &resp);
      const double s = Seconds(Clock::now() - t0), cpu = CpuSeconds() - cpu0;
      if (!st.ok()) {
        std::fprintf(stderr, "migrate failed: %s\n", st.error_message().c_str());
        return 1;
      }
      Continue(b, resp.peer_session_id(), &first_on_b);
      std::printf("%-26s %12.1f %12.1f %10.3f %10.3f %10.2f %12.1f\n", "MigrateSession", mem / 1e6,
                  double(resp.wire_bytes()) / 1e6, s, cpu, double(resp.wire_bytes()) / s / 1e9,
                  Seconds(first_on_b - last_on_a) * 1e3);
      b.server->store().Release(resp.peer_session_id());
    }
  }
  a.server->Shutdown(std::chrono::milliseconds(0));
  b.server->Shutdown(std::chrono::milliseconds(0));
  return 0;
}
