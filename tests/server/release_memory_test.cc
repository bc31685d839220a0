// A released session gives its memory back to the OS, not only to the
// gauges: short sessions' buffers are small heap blocks, which glibc keeps
// resident after they are freed until malloc_trim (Server::TrimFreedMemory,
// on the reaper's tick after sessions are released or spilled). Measured as
// the process's VmRSS: the server runs in this process.
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "cortiq/v1/inference.grpc.pb.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "tests/common/model_test_util.h"
#include "tests/common/rss.h"
#include "tests/common/server_test_util.h"

namespace cortiq::server {
namespace {

using std::chrono::milliseconds;
namespace v1 = ::cortiq::v1;

template <typename Pred>
bool WaitFor(Pred pred, std::chrono::seconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return true;
}

std::string Keep(testing::TestNode& n, size_t prompt_chars, int mode) {
  v1::GenerateRequest r;
  r.set_prompt(std::string(prompt_chars, 'a' + mode) + " Call me Ishmael.");
  r.set_max_tokens(16);
  r.set_ignore_eos(true);
  r.set_keep_session(true);
  testing::SetSessionMode(mode, r.mutable_session_config());
  testing::StreamOut o = testing::RunGenerate(*n.stub, r);
  EXPECT_TRUE(o.status.ok()) << o.status.error_message();
  return o.session;
}

void Release(testing::TestNode& n, const std::string& id) {
  grpc::ClientContext ctx;
  v1::ReleaseSessionRequest req;
  req.set_session_id(id);
  v1::ReleaseSessionResponse resp;
  ASSERT_TRUE(n.stub->ReleaseSession(&ctx, req, &resp).ok());
  EXPECT_TRUE(resp.released());
}

TEST(ReleaseMemoryTest, ReleasedSessionsGiveTheirPagesBackToTheOs) {
  ServerConfig c;
  c.model_dir = testing::TempModel("tiny");
  c.grace = milliseconds(0);
  testing::TestNode n = testing::StartTestNode(c);
  ASSERT_TRUE(n.server);
  // Warm up: one session of each mode made and released (the engine's
  // scratch, gRPC's buffers, the allocator's arenas: what any first call
  // costs), then the baseline once the reaper has trimmed.
  for (int mode = 0; mode < 5; ++mode) Release(n, Keep(n, 300, mode));
  std::this_thread::sleep_for(milliseconds(2500));
  const size_t baseline = testing::RssBytes();

  constexpr int kSessions = 60;
  std::vector<std::string> ids;
  for (int i = 0; i < kSessions; ++i) ids.push_back(Keep(n, 300 + 8 * i, i % 5));
  const size_t held = n.server->store().MemoryByKindTotal().total();
  const size_t peak = testing::RssBytes();
  ASSERT_GT(held, 0u);
  for (const std::string& id : ids) Release(n, id);
  EXPECT_EQ(n.server->store().MemoryByKindTotal().total(), 0u);
  EXPECT_EQ(n.server->store().num_sessions(), 0u);
  if (!testing::kRssIsMeaningful) return;
  // What may stay resident is a quarter of what the sessions held: without
  // the trim all of it stayed (glibc's arenas only shrink from their top).
  const size_t allowed = held / 4;
  size_t after = 0;
  EXPECT_TRUE(WaitFor([&] { return (after = testing::RssBytes()) <= baseline + allowed; },
                      std::chrono::seconds(10)))
      << "resident " << after << " bytes after the release, " << baseline << " before the "
      << kSessions << " sessions (" << peak << " with them), which held " << held << " bytes";
  std::printf("RSS: %zu before, %zu with %d sessions holding %zu bytes, %zu after their release\n",
              baseline, peak, kSessions, held, after);
}

}  // namespace
}  // namespace cortiq::server
