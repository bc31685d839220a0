// Roles and tenants, as units (server/auth.h): the token file's format and
// its errors (file and line named, no field ever quoted), the lookup (every
// token found, near misses not), on-behalf-of, the permission table, and
// the reload that keeps the old table when the new file is bad.
#include "server/auth.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/metrics.h"

namespace cortiq::server {
namespace {

constexpr char kAlice[] = "alice-token-0123456789";
constexpr char kBob[] = "bob-token-0123456789ab";
constexpr char kOps[] = "ops-token-0123456789ab";
constexpr char kPeer[] = "peer-token-0123456789a";

std::string Bearer(std::string_view t) { return absl::StrCat("Bearer ", std::string(t)); }

// A token file in the test's temp directory, rewritten by Write.
class TokenFile {
 public:
  TokenFile()
      : path_(std::filesystem::temp_directory_path() /
              absl::StrCat("cortiq_auth_test_", getpid(), "_", counter_++, ".tokens")) {}
  ~TokenFile() { std::filesystem::remove(path_); }
  void Write(const std::string& text) {
    std::ofstream(path_, std::ios::trunc) << text;
    chmod(path_.c_str(), 0600);
  }
  std::string path() const { return path_.string(); }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

std::string GoodFile() {
  return absl::StrCat("# tenants of the test\n", "\n", "alice client ", kAlice, "\n",
                      "  bob\tclient   ", kBob, "  \n", "   # an indented comment\n", "ops admin ",
                      kOps, "\n", "cluster peer ", kPeer, "\n");
}

TEST(TokenTableTest, ParsesRolesAndTenants) {
  absl::StatusOr<TokenTable> t = TokenTable::Parse(GoodFile(), "tokens");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->size(), 4u);
  struct Want {
    const char* token;
    const char* tenant;
    Role role;
  };
  for (const Want& w : {Want{kAlice, "alice", Role::kClient}, Want{kBob, "bob", Role::kClient},
                        Want{kOps, "ops", Role::kAdmin}, Want{kPeer, "cluster", Role::kPeer}}) {
    std::optional<Caller> c = t->Find(w.token);
    ASSERT_TRUE(c.has_value()) << w.tenant;
    EXPECT_EQ(c->tenant, w.tenant);
    EXPECT_EQ(c->role, w.role);
  }
  EXPECT_EQ(t->Tenants(), (std::vector<std::string>{"alice", "bob", "cluster", "ops"}));
}

// Many tokens, some sharing all but their last byte, some prefixes of
// others: the lookup (which compares digests with every entry, never
// stopping early) finds each, and nothing finds a near miss.
TEST(TokenTableTest, LookupFindsEveryTokenAndNoNearMiss) {
  std::string text;
  std::vector<std::string> tokens;
  for (int i = 0; i < 64; ++i) {
    tokens.push_back(absl::StrCat("shared-prefix-0123456789-", i));
    text += absl::StrCat("t", i, " ", i % 3 == 0 ? "admin" : "client", " ", tokens.back(), "\n");
  }
  absl::StatusOr<TokenTable> t = TokenTable::Parse(text, "many");
  ASSERT_TRUE(t.ok()) << t.status();
  for (int i = 0; i < 64; ++i) {
    std::optional<Caller> c = t->Find(tokens[i]);
    ASSERT_TRUE(c.has_value()) << i;
    EXPECT_EQ(c->tenant, absl::StrCat("t", i));
    EXPECT_EQ(c->role, i % 3 == 0 ? Role::kAdmin : Role::kClient);
  }
  for (const std::string& miss :
       {std::string("shared-prefix-0123456789-"), std::string("shared-prefix-0123456789-64"),
        std::string("shared-prefix-0123456789-1 "), std::string("shared-prefix-0123456789-0x"),
        std::string("Shared-prefix-0123456789-1"), std::string()}) {
    EXPECT_FALSE(t->Find(miss).has_value()) << miss;
  }
}

// Each bad line: INVALID_ARGUMENT naming the file and the line, saying
// what is wrong, and never quoting a field of the line.
TEST(TokenTableTest, ErrorsNameFileAndLineAndNeverQuoteTheLine) {
  constexpr char kSecret[] = "S3CRET+never/shown=xyz";  // not a valid name either
  struct Case {
    std::string line;
    const char* says;
  };
  const std::vector<Case> cases = {
      {absl::StrCat("alice client"), "expected NAME ROLE TOKEN"},
      {absl::StrCat(kSecret), "found 1 fields"},
      {absl::StrCat("alice client ", kSecret, " extra"), "found 4 fields"},
      {absl::StrCat(kSecret, " client alice-0123456789abcdef"), "the name (field 1)"},
      {absl::StrCat("al/ice client ", kSecret), "the name (field 1)"},
      {absl::StrCat(std::string(65, 'a'), " client ", kSecret), "the name (field 1)"},
      {absl::StrCat("alice ", kSecret, " client"), "the role (field 2)"},
      {absl::StrCat("alice Client ", kSecret), "the role (field 2)"},
      {"alice client S3CRET-short", "is 12 bytes; at least 16"},
      {absl::StrCat("alice client ", kSecret, "\x01"), "not printable ASCII"},
      {absl::StrCat("alice client ", kSecret, "\xc3\xa9"), "not printable ASCII"},
  };
  for (const Case& c : cases) {
    // Two good lines first: the error is on line 3.
    const std::string text =
        absl::StrCat("# header\nops admin ", kOps, "\n", c.line, "\nbob client ", kBob, "\n");
    absl::StatusOr<TokenTable> t = TokenTable::Parse(text, "/etc/cortiq/tokens");
    ASSERT_FALSE(t.ok()) << c.line;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string m(t.status().message());
    EXPECT_EQ(m.rfind("/etc/cortiq/tokens:3: ", 0), 0u) << m;
    EXPECT_NE(m.find(c.says), std::string::npos) << m;
    EXPECT_EQ(m.find("S3CRET"), std::string::npos) << m;
    EXPECT_EQ(m.find(kOps), std::string::npos) << m;
  }
}

TEST(TokenTableTest, DuplicateTokensAndEmptyFilesAreRefused) {
  absl::StatusOr<TokenTable> t = TokenTable::Parse(
      absl::StrCat("alice client ", kAlice, "\n\n# x\nbob client ", kAlice, "\n"), "f");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(std::string(t.status().message()),
            "f:4: the token is the same as f:1's (every token must be unique)");
  // The same tenant with two tokens (rotation) is fine.
  EXPECT_TRUE(
      TokenTable::Parse(absl::StrCat("alice client ", kAlice, "\nalice client ", kBob, "\n"), "f")
          .ok());
  // A file that would let nobody in is a mistake, not "auth off".
  for (const char* empty : {"", "\n\n", "# only a comment\n   \n"}) {
    absl::StatusOr<TokenTable> e = TokenTable::Parse(empty, "f");
    ASSERT_FALSE(e.ok()) << empty;
    EXPECT_NE(e.status().message().find("f: no token"), std::string_view::npos) << e.status();
  }
  // The --auth-token shorthand merges, as admin "admin", and must not repeat
  // a file's token.
  absl::StatusOr<TokenTable> merged = TokenTable::Parse(GoodFile(), "f");
  ASSERT_TRUE(merged.ok());
  EXPECT_TRUE(merged->AddAdminToken("short", "--auth-token").ok());
  EXPECT_EQ(merged->Find("short")->tenant, "admin");
  EXPECT_EQ(merged->Find("short")->role, Role::kAdmin);
  absl::Status dup = merged->AddAdminToken(kBob, "--auth-token");
  EXPECT_EQ(std::string(dup.message()),
            "--auth-token: the token is the same as f:4's (every token must be unique)");
}

TEST(AuthenticatorTest, NoTokenMeansEveryCallerIsAdminOfNoTenant) {
  absl::StatusOr<std::unique_ptr<Authenticator>> a = Authenticator::Create("", "");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE((*a)->enabled());
  for (auto md : {std::optional<std::string_view>(), std::optional<std::string_view>("junk")}) {
    absl::StatusOr<Caller> c = (*a)->Authenticate(md, std::string_view("bob;client"));
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->tenant, "");
    EXPECT_EQ(c->role, Role::kAdmin);
    EXPECT_FALSE(c->sessions().has_value());
  }
  EXPECT_TRUE((*a)->Reload().ok());  // nothing to re-read
}

TEST(AuthenticatorTest, BearerTokensAndOnBehalfOf) {
  TokenFile f;
  f.Write(GoodFile());
  absl::StatusOr<std::unique_ptr<Authenticator>> made = Authenticator::Create(f.path(), "legacy");
  ASSERT_TRUE(made.ok()) << made.status();
  const Authenticator& a = **made;
  EXPECT_TRUE(a.enabled());
  EXPECT_EQ(a.Tenants(), (std::vector<std::string>{"admin", "alice", "bob", "cluster", "ops"}));

  auto code = [&](std::optional<std::string_view> md, std::optional<std::string_view> obo = {}) {
    return a.Authenticate(md, obo).status().code();
  };
  EXPECT_EQ(code(std::nullopt), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(code(kAlice), absl::StatusCode::kUnauthenticated);  // no "Bearer "
  EXPECT_EQ(code("Bearer wrong-token-0123456789"), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(code("bearer " + std::string(kAlice)), absl::StatusCode::kUnauthenticated);

  absl::StatusOr<Caller> alice = a.Authenticate(Bearer(kAlice), std::nullopt);
  ASSERT_TRUE(alice.ok());
  EXPECT_EQ(alice->tenant, "alice");
  EXPECT_EQ(alice->sessions(), std::optional<std::string>("alice"));
  absl::StatusOr<Caller> legacy = a.Authenticate(Bearer("legacy"), std::nullopt);
  ASSERT_TRUE(legacy.ok());
  EXPECT_EQ(legacy->tenant, "admin");
  EXPECT_EQ(legacy->role, Role::kAdmin);

  // A client's on-behalf-of is ignored: it stays alice.
  absl::StatusOr<Caller> claim = a.Authenticate(Bearer(kAlice), std::string_view("ops;admin"));
  ASSERT_TRUE(claim.ok());
  EXPECT_EQ(claim->tenant, "alice");
  EXPECT_EQ(claim->role, Role::kClient);
  // So is an admin's.
  EXPECT_EQ(a.Authenticate(Bearer(kOps), std::string_view("bob;client"))->tenant, "ops");

  // A peer's is honoured, "" tenant included (a node without tokens).
  absl::StatusOr<Caller> peer = a.Authenticate(Bearer(kPeer), std::nullopt);
  ASSERT_TRUE(peer.ok());
  EXPECT_EQ(peer->role, Role::kPeer);
  for (const Caller& want :
       {Caller{"bob", Role::kClient}, Caller{"ops", Role::kAdmin}, Caller{"", Role::kAdmin}}) {
    const std::string v = OnBehalfOfValue(want);
    absl::StatusOr<Caller> c = a.Authenticate(Bearer(kPeer), std::string_view(v));
    ASSERT_TRUE(c.ok()) << v << ": " << c.status();
    EXPECT_EQ(c->tenant, want.tenant);
    EXPECT_EQ(c->role, want.role);
  }
  for (const char* bad : {"bob", "bob;", "bob;root", ";", "b/b;client", "bob;client;x"}) {
    absl::StatusOr<Caller> c = a.Authenticate(Bearer(kPeer), std::string_view(bad));
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(c.status().message().find(kOnBehalfOfHeader), std::string_view::npos);
  }
}

TEST(AuthenticatorTest, CreateRefusesABadFileAndAClashWithTheAdminToken) {
  TokenFile f;
  f.Write(absl::StrCat("alice client ", kAlice, "\nbob client\n"));
  absl::StatusOr<std::unique_ptr<Authenticator>> a = Authenticator::Create(f.path(), "");
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().message().rfind(f.path() + ":2: ", 0), 0u) << a.status();
  f.Write(absl::StrCat("alice client ", kAlice, "\n"));
  a = Authenticator::Create(f.path(), kAlice);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("--auth-token: the token is the same as"),
            std::string_view::npos)
      << a.status();
  a = Authenticator::Create("/nonexistent/tokens", "");
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("--auth-tokens: cannot read '/nonexistent/tokens'"),
            std::string_view::npos);
}

TEST(AuthenticatorTest, ReloadSwapsTheTableAndABadFileKeepsTheOldOne) {
  TokenFile f;
  f.Write(GoodFile());
  absl::StatusOr<std::unique_ptr<Authenticator>> made = Authenticator::Create(f.path(), "legacy");
  ASSERT_TRUE(made.ok()) << made.status();
  Authenticator& a = **made;
  constexpr char kCarol[] = "carol-token-0123456789";
  EXPECT_FALSE(a.Authenticate(Bearer(kCarol), std::nullopt).ok());

  // carol added, bob removed.
  f.Write(absl::StrCat("alice client ", kAlice, "\ncarol client ", kCarol, "\n"));
  ASSERT_TRUE(a.Reload().ok());
  EXPECT_EQ(a.Authenticate(Bearer(kCarol), std::nullopt)->tenant, "carol");
  EXPECT_EQ(a.Authenticate(Bearer(kBob), std::nullopt).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(a.Authenticate(Bearer("legacy"), std::nullopt).ok());  // the flag's token stays
  EXPECT_EQ(a.Tenants(), (std::vector<std::string>{"admin", "alice", "carol"}));

  // A bad file (line 2), then an unreadable one: the table in use stays.
  f.Write(absl::StrCat("alice client ", kAlice, "\ndave client short\n"));
  absl::Status st = a.Reload();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(st.message()).rfind(f.path() + ":2: ", 0), 0u) << st;
  std::filesystem::remove(f.path());
  EXPECT_FALSE(a.Reload().ok());
  EXPECT_EQ(a.Authenticate(Bearer(kCarol), std::nullopt)->tenant, "carol");
  EXPECT_EQ(a.Authenticate(Bearer(kAlice), std::nullopt)->tenant, "alice");
  EXPECT_FALSE(a.Authenticate(Bearer(kBob), std::nullopt).ok());
  EXPECT_EQ(a.Tenants(), (std::vector<std::string>{"admin", "alice", "carol"}));
}

// The permission table of the README, RPC by RPC.
TEST(PermissionTest, RolesMayCallWhatTheTableSays) {
  const std::vector<std::string_view> client = {"Generate",       "Tokenize",     "GetModelInfo",
                                                "CreateSession",  "GetSession",   "ListSessions",
                                                "ReleaseSession", "ExportSession"};
  const std::vector<std::string_view> peer = {"ImportSession", "GetModelInfo"};
  auto in = [](const std::vector<std::string_view>& v, std::string_view rpc) {
    return std::find(v.begin(), v.end(), rpc) != v.end();
  };
  for (std::string_view rpc : kRpcNames) {
    EXPECT_TRUE(Allowed(Role::kAdmin, rpc)) << rpc;
    EXPECT_EQ(Allowed(Role::kClient, rpc), in(client, rpc)) << rpc;
    EXPECT_EQ(Allowed(Role::kPeer, rpc), in(peer, rpc)) << rpc;
  }
  for (Role r : {Role::kClient, Role::kPeer, Role::kAdmin}) {
    EXPECT_FALSE(Allowed(r, "NoSuchRpc"));
    EXPECT_EQ(ParseRole(RoleName(r)), r);
  }
  absl::Status st = CheckPermission(Caller{"alice", Role::kClient}, "Drain");
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(std::string(st.message()), "Drain: the client role may not call it (allowed: admin)");
  st = CheckPermission(Caller{"cluster", Role::kPeer}, "GetSession");
  EXPECT_EQ(std::string(st.message()),
            "GetSession: the peer role may not call it (allowed: client, admin)");
  EXPECT_TRUE(CheckPermission(Caller{"cluster", Role::kPeer}, "ImportSession").ok());
}

}  // namespace
}  // namespace cortiq::server
