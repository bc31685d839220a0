// Roles and tenants: who a caller is (its bearer token's name and role) and
// which RPCs that role may call.
//
// Tokens come from a token file (--auth-tokens FILE), one per line:
//
//   # NAME     ROLE    TOKEN
//   alice      client  4f0c9b1e0d7a44f6a1b2c3d4e5f60718
//   ops        admin   9a8b7c6d5e4f30211203948576afbecd
//   cluster    peer    0123456789abcdef0123456789abcdef
//
// NAME is the caller's tenant ([A-Za-z0-9._-], 1-64 bytes); ROLE is client,
// admin or peer; TOKEN is 16 or more printable ASCII bytes without spaces,
// unique in the file. Blank lines and lines whose first non-blank byte is
// '#' are skipped. A tenant may hold several tokens (rotation). The single
// --auth-token T (--auth-token-file, CORTIQ_AUTH_TOKEN) is shorthand for one
// admin token named "admin" (any length, as before) and merges with the
// file. With no token at all every caller is admin of tenant "".
//
// Roles (Allowed): client — Generate, Tokenize, GetModelInfo, and
// Create/Get/List/Release/ExportSession on its own tenant's sessions; admin
// — every RPC and every tenant's sessions; peer — ImportSession and
// GetModelInfo (node to node), and any call it makes on behalf of a caller:
// a peer's "x-cortiq-on-behalf-of: TENANT;ROLE" metadata makes the call that
// tenant's and role's. The metadata is ignored from any other role (a
// client cannot claim to be someone else; a node without tokens, where
// every caller is admin, serves a forwarded call as admin, as it would the
// caller itself).
//
// Secrets: a token is kept only as its SHA-256 digest. Find() hashes the
// presented token and compares the digest with EVERY entry's (CRYPTO_memcmp,
// no early exit, no branch on a match), so how long a lookup takes depends
// on the number of tokens and the presented token's length, never on how
// many bytes of it are right. No message here, and nothing a caller of
// this file logs, quotes a token or any field of a token file's line.
//
// Threads: TokenTable is immutable after Parse (thread-compatible);
// Authenticator is thread-safe: Find / Tenants run on gRPC's threads and
// the metrics scrape while Reload (the SIGHUP path) swaps the table.
//
// Example:
//   CORTIQ_ASSIGN_OR_RETURN(auto auth, Authenticator::Create("/etc/cortiq/tokens", ""));
//   absl::StatusOr<Caller> who = auth->Authenticate("Bearer 4f0c...", std::nullopt);
//   CORTIQ_RETURN_IF_ERROR(CheckPermission(*who, "Drain"));  // PERMISSION_DENIED for a client
//   std::optional<std::string> scope = who->sessions();     // the store's tenant filter
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace cortiq::server {

enum class Role : uint8_t { kClient, kPeer, kAdmin };
// "client" | "peer" | "admin".
std::string_view RoleName(Role role);
// The role named `name` (exactly as RoleName writes it); nullopt otherwise.
std::optional<Role> ParseRole(std::string_view name);

// True for a valid tenant name: 1-64 bytes of [A-Za-z0-9._-].
bool IsValidTenantName(std::string_view name);

// Who a call is: its tenant and role (after x-cortiq-on-behalf-of).
struct Caller {
  std::string tenant;
  Role role = Role::kClient;

  // The sessions this caller sees, as the session store's tenant filter:
  // nullopt (every tenant's) for admin, else its own tenant's.
  std::optional<std::string> sessions() const;
};

// The metadata a peer sends on a call it makes for a caller:
// "TENANT;ROLE", the tenant possibly empty (a node without tokens).
inline constexpr char kOnBehalfOfHeader[] = "x-cortiq-on-behalf-of";
// Its value for `caller` (what a forwarding node sends).
std::string OnBehalfOfValue(const Caller& caller);

// True when `role` may call `rpc` (a name of kRpcNames, server/metrics.h;
// an unknown name is never allowed). Session RPCs are allowed to a client
// for its own sessions: the store's tenant filter (Caller::sessions) keeps
// it to them.
bool Allowed(Role role, std::string_view rpc);
// OK when Allowed; else PERMISSION_DENIED naming the RPC, the role and the
// roles that may call it.
absl::Status CheckPermission(const Caller& caller, std::string_view rpc);

// The tokens of one configuration: a token file and/or the single admin
// token. Immutable once built.
class TokenTable {
 public:
  // An empty table (no token: auth off).
  TokenTable() = default;

  // Parses a token file's text. `file` names it in errors, which read
  // "FILE:LINE: what is wrong" and never quote the line. INVALID_ARGUMENT
  // for a line without exactly three fields, a bad name or role, a token
  // shorter than 16 bytes or with a byte outside 0x21-0x7e, a token that
  // appears twice, or a file with no token at all. O(bytes + tokens).
  static absl::StatusOr<TokenTable> Parse(std::string_view text, std::string_view file);
  // Reads and parses `path` (INVALID_ARGUMENT naming it when unreadable).
  static absl::StatusOr<TokenTable> Load(const std::string& path);

  // Adds `token` as an admin token named "admin" (the --auth-token
  // shorthand; no length rule, as before the token file). INVALID_ARGUMENT
  // when an entry has the same token (naming `where`, never the token).
  absl::Status AddAdminToken(std::string_view token, std::string_view where);

  // The caller `token` belongs to, or nullopt. Constant time in the token's
  // bytes: compares its digest with every entry's (see the banner).
  std::optional<Caller> Find(std::string_view token) const;

  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }
  // Every tenant name in the table, sorted, without duplicates.
  std::vector<std::string> Tenants() const;

 private:
  using Digest = std::array<uint8_t, 32>;  // SHA-256
  struct Entry {
    Digest digest;
    Caller caller;
    size_t line = 0;  // in the file; 0 for the --auth-token shorthand
  };
  static Digest Hash(std::string_view token);
  // INVALID_ARGUMENT when `digest` is an entry's already.
  absl::Status CheckUnique(const Digest& digest, std::string_view where) const;

  std::string file_;  // the token file's name, for messages ("" without one)
  std::vector<Entry> entries_;
};

// The server's token table, re-readable: the token file (may be "") merged
// with the single admin token (may be "").
class Authenticator {
 public:
  // Loads the file (TokenTable::Load's errors) and adds the admin token.
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(std::string token_file,
                                                               std::string admin_token);

  // True when any token is configured (the file, the admin token, or both).
  bool enabled() const;

  // The caller of a call: `authorization` is the call's "authorization"
  // metadata (nullopt when absent), `on_behalf_of` its
  // x-cortiq-on-behalf-of (nullopt when absent). With no token configured:
  // admin of tenant "", whatever the metadata. Else UNAUTHENTICATED for a
  // missing, malformed or unknown bearer token; from a peer, the
  // on-behalf-of caller (INVALID_ARGUMENT naming the header when it is not
  // "TENANT;ROLE" with a valid tenant or "" and a role name); from any
  // other role the header is ignored.
  absl::StatusOr<Caller> Authenticate(std::optional<std::string_view> authorization,
                                      std::optional<std::string_view> on_behalf_of) const;

  // Re-reads the token file (the SIGHUP path). On an error (unreadable,
  // a bad line) the table in use stays as it was and the error is
  // returned, for the caller to log. OK without a token file (nothing to
  // re-read). Blocking file I/O: never on a gRPC thread.
  absl::Status Reload();

  // The tenants of the table in use (sorted): the metrics' tenant labels.
  std::vector<std::string> Tenants() const;
  const std::string& token_file() const { return token_file_; }

 private:
  Authenticator(std::string token_file, std::string admin_token)
      : token_file_(std::move(token_file)), admin_token_(std::move(admin_token)) {}
  // The file's table merged with the admin token.
  absl::StatusOr<std::shared_ptr<const TokenTable>> Build() const;
  std::shared_ptr<const TokenTable> table() const;

  const std::string token_file_;
  const std::string admin_token_;
  mutable std::mutex mu_;  // guards table_ (the pointer; the table is immutable)
  std::shared_ptr<const TokenTable> table_;
};

}  // namespace cortiq::server
