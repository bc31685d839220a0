// cortiq-bench-server: the service's overhead, its batching, and the cost of
// the cluster's forwarding, measured.
//
//   cortiq-bench-server [--shape qwen3-0.6b] [--dtype bf16] [--model DIR]
//                       [--streams 1,4,8,16] [--max-tokens 64] [--prompt-tokens 32]
//                       [--rounds 2] [--threads N] [--max-batch 32] [--step-tokens N[,N...]]
//                       [--prefill-chunk N] [--aging-steps N] [--tenant-weights T=W,...]
//                       [--sustained K] [--weights checkpoint|int8] [--page-pool BYTES]
//                       [--hop | --cluster 3 | --chat-turns 10 | --long-prompt 2000 | --tenants]
//
// The scheduler's settings (--max-batch, --step-tokens, --prefill-chunk,
// --aging-steps, --tenant-weights; issue 19) go to every server this bench
// starts (ApplySchedulerFlags), and to the in-process engine of
// --long-prompt and --tenants.
//
// Without a mode flag, one server:
// 1. In-process engine, one stream: decode tokens/s of one job (Engine
//    directly, no gRPC).
// 2. The same request through a real server on 127.0.0.1 (gRPC streaming,
//    client in this process): tokens/s seen by the client; the overhead is
//    1 - server / in-process.
// 3. N concurrent streams for each N, all released at once: aggregate
//    tokens/s (all tokens / wall time), its ratio to one stream, time to
//    first token p50 / p99 as the clients see it, and the p50's ratio to the
//    one-stream time to first token of 2.
// 4. With --sustained K: the same client counts as a steady load (each client
//    sends its next request when the last one ends, the clients' starts
//    spread over one request's time; RunSustained): time to first token
//    p50 / p99 and aggregate tokens/s of that steady state.
//
// --hop: one extra hop. Two nodes A and B in this process, peers of each
// other; two kept sessions on B, fed the same greedy turns, one turn after
// the other for --rounds rounds: one session's turns go to B directly, the
// other's to A, which forwards them to B. Decode tokens/s, ms per token and
// time to first token, direct against proxied, and the first proxied call's
// owner lookup on its own. Both sessions hold the same history at every
// round, so the two paths must stream the same tokens (checked).
//
// --cluster N: N nodes in this process, all peers, against one node with the
// same math threads in total. For each client count C in --streams: C
// clients, client i's session on node i % N, its turns sent to node
// (i + 1) % N (every turn is forwarded one hop); each round all C clients
// run one greedy turn on their kept session at once. Aggregate tokens/s and
// time to first token p50 / p99, side by side with the same C clients on
// one node (sessions there, turns sent there).
//
// --chat-turns N: a scripted chat of N turns on one node; every turn sends
// the whole ChatML conversation so far (a user message of ~--prompt-tokens
// tokens, then the assistant's reply of --max-tokens greedy tokens, as text),
// once with reuse_prefix on one named session (create_if_missing) and once
// to a fresh one-shot session that prefills all of it. Time to first token
// per turn, side by side, and turn N's ratio.
//
// --long-prompt N and --tenants run an engine in this process (no gRPC:
// the scheduler's choice of rows is what they measure; scheduler_bench.h):
// --long-prompt N: the largest --streams count (8 without --streams) of
// streams decode; once all do, an N-token prompt arrives: its time to first
// token and the streams' inter-token latency during its prefill and outside,
// for each --step-tokens value (one engine per value). --tenants: tenant
// flood (the same count of clients, resubmitting) against tenant light (one
// client now and then): light's time to first token alone and under the
// flood, and each tenant's share of generated and prompt tokens, both
// backlogged, against --tenant-weights (default flood=1,light=1).
//
// A random checkpoint of the shape is written to /tmp unless --model is given.
// Every node loads it (the file is mmap'ed: the page cache is shared, each
// node's converted weights are not).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include "core/model/random_checkpoint.h"
#include "core/util/flags.h"
#include "cortiq/v1/inference.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/server.h"
#include "server/session_router.h"
#include "spdlog/spdlog.h"
#include "tools/bench_server/scheduler_bench.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace v1 = cortiq::v1;

// Every client call's deadline: far beyond any turn of the shapes benched,
// so that a wedged node ends the bench with DEADLINE_EXCEEDED instead of
// hanging it.
constexpr auto kCallDeadline = std::chrono::minutes(10);

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// CPU seconds (user + system) this process has used, every thread together:
// the nodes, the clients, the kernel's loopback copies. Unlike wall time it
// hardly moves with what else the machine runs, so it shows a small cost
// (the relay's) that the wall-clock figures of a shared machine bury. It
// includes the math pools' spinning (ThreadPool: up to 200 us after each job).
double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) * 1e-6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

struct StreamResult {
  size_t tokens = 0;
  double ttft = 0;        // call start → first token
  double decode_tps = 0;  // (tokens - 1) / (last - first)
  double decode_s = 0;    // last - first
  double cpu_s = 0;       // the process's CPU seconds over the call (CpuSeconds)
  bool ok = false;
  std::vector<int32_t> ids;  // the streamed token ids
  std::string text;          // the streamed text
  std::string node;          // x-cortiq-node: the node that served the call
  v1::Usage usage;           // the summary's
  Clock::time_point start;                 // the call's start
  std::vector<Clock::time_point> arrived;  // each token's arrival
};

std::string InitialMetadata(const grpc::ClientContext& ctx, std::string_view key) {
  const auto& md = ctx.GetServerInitialMetadata();
  auto it = md.find(grpc::string_ref(key.data(), key.size()));
  return it == md.end() ? "" : std::string(it->second.data(), it->second.size());
}

StreamResult RunStream(v1::Inference::Stub& stub, const v1::GenerateRequest& req) {
  StreamResult r;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
  const double cpu0 = CpuSeconds();
  const auto t0 = Clock::now();
  r.start = t0;
  Clock::time_point first, last;
  auto reader = stub.Generate(&ctx, req);
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    if (msg.has_summary()) r.usage = msg.summary().usage();
    if (!msg.has_token()) continue;
    last = Clock::now();
    r.arrived.push_back(last);
    if (r.tokens++ == 0) first = last;
    r.ids.push_back(msg.token().token_id());
    r.text += msg.token().text();
  }
  grpc::Status st = reader->Finish();
  r.ok = st.ok();
  if (!st.ok()) std::fprintf(stderr, "stream failed: %s\n", st.error_message().c_str());
  r.ttft = Seconds(first - t0);
  r.cpu_s = CpuSeconds() - cpu0;
  r.decode_s = Seconds(last - first);
  if (r.tokens > 1) r.decode_tps = double(r.tokens - 1) / r.decode_s;
  r.node = InitialMetadata(ctx, "x-cortiq-node");
  return r;
}

using cortiq::tools::Percentile;

constexpr const char* kUsage =
    "usage: cortiq-bench-server [--shape S] [--dtype f32|bf16] [--model DIR]\n"
    "         [--streams 1,4,8,16] [--max-tokens N] [--prompt-tokens N] [--rounds R]"
    " [--threads N]\n"
    "         [--max-batch N] [--step-tokens N[,N...]] [--prefill-chunk N] [--aging-steps N]\n"
    "         [--tenant-weights T=W,...] [--sustained K] [--weights checkpoint|int8]\n"
    "         [--page-pool BYTES]\n"
    "         [--hop | --cluster N | --chat-turns N | --long-prompt N | --tenants]\n"
    "  --weights    the servers' weights, as cortiq-server --weights (not the in-process modes)\n"
    "  --page-pool  the servers' --page-pool (default 256M; 0 = off)\n"
    "  --sustained K  after the burst table, N clients each sending K requests back to back\n"
    "               (after one unmeasured), their starts spread over one request's time:\n"
    "               time to first token and throughput of a steady load\n"
    "  --max-batch, --step-tokens, --prefill-chunk, --aging-steps, --tenant-weights: the\n"
    "               scheduler's settings, for every server started and the in-process engine\n"
    "               (the server's defaults when not given; a list of step budgets only with\n"
    "               --long-prompt)\n"
    "  --hop        one extra hop: turns through node A forwarded to node B, against B directly\n"
    "  --cluster N  N nodes, clients and sessions spread over them, against one node\n"
    "               (client counts from --streams)\n"
    "  --chat-turns N  an N-turn chat resending the whole conversation each turn: time to\n"
    "               first token with reuse_prefix on one session against a fresh session\n"
    "  --long-prompt N  in-process engine: the largest --streams count (8 without --streams)\n"
    "               of streams decode, then an N-token prompt arrives: its time to first token,\n"
    "               the streams' inter-token latency during its prefill and outside, per\n"
    "               --step-tokens value\n"
    "  --tenants    in-process engine: tenant flood (that many clients resubmitting) against\n"
    "               tenant light (one client now and then): light's time to first token alone\n"
    "               and under the flood, each tenant's share of tokens against --tenant-weights\n"
    "               (default flood=1,light=1)\n";

// What every mode shares: the checkpoint, the request's shape, the rounds.
struct BenchOptions {
  std::string model_dir;
  std::vector<int32_t> prompt;  // filled once the vocabulary is known
  size_t prompt_tokens = 32;
  size_t max_tokens = 64;
  size_t rounds = 2;
  size_t threads = 0;  // math threads; 0 = every core
  std::vector<size_t> levels;
  size_t sustained = 0;  // requests per client of the sustained-load table (0: none)
  // Every server's starting configuration: the scheduler's fields set
  // (ApplySchedulerFlags), the rest the defaults.
  cortiq::server::ServerConfig server;
};

// The checkpoint to serve: `model_dir` when given, else a random one of
// `shape` written to /tmp (kept for the next run).
absl::StatusOr<std::string> PrepareModel(const std::string& shape, const std::string& dtype,
                                         std::string model_dir) {
  if (!model_dir.empty()) return model_dir;
  model_dir = "/tmp/cortiq-bench-" + shape + "-" + dtype;
  if (std::filesystem::exists(model_dir + "/model.safetensors")) return model_dir;
  auto cfg = cortiq::model::NamedShape(shape);
  if (!cfg.ok()) return cfg.status();
  cortiq::model::RandomCheckpointOptions o;
  o.dtype = dtype == "f32" ? cortiq::math::DType::kF32 : cortiq::math::DType::kBF16;
  std::printf("writing a random %s %s checkpoint to %s\n", shape.c_str(), dtype.c_str(),
              model_dir.c_str());
  if (auto s = cortiq::model::WriteRandomCheckpoint(*cfg, model_dir, o); !s.ok()) return s;
  return model_dir;
}

std::vector<int32_t> MakePrompt(size_t n, int64_t vocab) {
  std::vector<int32_t> prompt(n);
  for (size_t i = 0; i < n; ++i) prompt[i] = int32_t((i * 7919 + 13) % size_t(vocab));
  return prompt;
}

// The CPU's name as lscpu prints it ("model name" in /proc/cpuinfo).
std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
  }
  return "unknown CPU";
}

size_t Cores() { return std::max(1u, std::thread::hardware_concurrency()); }

// ---------------------------------------------------------------------------
// One server: the in-process engine, one stream, N streams.

// 4. (--sustained K) A steady load of N clients, as a serving benchmark's
// "max concurrency N" runs it: each client sends a request as soon as its
// previous one ends. Started together, N clients of equal requests would stay
// in lockstep (all prefilled in one step, all ending in the same step): the
// burst of the table above, over and over. So client i starts i / N of a
// request's time after client 0, that time taken from the burst's aggregate
// at N (N x max_tokens / aggregate), and its first request is not measured.
// Then K requests each: time to first token p50 / p99 over all of them, and
// the aggregate over the window in which every client is in its measured
// requests (tokens that arrived in it / its length).
void RunSustained(v1::Inference::Stub& stub, const v1::GenerateRequest& req,
                  const BenchOptions& opt, const std::vector<std::pair<size_t, double>>& burst_agg,
                  double base, double single_ttft_ms) {
  std::printf("\nsustained load: each client sends %zu requests back to back after one unmeasured,"
              "\nclient starts spread over one request's time\n",
              opt.sustained);
  std::printf("%8s %14s %10s %12s %12s %13s %9s\n", "clients", "aggregate t/s", "x single",
              "ttft p50 ms", "ttft p99 ms", "ttft x single", "requests");
  for (const auto& [n, agg_burst] : burst_agg) {
    if (n < 2 || agg_burst <= 0) continue;
    const double request_s = double(n * opt.max_tokens) / agg_burst;
    const auto t0 = Clock::now();
    std::vector<std::future<std::vector<StreamResult>>> fs;
    for (size_t i = 0; i < n; ++i) {
      fs.push_back(std::async(std::launch::async, [&, i] {
        std::this_thread::sleep_until(
            t0 + std::chrono::duration_cast<Clock::duration>(
                     std::chrono::duration<double>(request_s * double(i) / double(n))));
        std::vector<StreamResult> out;
        (void)RunStream(stub, req);  // the ramp: not measured
        for (size_t k = 0; k < opt.sustained; ++k) out.push_back(RunStream(stub, req));
        return out;
      }));
    }
    std::vector<std::vector<StreamResult>> clients;
    for (auto& f : fs) clients.push_back(f.get());
    // The window: from the last client's first measured start to the first
    // client's last measured end.
    Clock::time_point w0 = Clock::time_point::min(), w1 = Clock::time_point::max();
    std::vector<double> ttfts;
    size_t failed = 0;
    for (const auto& c : clients) {
      w0 = std::max(w0, c.front().start);
      w1 = std::min(w1, c.back().arrived.empty() ? c.back().start : c.back().arrived.back());
      for (const auto& s : c) {
        failed += s.ok ? 0 : 1;
        ttfts.push_back(s.ttft * 1e3);
      }
    }
    size_t in_window = 0;
    for (const auto& c : clients) {
      for (const auto& s : c) {
        for (const auto& t : s.arrived) in_window += t >= w0 && t <= w1 ? 1 : 0;
      }
    }
    const double window_s = Seconds(w1 - w0);
    const double agg = window_s > 0 ? double(in_window) / window_s : 0;
    std::printf("%8zu %14.2f %10s %12.1f %12.1f %12.2fx %9zu%s\n", n, agg,
                base > 0 ? (std::to_string(agg / base).substr(0, 4) + "x").c_str() : "-",
                Percentile(ttfts, 0.5), Percentile(ttfts, 0.99),
                Percentile(ttfts, 0.5) / single_ttft_ms, ttfts.size(),
                window_s > 0 ? "" : "  (no common window: raise --sustained)");
    if (failed > 0) std::printf("  %zu requests failed\n", failed);
  }
}

int RunServerBench(BenchOptions opt) {
  cortiq::server::ServerConfig config = opt.server;
  config.model_dir = opt.model_dir;
  config.listen = "127.0.0.1:0";
  config.metrics_listen = "off";
  config.threads = opt.threads;
  auto server = cortiq::server::Server::Start(config);
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  auto& srv = **server;
  const std::vector<int32_t> prompt =
      MakePrompt(opt.prompt_tokens, srv.model().config().vocab_size);
  std::printf(
      "model %s, %zu math threads, prompt %zu tokens, %zu generated per stream; max batch %zu, "
      "prefill chunk %zu\n",
      opt.model_dir.c_str(), srv.model().pool()->num_threads(), opt.prompt_tokens, opt.max_tokens,
      config.max_batch, config.prefill_chunk);

  // 1. In-process: the engine directly.
  std::vector<double> inproc;
  for (size_t r = 0; r < opt.rounds + 1; ++r) {
    auto lease = srv.store().Create(srv.model(), {}, 0);
    cortiq::session::GenerationRequest g;
    g.prompt = prompt;
    g.max_tokens = opt.max_tokens;
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
  req.set_max_tokens(uint32_t(opt.max_tokens));
  req.mutable_sampling()->set_temperature(0);
  req.set_ignore_eos(true);

  // One call first, not counted: it opens the channel's connection, which
  // no other call pays (and which would inflate the one-stream TTFT).
  (void)RunStream(*stub, req);
  std::vector<double> single, single_ttft;
  for (size_t r = 0; r < opt.rounds; ++r) {
    const StreamResult s = RunStream(*stub, req);
    single.push_back(s.decode_tps);
    single_ttft.push_back(s.ttft * 1e3);
  }
  const double server_tps = Percentile(single, 0.5);
  const double single_ttft_ms = Percentile(single_ttft, 0.5);
  std::printf("\none stream, decode tokens/s (median of %zu):\n", opt.rounds);
  std::printf("  in-process engine   %8.2f\n", inproc_tps);
  std::printf("  through the server  %8.2f   overhead %.1f%%\n", server_tps,
              100.0 * (1.0 - server_tps / inproc_tps));

  std::printf("  one stream's time to first token (p50): %.1f ms\n", single_ttft_ms);

  // Each level's streams are released together (a latch), so their prompts
  // reach the server at once: the time to first token under load.
  std::printf("\n%8s %14s %10s %12s %12s %13s %10s\n", "streams", "aggregate t/s", "x single",
              "ttft p50 ms", "ttft p99 ms", "ttft x single", "per-stream");
  double base = 0;
  std::vector<std::pair<size_t, double>> burst_agg;  // (streams, aggregate t/s)
  for (size_t n : opt.levels) {
    std::vector<double> aggs, ttfts, per;
    for (size_t r = 0; r < opt.rounds; ++r) {
      std::latch ready(ptrdiff_t(n) + 1);
      std::vector<std::future<StreamResult>> fs;
      for (size_t i = 0; i < n; ++i) {
        fs.push_back(std::async(std::launch::async, [&] {
          ready.arrive_and_wait();
          return RunStream(*stub, req);
        }));
      }
      const auto t0 = Clock::now();
      ready.arrive_and_wait();
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
    burst_agg.emplace_back(n, agg);
    if (base == 0) base = n == 1 ? agg : 0;
    std::printf("%8zu %14.2f %10s %12.1f %12.1f %12.2fx %10.2f\n", n, agg,
                base > 0 ? (std::to_string(agg / base).substr(0, 4) + "x").c_str() : "-",
                Percentile(ttfts, 0.5), Percentile(ttfts, 0.99),
                Percentile(ttfts, 0.5) / single_ttft_ms, Percentile(per, 0.5));
  }
  std::printf("ttft x single: a level's ttft p50 over the one stream's above (same server)\n");
  if (opt.sustained > 0) RunSustained(*stub, req, opt, burst_agg, base, single_ttft_ms);
  srv.Shutdown(std::chrono::milliseconds(0));
  return 0;
}

// ---------------------------------------------------------------------------
// Nodes of a cluster in this process.

// A loopback port nobody listens on now (the kernel's pick, released for a
// node to take): every node's peers must be named before any node starts.
// Another process may take it in between; Start then fails naming the
// address, and the bench says so.
absl::StatusOr<int> FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket() failed");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  close(fd);
  if (!ok) return absl::InternalError("no free loopback port");
  return int(ntohs(a.sin_port));
}

std::string Addr(int port) { return "127.0.0.1:" + std::to_string(port); }

struct Node {
  std::string name;
  std::unique_ptr<cortiq::server::Server> server;
  std::unique_ptr<v1::Inference::Stub> stub;  // a client's channel to the node
};

// `count` nodes named a, b, c, ..., every one a peer of all the others,
// each with `threads` math threads (threads[i] for node i).
absl::StatusOr<std::vector<Node>> StartNodes(const BenchOptions& opt,
                                             const std::vector<size_t>& threads) {
  const size_t count = threads.size();
  std::vector<int> ports;
  for (size_t i = 0; i < count; ++i) {
    absl::StatusOr<int> p = FreePort();
    if (!p.ok()) return p.status();
    ports.push_back(*p);
  }
  std::vector<Node> nodes(count);
  for (size_t i = 0; i < count; ++i) {
    cortiq::server::ServerConfig c = opt.server;
    c.model_dir = opt.model_dir;
    c.listen = Addr(ports[i]);
    c.metrics_listen = "off";
    c.threads = threads[i];
    c.node_name = std::string(1, char('a' + i));
    for (size_t j = 0; j < count; ++j) {
      if (j != i) c.peers.push_back(Addr(ports[j]));
    }
    auto s = cortiq::server::Server::Start(c);
    if (!s.ok()) return s.status();
    nodes[i].name = c.node_name;
    nodes[i].server = *std::move(s);
    nodes[i].stub =
        v1::Inference::NewStub(grpc::CreateChannel(c.listen, grpc::InsecureChannelCredentials()));
  }
  return nodes;
}

void StopNodes(std::vector<Node>& nodes) {
  for (Node& n : nodes) n.server->Shutdown(std::chrono::milliseconds(0));
  nodes.clear();
}

// An empty kept session (the server's default configuration) on `stub`'s node.
absl::StatusOr<std::string> CreateSession(v1::Inference::Stub& stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
  v1::SessionInfo info;
  const grpc::Status st = stub.CreateSession(&ctx, v1::CreateSessionRequest(), &info);
  if (!st.ok()) return absl::UnavailableError("CreateSession: " + st.error_message());
  return info.session_id();
}

void ReleaseSession(v1::Inference::Stub& stub, const std::string& id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
  v1::ReleaseSessionRequest req;
  req.set_session_id(id);
  v1::ReleaseSessionResponse resp;
  (void)stub.ReleaseSession(&ctx, req, &resp);  // best effort: the nodes stop next
}

// One greedy turn on kept session `id`: the prompt appended, max_tokens
// generated (no early end of sequence).
v1::GenerateRequest TurnRequest(const BenchOptions& opt, const std::string& id) {
  v1::GenerateRequest req;
  for (int32_t t : opt.prompt) req.add_prompt_tokens(t);
  req.set_max_tokens(uint32_t(opt.max_tokens));
  req.mutable_sampling()->set_temperature(0);
  req.set_ignore_eos(true);
  req.set_session_id(id);
  return req;
}

// The kept sessions grow by a turn (prompt + generated tokens) each round,
// the warm-up round included: they must stay within the model's context.
absl::Status CheckContext(const BenchOptions& opt, const cortiq::server::Server& any) {
  const size_t context = size_t(any.model().config().max_position_embeddings);
  const size_t needed = (opt.rounds + 1) * (opt.prompt_tokens + opt.max_tokens);
  if (needed <= context) return absl::OkStatus();
  return absl::InvalidArgumentError(
      "--rounds: (rounds + 1) x (prompt-tokens + max-tokens) = " + std::to_string(needed) +
      " positions on one kept session, beyond the model's context of " + std::to_string(context) +
      ": lower --rounds, --prompt-tokens or --max-tokens");
}

// The line every cluster figure carries: where it was measured.
void PrintMachine(const cortiq::server::Server& any) {
  std::printf("CPU %s, %zu cores; kernels %s; %s activations\n", CpuModelName().c_str(), Cores(),
              any.kernel_tier(), any.model().bf16_activations() ? "bf16" : "f32");
}

// ---------------------------------------------------------------------------
// --hop: the same turns on B directly and through A.

// One path's turns. The per-token figure is every turn's decode time over
// every turn's decoded tokens (tokens after the first): a mean, so that
// tokens/s and ms/token are one figure seen two ways (the medians of the
// two, over an even count, are of different turns).
struct PathStats {
  double decode_s = 0, cpu_s = 0;
  size_t decode_tokens = 0, tokens = 0;
  std::vector<double> ms_per_token, ttft_ms;  // per turn
  void Add(const StreamResult& s) {
    if (s.tokens < 2) return;
    decode_s += s.decode_s;
    cpu_s += s.cpu_s;
    tokens += s.tokens;
    decode_tokens += s.tokens - 1;
    ms_per_token.push_back(1e3 * s.decode_s / double(s.tokens - 1));
    ttft_ms.push_back(s.ttft * 1e3);
  }
  double MsPerToken() const { return decode_tokens ? 1e3 * decode_s / double(decode_tokens) : 0; }
  double TokensPerSecond() const { return decode_s > 0 ? double(decode_tokens) / decode_s : 0; }
  // The process's CPU time per streamed token, prefill included (the whole turn).
  double CpuMsPerToken() const { return tokens ? 1e3 * cpu_s / double(tokens) : 0; }
  void Print(const char* label) const {
    std::printf("%-18s %12.2f %10.3f %12.1f %12.1f %12.3f   %.3f - %.3f\n", label,
                TokensPerSecond(), MsPerToken(), Percentile(ttft_ms, 0.5),
                Percentile(ttft_ms, 0.99), CpuMsPerToken(), Percentile(ms_per_token, 0),
                Percentile(ms_per_token, 1));
  }
};

int RunHopBench(BenchOptions opt) {
  // B does the math; A only relays, so one math thread is all it needs.
  auto started = StartNodes(opt, {1, opt.threads});
  if (!started.ok()) {
    std::fprintf(stderr, "start nodes: %s\n", std::string(started.status().message()).c_str());
    return 1;
  }
  std::vector<Node>& nodes = *started;
  Node& a = nodes[0];
  Node& b = nodes[1];
  opt.prompt = MakePrompt(opt.prompt_tokens, b.server->model().config().vocab_size);
  if (absl::Status s = CheckContext(opt, *b.server); !s.ok()) {
    return cortiq::util::ReportUsageError("cortiq-bench-server", s);
  }
  PrintMachine(*b.server);
  std::printf(
      "one extra hop: node a forwards to node b, which holds the sessions "
      "(b: %zu math threads, a: %zu)\n"
      "model %s, each turn: %zu prompt tokens, %zu generated, greedy, on a kept session\n",
      b.server->model().pool()->num_threads(), a.server->model().pool()->num_threads(),
      opt.model_dir.c_str(), opt.prompt_tokens, opt.max_tokens);

  absl::StatusOr<std::string> direct_id = CreateSession(*b.stub);
  absl::StatusOr<std::string> proxied_id = CreateSession(*b.stub);
  if (!direct_id.ok() || !proxied_id.ok()) {
    std::fprintf(stderr, "%s\n",
                 std::string((direct_id.ok() ? proxied_id : direct_id).status().message()).c_str());
    return 1;
  }
  auto turn = [&](bool proxied) {
    return RunStream(proxied ? *a.stub : *b.stub,
                     TurnRequest(opt, proxied ? *proxied_id : *direct_id));
  };
  // A turn that failed, was served by a node other than b, or streamed other
  // tokens than its twin on the other path: the figures would be of
  // something else.
  auto check = [&](const StreamResult& s, const char* path) {
    if (s.ok && s.node == b.name) return true;
    std::fprintf(stderr, "%s turn: %s (served by '%s')\n", path, s.ok ? "wrong node" : "failed",
                 s.node.c_str());
    return false;
  };

  // Round 0 warms both paths up and is not counted; its proxied turn is the
  // one that finds the owner (a asks its peers; later turns use the cached
  // owner, for SessionRouter::kOwnerCacheTtl).
  cortiq::server::SessionRouter& router = *a.server->context().router;
  const size_t lookups_before = router.lookups_started();
  const StreamResult first_direct = turn(false);
  const StreamResult first_proxied = turn(true);
  if (!check(first_direct, "direct") || !check(first_proxied, "proxied")) return 1;
  const size_t lookups_first = router.lookups_started() - lookups_before;

  PathStats direct, proxied;
  size_t identical = first_direct.ids == first_proxied.ids ? 1 : 0;
  for (size_t r = 0; r < opt.rounds; ++r) {
    // Alternate which path goes first, so that a drift (the history grows,
    // the machine's other load changes) falls on both alike.
    StreamResult d, p;
    if (r % 2 == 0) {
      d = turn(false);
      p = turn(true);
    } else {
      p = turn(true);
      d = turn(false);
    }
    if (!check(d, "direct") || !check(p, "proxied")) return 1;
    direct.Add(d);
    proxied.Add(p);
    if (d.ids == p.ids) ++identical;
  }
  const size_t lookups_total = router.lookups_started() - lookups_before;

  const double d_ms = direct.MsPerToken(), p_ms = proxied.MsPerToken();
  const double d_t50 = Percentile(direct.ttft_ms, 0.5), p_t50 = Percentile(proxied.ttft_ms, 0.5);
  const double d_t99 = Percentile(direct.ttft_ms, 0.99), p_t99 = Percentile(proxied.ttft_ms, 0.99);
  std::printf(
      "\nrounds: %zu, one turn per path each (decode: all turns' time / their tokens; "
      "ttft over %zu turns)\n",
      opt.rounds, opt.rounds);
  std::printf("%-18s %12s %10s %12s %12s %12s   %s\n", "", "decode t/s", "ms/token", "ttft p50 ms",
              "ttft p99 ms", "CPU ms/tok", "ms/token per turn, min - max");
  direct.Print("direct (b)");
  proxied.Print("proxied (a -> b)");
  std::printf("%-18s %11.3fx %9.3fx %11.3fx %11.3fx %11.3fx\n", "proxied / direct",
              proxied.TokensPerSecond() / direct.TokensPerSecond(), p_ms / d_ms, p_t50 / d_t50,
              p_t99 / d_t99, proxied.CpuMsPerToken() / direct.CpuMsPerToken());
  std::printf(
      "overhead of the hop: %+.3f ms per token, %+.1f ms time to first token (p50), "
      "%+.3f CPU ms per token\n",
      p_ms - d_ms, p_t50 - d_t50, proxied.CpuMsPerToken() - direct.CpuMsPerToken());
  std::printf(
      "first turn through a (owner lookup included): ttft %.1f ms, direct first turn %.1f ms; "
      "lookups a made: %zu on the first turn, %zu in all\n",
      first_proxied.ttft * 1e3, first_direct.ttft * 1e3, lookups_first, lookups_total);
  std::printf("same tokens on both paths: %zu of %zu turns\n", identical, opt.rounds + 1);

  ReleaseSession(*b.stub, *direct_id);
  ReleaseSession(*b.stub, *proxied_id);
  StopNodes(nodes);
  return identical == opt.rounds + 1 ? 0 : 1;
}

// ---------------------------------------------------------------------------
// --cluster N: clients and sessions spread over N nodes, against one node.

struct LoadResult {
  double agg_tps = 0;  // median over the rounds of all tokens / the round's wall time
  double ttft_p50_ms = 0, ttft_p99_ms = 0;
  double cpu_ms_per_token = 0;      // the process's CPU time over the counted rounds / their tokens
  size_t forwarded = 0, turns = 0;  // turns served by a node other than the one called
};

// `clients` clients; client i's session is created on nodes[i % N] and its
// turns go to nodes[(i + shift) % N]. One round (not counted) warms up and
// makes the forwarding nodes find the owners; then opt.rounds rounds of one
// concurrent turn per client.
absl::StatusOr<LoadResult> RunLoad(const BenchOptions& opt, std::vector<Node>& nodes,
                                   size_t clients, size_t shift) {
  const size_t n = nodes.size();
  std::vector<std::string> ids(clients);
  for (size_t i = 0; i < clients; ++i) {
    absl::StatusOr<std::string> id = CreateSession(*nodes[i % n].stub);
    if (!id.ok()) return id.status();
    ids[i] = *id;
  }
  LoadResult out;
  std::vector<double> aggs, ttfts;
  double cpu_s = 0;
  size_t counted_tokens = 0;
  for (size_t r = 0; r < opt.rounds + 1; ++r) {
    const double cpu0 = CpuSeconds();
    const auto t0 = Clock::now();
    std::vector<std::future<StreamResult>> fs;
    for (size_t i = 0; i < clients; ++i) {
      fs.push_back(std::async(std::launch::async, [&, i] {
        return RunStream(*nodes[(i + shift) % n].stub, TurnRequest(opt, ids[i]));
      }));
    }
    size_t tokens = 0;
    bool ok = true;
    for (size_t i = 0; i < clients; ++i) {
      StreamResult s = fs[i].get();
      ok = ok && s.ok;
      tokens += s.tokens;
      if (r == 0) continue;
      ttfts.push_back(s.ttft * 1e3);
      ++out.turns;
      if (s.node != nodes[(i + shift) % n].name) ++out.forwarded;
    }
    if (!ok) return absl::UnavailableError("a turn failed (see above)");
    if (r == 0) continue;
    aggs.push_back(double(tokens) / Seconds(Clock::now() - t0));
    cpu_s += CpuSeconds() - cpu0;
    counted_tokens += tokens;
  }
  for (size_t i = 0; i < clients; ++i) ReleaseSession(*nodes[i % n].stub, ids[i]);
  // Every turn sent away from its owner must have been forwarded, and none
  // sent to it: else the figures are of another setup.
  const size_t expected = shift % n == 0 ? 0 : out.turns;
  if (out.forwarded != expected) {
    return absl::InternalError(std::to_string(out.forwarded) + " of " + std::to_string(out.turns) +
                               " turns served by another node than " + "the one called, expected " +
                               std::to_string(expected));
  }
  out.agg_tps = Percentile(aggs, 0.5);
  out.cpu_ms_per_token = counted_tokens ? 1e3 * cpu_s / double(counted_tokens) : 0;
  out.ttft_p50_ms = Percentile(ttfts, 0.5);
  out.ttft_p99_ms = Percentile(ttfts, 0.99);
  return out;
}

// RunLoad at every client count of opt.levels, on `nodes`; `what` names
// the setup in an error.
absl::StatusOr<std::vector<LoadResult>> RunLevels(const BenchOptions& opt, std::vector<Node>& nodes,
                                                  size_t shift, const std::string& what) {
  std::vector<LoadResult> out;
  for (size_t c : opt.levels) {
    absl::StatusOr<LoadResult> r = RunLoad(opt, nodes, c, shift);
    if (!r.ok()) {
      return absl::Status(r.status().code(), what + ", " + std::to_string(c) +
                                                 " clients: " + std::string(r.status().message()));
    }
    out.push_back(*r);
  }
  return out;
}

int RunClusterBench(BenchOptions opt, size_t count) {
  // The same math threads in all: the one node gets them all, each of the
  // N nodes its share (at least one).
  const size_t total = opt.threads > 0 ? opt.threads : Cores();
  const size_t each = std::max<size_t>(1, total / count);
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 1;
  };
  absl::StatusOr<std::vector<LoadResult>> single, forwarded, to_owner;
  {
    auto one = StartNodes(opt, {total});
    if (!one.ok()) return fail(one.status());
    opt.prompt = MakePrompt(opt.prompt_tokens, (*one)[0].server->model().config().vocab_size);
    if (absl::Status s = CheckContext(opt, *(*one)[0].server); !s.ok()) {
      return cortiq::util::ReportUsageError("cortiq-bench-server", s);
    }
    PrintMachine(*(*one)[0].server);
    std::printf(
        "%zu nodes in this process, all peers, against one node; model %s\n"
        "each turn: %zu prompt tokens, %zu generated, greedy, on the client's kept session;\n"
        "client i's session lives on node i %% %zu, and its turns are sent\n"
        "  forwarded: to node (i+1) %% %zu, which forwards every one of them to the owner\n"
        "  to owner:  to node i %% %zu itself (no forwarding: what the spread alone costs)\n"
        "math threads: one node %zu; %zu per node of the %zu (%zu in all on %zu cores%s)\n",
        count, opt.model_dir.c_str(), opt.prompt_tokens, opt.max_tokens, count, count, count, total,
        each, count, each * count, Cores(),
        each * count > Cores() ? ": the nodes share the cores" : "");
    single = RunLevels(opt, *one, 0, "one node");
    StopNodes(*one);
    if (!single.ok()) return fail(single.status());
  }
  {
    auto nodes = StartNodes(opt, std::vector<size_t>(count, each));
    if (!nodes.ok()) return fail(nodes.status());
    forwarded = RunLevels(opt, *nodes, 1, "forwarded");
    if (forwarded.ok()) to_owner = RunLevels(opt, *nodes, 0, "to owner");
    StopNodes(*nodes);
    if (!forwarded.ok()) return fail(forwarded.status());
    if (!to_owner.ok()) return fail(to_owner.status());
  }

  std::printf(
      "\nrounds: %zu per client count (aggregate: the median round; ttft over every client's "
      "turns)\n",
      opt.rounds);
  std::printf("%8s  %-22s %12s %11s %11s %11s %11s %10s\n", "clients", "setup", "agg t/s",
              "x one node", "ttft p50", "ttft p99", "CPU ms/tok", "forwarded");
  const std::string cluster = std::to_string(count) + " nodes, ";
  for (size_t i = 0; i < opt.levels.size(); ++i) {
    const double base = (*single)[i].agg_tps;
    auto row = [&](const std::string& setup, const LoadResult& r) {
      std::printf("%8zu  %-22s %12.2f %10.2fx %9.1fms %9.1fms %11.2f %6zu/%-4zu\n", opt.levels[i],
                  setup.c_str(), r.agg_tps, r.agg_tps / base, r.ttft_p50_ms, r.ttft_p99_ms,
                  r.cpu_ms_per_token, r.forwarded, r.turns);
    };
    row("one node", (*single)[i]);
    row(cluster + "forwarded", (*forwarded)[i]);
    row(cluster + "to owner", (*to_owner)[i]);
  }
  return 0;
}

// ---------------------------------------------------------------------------
// --chat-turns N: a scripted chat, with and without reuse_prefix.

// A user message of about `tokens` tokens (words of the byte model's and
// BPE vocabularies alike), different each turn.
std::string UserMessage(size_t turn, size_t tokens) {
  static const char* const kWords[] = {"call",  "me",   "ish", "mael", "some", "years", "ago",
                                       "never", "mind", "how", "long", "sea",  "ship",  "whale"};
  std::string m = "turn " + std::to_string(turn) + ":";
  while (m.size() < tokens) m += std::string(" ") + kWords[(m.size() * 7 + turn) % 14];
  return m.substr(0, tokens);
}

int RunChatBench(BenchOptions opt, size_t turns) {
  auto nodes = StartNodes(opt, {opt.threads > 0 ? opt.threads : Cores()});
  if (!nodes.ok()) {
    std::fprintf(stderr, "%s\n", std::string(nodes.status().message()).c_str());
    return 1;
  }
  Node& n = (*nodes)[0];
  const size_t context = size_t(n.server->engine().max_context());
  // ChatML markers, the user's text and the reply, per turn (markers: at
  // most 16 tokens even spelled out byte by byte).
  const size_t needed = turns * (opt.prompt_tokens + opt.max_tokens + 32);
  if (needed > context) {
    StopNodes(*nodes);
    return cortiq::util::ReportUsageError(
        "cortiq-bench-server",
        absl::InvalidArgumentError(
            "--chat-turns: turns x (prompt-tokens + max-tokens + 32) = " + std::to_string(needed) +
            " positions on one session, beyond the model's context of " + std::to_string(context) +
            ": lower --chat-turns, --prompt-tokens or --max-tokens"));
  }
  PrintMachine(*n.server);
  std::printf(
      "a %zu-turn chat on model %s; each turn sends the whole ChatML conversation so far\n"
      "(user message of ~%zu tokens, the assistant's reply of %zu generated greedy tokens)\n"
      "  reuse:    one named session, reuse_prefix (only what the session lacks is prefilled)\n"
      "  no reuse: a fresh one-shot session per turn, the whole conversation prefilled\n\n",
      turns, opt.model_dir.c_str(), opt.prompt_tokens, opt.max_tokens);
  v1::GenerateRequest base;
  base.set_max_tokens(uint32_t(opt.max_tokens));
  base.mutable_sampling()->set_temperature(0);
  base.set_ignore_eos(true);
  v1::GenerateRequest reuse = base;
  reuse.set_session_id("00000000000000000000000000c4a7be");
  reuse.set_create_if_missing(true);
  reuse.set_reuse_prefix(true);
  std::printf("%5s %8s %8s %14s %14s %8s\n", "turn", "prompt", "cached", "ttft reuse ms",
              "ttft fresh ms", "ratio");
  std::string conversation;
  size_t same = 0;
  double last_ratio = 0;
  for (size_t t = 1; t <= turns; ++t) {
    conversation += "<|im_start|>user\n" + UserMessage(t, opt.prompt_tokens) +
                    "<|im_end|>\n<|im_start|>assistant\n";
    base.set_prompt(conversation);
    reuse.set_prompt(conversation);
    const StreamResult fresh = RunStream(*n.stub, base);
    const StreamResult kept = RunStream(*n.stub, reuse);
    if (!fresh.ok || !kept.ok) {
      StopNodes(*nodes);
      return 1;
    }
    same += kept.ids == fresh.ids ? 1 : 0;
    last_ratio = fresh.ttft / kept.ttft;
    std::printf("%5zu %8u %8u %14.2f %14.2f %7.2fx\n", t, kept.usage.prompt_tokens(),
                kept.usage.cached_tokens(), kept.ttft * 1e3, fresh.ttft * 1e3, last_ratio);
    conversation += kept.text + "<|im_end|>\n";
  }
  std::printf("\nturn %zu: time to first token %.2fx shorter with reuse_prefix\n", turns,
              last_ratio);
  std::printf("same replies with and without reuse: %zu of %zu turns\n", same, turns);
  StopNodes(*nodes);
  return 0;
}

// ---------------------------------------------------------------------------
// Issue 19: the one place the bench sets the server's scheduler fields
// (the server's own flag checks do not run on a config built in code: the
// chunk-within-budget rule is checked here).
absl::Status ApplySchedulerFlags(const cortiq::tools::SchedulerFlags& f,
                                 cortiq::server::ServerConfig& c) {
  c.max_batch = f.max_batch;
  if (f.prefill_chunk) c.prefill_chunk = *f.prefill_chunk;
  if (f.step_tokens.size() > 1) {
    return absl::InvalidArgumentError(
        "--step-tokens: one value, except with --long-prompt (one engine per value)");
  }
  if (!f.step_tokens.empty()) c.step_tokens = f.step_tokens[0];
  if (f.aging_steps) c.aging_steps = *f.aging_steps;
  if (f.tenant_weights) c.tenant_weights = *f.tenant_weights;
  if (c.prefill_chunk > c.step_tokens) {
    return absl::InvalidArgumentError("--prefill-chunk: above --step-tokens");
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  std::string shape = "qwen3-0.6b", dtype = "bf16", model_dir;
  BenchOptions opt;
  opt.levels = {1, 4, 8, 16};
  bool hop = false;
  size_t cluster = 0;
  size_t chat_turns = 0;
  size_t long_prompt = 0;
  bool tenants = false;
  cortiq::tools::SchedulerFlags sched;
  using cortiq::util::IntFlag;
  using cortiq::util::StringFlag;
  absl::StatusOr<cortiq::util::ParsedArgs> parsed = cortiq::util::ParseFlags(
      {
          StringFlag("shape", &shape),
          StringFlag("dtype", &dtype),
          StringFlag("model", &model_dir),
          cortiq::util::IntListFlag("streams", &opt.levels, "stream count", {.min = 1}),
          IntFlag("max-tokens", &opt.max_tokens),
          IntFlag("prompt-tokens", &opt.prompt_tokens),
          IntFlag("rounds", &opt.rounds),
          IntFlag("threads", &opt.threads),
          IntFlag("sustained", &opt.sustained, {.min = 1, .max = 1000}),
          cortiq::util::ChoiceFlag("weights", &opt.server.weights, {"checkpoint", "int8"}),
          cortiq::util::BytesFlag("page-pool", &opt.server.page_pool_bytes),
          cortiq::util::SwitchFlag("hop", &hop),
          IntFlag("cluster", &cluster, {.min = 2, .max = 26}),
          IntFlag("chat-turns", &chat_turns, {.min = 1, .max = 1000}),
          IntFlag("long-prompt", &long_prompt, {.min = 1}),
          cortiq::util::SwitchFlag("tenants", &tenants),
          IntFlag("max-batch", &sched.max_batch, {.min = 1}),
          cortiq::util::IntListFlag("step-tokens", &sched.step_tokens, "step budget", {.min = 1}),
          IntFlag("prefill-chunk", &sched.prefill_chunk, {.min = 1}),
          IntFlag("aging-steps", &sched.aging_steps, {.min = 1}),
          cortiq::util::ParsedFlag("tenant-weights", &sched.tenant_weights,
                                   [](std::string_view v) {
                                     return cortiq::server::ParseTenantWeights("--tenant-weights",
                                                                               v);
                                   }),
      },
      std::vector<std::string>(argv + 1, argv + argc),
      {.positionals = cortiq::util::Positionals::kNone});
  if (!parsed.ok()) return cortiq::util::ReportUsageError("cortiq-bench-server", parsed.status());
  if (parsed->help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (int(hop) + int(cluster > 0) + int(chat_turns > 0) + int(long_prompt > 0) + int(tenants) > 1) {
    return cortiq::util::ReportUsageError(
        "cortiq-bench-server",
        absl::InvalidArgumentError("--hop, --cluster, --chat-turns, --long-prompt and --tenants "
                                   "are five benchmarks: give one"));
  }
  opt.rounds = std::max<size_t>(opt.rounds, 1);
  const bool in_process = long_prompt > 0 || tenants;
  if (tenants && sched.step_tokens.size() > 1) {
    return cortiq::util::ReportUsageError(
        "cortiq-bench-server",
        absl::InvalidArgumentError("--step-tokens: one value with --tenants"));
  }
  if (!in_process) {
    if (absl::Status s = ApplySchedulerFlags(sched, opt.server); !s.ok()) {
      return cortiq::util::ReportUsageError("cortiq-bench-server", s);
    }
  }
  spdlog::set_level(spdlog::level::warn);
  absl::StatusOr<std::string> dir = PrepareModel(shape, dtype, model_dir);
  if (!dir.ok()) {
    std::fprintf(stderr, "%s\n", std::string(dir.status().message()).c_str());
    return 1;
  }
  opt.model_dir = *dir;
  if (hop) return RunHopBench(std::move(opt));
  if (cluster > 0) return RunClusterBench(std::move(opt), cluster);
  if (chat_turns > 0) return RunChatBench(std::move(opt), chat_turns);
  if (in_process) {
    cortiq::tools::SchedulerBenchOptions so;
    so.model_dir = opt.model_dir;
    so.threads = opt.threads;
    so.prompt_tokens = opt.prompt_tokens;
    so.max_tokens = opt.max_tokens;
    so.rounds = opt.rounds;
    so.streams =
        parsed->Given("streams") ? *std::max_element(opt.levels.begin(), opt.levels.end()) : 8;
    so.flags = sched;
    // As a server would run it: the server's prefill chunk, not the engine's.
    if (!so.flags.prefill_chunk) so.flags.prefill_chunk = opt.server.prefill_chunk;
    return long_prompt > 0 ? cortiq::tools::RunLongPromptBench(so, long_prompt)
                           : cortiq::tools::RunTenantsBench(so);
  }
  return RunServerBench(std::move(opt));
}
