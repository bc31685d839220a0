// cortiq-server: serves a model over gRPC (cortiq.v1.Inference) with
// Prometheus metrics. Flags: cortiq-server --help (server/config.h).
// SIGTERM / SIGINT drain the server (see Server::Shutdown) and exit 0;
// SIGHUP re-reads the token file (--auth-tokens) and keeps serving.
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "core/math/kernels.h"
#include "core/util/flags.h"
#include "server/config.h"
#include "server/log_format.h"
#include "server/server.h"
#include "spdlog/spdlog.h"

int main(int argc, char** argv) {
  using cortiq::server::ServerConfig;
  std::vector<std::string> args(argv + 1, argv + argc);
  bool help = false;
  absl::StatusOr<ServerConfig> config = cortiq::server::ParseServerFlags(args, &help);
  if (help) {
    std::fputs(cortiq::server::ServerUsage().c_str(), stdout);
    return 0;
  }
  if (!config.ok()) return cortiq::util::ReportUsageError("cortiq-server", config.status());
  spdlog::set_level(spdlog::level::from_str(config->log_level));
  cortiq::server::ConfigureLogging(config->log_format == "json" ? cortiq::server::LogFormat::kJson
                                                                : cortiq::server::LogFormat::kText);

  // Signals are taken synchronously by this thread: block them before any
  // other thread starts, so every thread inherits the mask.
  // A session file that would pass the process's file size limit fails
  // its write (EFBIG), which the persister counts and survives, instead of
  // killing the process.
  signal(SIGXFSZ, SIG_IGN);
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGUSR1);  // a Drain RPC has finished: stop
  sigaddset(&signals, SIGHUP);   // re-read --auth-tokens
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto server = cortiq::server::Server::Start(*config);
  if (!server.ok()) {
    std::fprintf(stderr, "cortiq-server: %s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  const std::string host = config->listen.substr(0, config->listen.rfind(':'));
  spdlog::info("serving {} on {}:{} (metrics: {}; kernels {}, activations {})", config->model_dir,
               host, (*server)->port(),
               (*server)->metrics_port()
                   ? host + ":" + std::to_string((*server)->metrics_port()) + "/metrics"
                   : std::string("off"),
               (*server)->kernel_tier(), (*server)->model().bf16_activations() ? "bf16" : "f32");
  if (cortiq::math::ActiveIsa() == cortiq::math::Isa::kAmx && !cortiq::math::Q8AmxVerified()) {
    spdlog::warn(
        "the AMX-INT8 kernel disagreed with the int8 definition on its start-up check; int8 "
        "weights run on VPDPBUSD instead (the same results, slower prefill)");
  }
  // A machine-readable line for scripts and tests.
  std::printf("listening on %s:%d metrics %d\n", host.c_str(), (*server)->port(),
              (*server)->metrics_port());
  // The HTTP front's port on a line of its own (the line above keeps the
  // shape scripts already parse).
  if ((*server)->http_port() != 0) {
    const std::string& h = config->http_listen;
    std::printf("http listening on %s:%d\n", h.substr(0, h.rfind(':')).c_str(),
                (*server)->http_port());
  }
  std::fflush(stdout);

  (*server)->SetAfterDrain([] { kill(getpid(), SIGUSR1); });

  // sigwait takes each signal on this thread, as an ordinary return: the
  // reload runs here, not in a signal handler, so it may read files, lock
  // and log.
  int sig = 0;
  while (sigwait(&signals, &sig) == 0 && sig == SIGHUP) {
    (void)(*server)->ReloadAuth();  // logs its outcome; a bad file keeps the old tokens
  }
  spdlog::info("{}: draining (grace {} ms)", sig == SIGUSR1 ? "drain request" : strsignal(sig),
               config->grace.count());
  // Drain: stop new work, let streams finish, move every kept session to a
  // peer; then stop. The exit status says whether every session moved.
  const cortiq::server::DrainReport report = (*server)->Drain(config->grace);
  (*server)->Shutdown(std::chrono::milliseconds(0));
  if (report.failed > 0) {
    spdlog::error("{} session(s) could not be migrated (see above); exiting with status 3",
                  report.failed);
    return 3;
  }
  return 0;
}
