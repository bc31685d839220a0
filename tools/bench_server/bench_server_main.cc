// cortiq-bench-server: the service's overhead and its batching, measured.
//
//   cortiq-bench-server [--shape qwen3-0.6b] [--dtype bf16] [--model DIR]
//                       [--streams 1,4,8,16] [--max-tokens 64] [--prompt-tokens 32]
//                       [--rounds 2] [--threads N]
//
// 1. In-process engine, one stream: decode tokens/s of one job (Engine
//    directly, no gRPC).
// 2. The same request through a real server on 127.0.0.1 (gRPC streaming,
//    client in this process): tokens/s seen by the client; the overhead is
//    1 - server / in-process.
// 3. N concurrent streams for each N: aggregate tokens/s (all tokens / wall
//    time), its ratio to one stream, and time to first token p50 / p99 as the
//    clients see it.
// A random checkpoint of the shape is written to /tmp unless --model is given.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <future>
#include <string>
#include <vector>

#include "core/model/random_checkpoint.h"
#include "core/util/flags.h"
#include "cortiq/v1/inference.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/server.h"
#include "spdlog/spdlog.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace v1 = cortiq::v1;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

struct StreamResult {
  size_t tokens = 0;
  double ttft = 0;        // call start → first token
  double decode_tps = 0;  // (tokens - 1) / (last - first)
  bool ok = false;
};

StreamResult RunStream(v1::Inference::Stub& stub, const v1::GenerateRequest& req) {
  StreamResult r;
  grpc::ClientContext ctx;
  const auto t0 = Clock::now();
  Clock::time_point first, last;
  auto reader = stub.Generate(&ctx, req);
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    if (!msg.has_token()) continue;
    last = Clock::now();
    if (r.tokens++ == 0) first = last;
  }
  grpc::Status st = reader->Finish();
  r.ok = st.ok();
  if (!st.ok()) std::fprintf(stderr, "stream failed: %s\n", st.error_message().c_str());
  r.ttft = Seconds(first - t0);
  if (r.tokens > 1) r.decode_tps = double(r.tokens - 1) / Seconds(last - first);
  return r;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5));
  return v[i];
}

constexpr const char* kUsage =
    "usage: cortiq-bench-server [--shape S] [--dtype f32|bf16] [--model DIR]\n"
    "         [--streams 1,4,8,16] [--max-tokens N] [--prompt-tokens N] [--rounds R]"
    " [--threads N]\n";

}  // namespace

int main(int argc, char** argv) {
  std::string shape = "qwen3-0.6b", dtype = "bf16", model_dir;
  std::vector<size_t> levels = {1, 4, 8, 16};
  size_t max_tokens = 64, prompt_tokens = 32, rounds = 2, threads = 0;
  using cortiq::util::IntFlag;
  using cortiq::util::StringFlag;
  absl::StatusOr<cortiq::util::ParsedArgs> parsed = cortiq::util::ParseFlags(
      {
          StringFlag("shape", &shape),
          StringFlag("dtype", &dtype),
          StringFlag("model", &model_dir),
          cortiq::util::IntListFlag("streams", &levels, "stream count", {.min = 1}),
          IntFlag("max-tokens", &max_tokens),
          IntFlag("prompt-tokens", &prompt_tokens),
          IntFlag("rounds", &rounds),
          IntFlag("threads", &threads),
      },
      std::vector<std::string>(argv + 1, argv + argc),
      {.positionals = cortiq::util::Positionals::kNone});
  if (!parsed.ok()) return cortiq::util::ReportUsageError("cortiq-bench-server", parsed.status());
  if (parsed->help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  rounds = std::max<size_t>(rounds, 1);
  spdlog::set_level(spdlog::level::warn);
  if (model_dir.empty()) {
    model_dir = "/tmp/cortiq-bench-" + shape + "-" + dtype;
    if (!std::filesystem::exists(model_dir + "/model.safetensors")) {
      auto cfg = cortiq::model::NamedShape(shape);
      if (!cfg.ok()) {
        std::fprintf(stderr, "%s\n", std::string(cfg.status().message()).c_str());
        return 1;
      }
      cortiq::model::RandomCheckpointOptions o;
      o.dtype = dtype == "f32" ? cortiq::math::DType::kF32 : cortiq::math::DType::kBF16;
      std::printf("writing a random %s %s checkpoint to %s\n", shape.c_str(), dtype.c_str(),
                  model_dir.c_str());
      if (auto s = cortiq::model::WriteRandomCheckpoint(*cfg, model_dir, o); !s.ok()) {
        std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
        return 1;
      }
    }
  }
  cortiq::server::ServerConfig config;
  config.model_dir = model_dir;
  config.listen = "127.0.0.1:0";
  config.metrics_listen = "off";
  config.threads = threads;
  config.max_batch = 32;
  auto server = cortiq::server::Server::Start(config);
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  auto& srv = **server;
  const auto vocab = srv.model().config().vocab_size;
  std::vector<int32_t> prompt(prompt_tokens);
  for (size_t i = 0; i < prompt_tokens; ++i) prompt[i] = int32_t((i * 7919 + 13) % size_t(vocab));
  std::printf("model %s, %zu math threads, prompt %zu tokens, %zu generated per stream\n",
              model_dir.c_str(), srv.model().pool()->num_threads(), prompt_tokens, max_tokens);

  // 1. In-process: the engine directly.
  std::vector<double> inproc;
  for (size_t r = 0; r < rounds + 1; ++r) {
    auto lease = srv.store().Create(srv.model(), {}, 0);
    cortiq::session::GenerationRequest g;
    g.prompt = prompt;
    g.max_tokens = max_tokens;
    g.sampling.temperature = 0;
    g.ignore_eos = true;
    g.release_at_end = true;
    auto job = srv.engine().Submit(*std::move(lease), g);
    cortiq::session::GenerationEvent ev;
    while ((*job)->WaitPop(&ev)) {
    }
    if (r > 0) inproc.push_back((*job)->result().decode_tokens_per_second);  // r = 0 warms up
  }
  const double inproc_tps = Percentile(inproc, 0.5);

  // 2. and 3. Through gRPC.
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(srv.port()),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::Inference::NewStub(channel);
  v1::GenerateRequest req;
  for (int32_t t : prompt) req.add_prompt_tokens(t);
  req.set_max_tokens(uint32_t(max_tokens));
  req.mutable_sampling()->set_temperature(0);
  req.set_ignore_eos(true);

  std::vector<double> single;
  for (size_t r = 0; r < rounds; ++r) single.push_back(RunStream(*stub, req).decode_tps);
  const double server_tps = Percentile(single, 0.5);
  std::printf("\none stream, decode tokens/s (median of %zu):\n", rounds);
  std::printf("  in-process engine   %8.2f\n", inproc_tps);
  std::printf("  through the server  %8.2f   overhead %.1f%%\n", server_tps,
              100.0 * (1.0 - server_tps / inproc_tps));

  std::printf("\n%8s %14s %10s %12s %12s %10s\n", "streams", "aggregate t/s", "x single",
              "ttft p50 ms", "ttft p99 ms", "per-stream");
  double base = 0;
  for (size_t n : levels) {
    std::vector<double> aggs, ttfts, per;
    for (size_t r = 0; r < rounds; ++r) {
      const auto t0 = Clock::now();
      std::vector<std::future<StreamResult>> fs;
      for (size_t i = 0; i < n; ++i) {
        fs.push_back(std::async(std::launch::async, [&] { return RunStream(*stub, req); }));
      }
      size_t tokens = 0;
      for (auto& f : fs) {
        StreamResult s = f.get();
        tokens += s.tokens;
        ttfts.push_back(s.ttft * 1e3);
        per.push_back(s.decode_tps);
      }
      aggs.push_back(double(tokens) / Seconds(Clock::now() - t0));
    }
    const double agg = Percentile(aggs, 0.5);
    if (base == 0) base = n == 1 ? agg : 0;
    std::printf("%8zu %14.2f %10s %12.1f %12.1f %10.2f\n", n, agg,
                base > 0 ? (std::to_string(agg / base).substr(0, 4) + "x").c_str() : "-",
                Percentile(ttfts, 0.5), Percentile(ttfts, 0.99), Percentile(per, 0.5));
  }
  srv.Shutdown(std::chrono::milliseconds(0));
  return 0;
}
