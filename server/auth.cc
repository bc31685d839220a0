#include "server/auth.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/session/session.h"
#include "core/util/log_escape.h"
#include "core/util/status_macros.h"
#include "core/util/strings.h"
#include "server/metrics.h"
#include "spdlog/spdlog.h"

namespace cortiq::server {

namespace {

using session::kMaxTenantBytes;
constexpr size_t kMinTokenBytes = 16;
constexpr std::string_view kAdminName = "admin";
constexpr std::string_view kBearer = "Bearer ";

// The RPCs a client may call: inference, and the session RPCs on its own
// tenant's sessions (the store's tenant filter keeps it to them).
constexpr std::array<std::string_view, 8> kClientRpcs = {
    "Generate",   "Tokenize",     "GetModelInfo",   "CreateSession",
    "GetSession", "ListSessions", "ReleaseSession", "ExportSession"};
// A peer's own calls (node to node); on behalf of a caller it has that
// caller's role instead.
constexpr std::array<std::string_view, 2> kPeerRpcs = {"ImportSession", "GetModelInfo"};

template <size_t N>
bool Contains(const std::array<std::string_view, N>& set, std::string_view rpc) {
  return std::find(set.begin(), set.end(), rpc) != set.end();
}

// Printable ASCII without the space: what an HTTP/2 header value can carry
// verbatim and a whitespace-separated file can hold.
bool IsTokenByte(char c) { return c > 0x20 && c < 0x7f; }

bool IsBlank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

// The blank-separated fields of one line.
std::vector<std::string_view> Fields(std::string_view line) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && IsBlank(line[i])) ++i;
    const size_t start = i;
    while (i < line.size() && !IsBlank(line[i])) ++i;
    if (i > start) out.push_back(line.substr(start, i - start));
  }
  return out;
}

}  // namespace

std::string_view RoleName(Role role) {
  switch (role) {
    case Role::kClient:
      return "client";
    case Role::kPeer:
      return "peer";
    case Role::kAdmin:
      return "admin";
  }
  return "unknown";
}

std::optional<Role> ParseRole(std::string_view name) {
  for (Role r : {Role::kClient, Role::kPeer, Role::kAdmin}) {
    if (name == RoleName(r)) return r;
  }
  return std::nullopt;
}

bool IsValidTenantName(std::string_view name) {
  return !name.empty() && session::IsTenantName(name);
}

std::optional<std::string> Caller::sessions() const {
  if (role == Role::kAdmin) return std::nullopt;
  return tenant;
}

std::string OnBehalfOfValue(const Caller& caller) {
  return absl::StrCat(caller.tenant, ";", util::Sv(RoleName(caller.role)));
}

bool Allowed(Role role, std::string_view rpc) {
  switch (role) {
    case Role::kAdmin:
      return RpcIndex(rpc).has_value();  // every RPC of the service; nothing else
    case Role::kClient:
      return Contains(kClientRpcs, rpc);
    case Role::kPeer:
      return Contains(kPeerRpcs, rpc);
  }
  return false;
}

absl::Status CheckPermission(const Caller& caller, std::string_view rpc) {
  if (Allowed(caller.role, rpc)) return absl::OkStatus();
  std::string who;
  for (Role r : {Role::kClient, Role::kPeer, Role::kAdmin}) {
    if (Allowed(r, rpc)) absl::StrAppend(&who, who.empty() ? "" : ", ", util::Sv(RoleName(r)));
  }
  return absl::PermissionDeniedError(absl::StrCat(util::Sv(rpc), ": the ",
                                                  util::Sv(RoleName(caller.role)),
                                                  " role may not call it (allowed: ", who, ")"));
}

// ---- TokenTable ----

TokenTable::Digest TokenTable::Hash(std::string_view token) {
  Digest d;
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), d.data());
  return d;
}

absl::Status TokenTable::CheckUnique(const Digest& digest, std::string_view where) const {
  for (const Entry& e : entries_) {
    if (e.digest == digest) {
      return absl::InvalidArgumentError(absl::StrCat(
          util::Sv(where), ": the token is the same as ",
          e.line > 0 ? absl::StrCat(file_, ":", e.line, "'s") : std::string("--auth-token's"),
          " (every token must be unique)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TokenTable> TokenTable::Parse(std::string_view text, std::string_view file) {
  TokenTable t;
  t.file_ = std::string(file);
  size_t line_no = 0;
  for (size_t at = 0; at <= text.size();) {
    const size_t end = std::min(text.find('\n', at), text.size());
    const std::vector<std::string_view> fields = Fields(text.substr(at, end - at));
    at = end + 1;
    ++line_no;
    if (fields.empty() || fields[0].front() == '#') continue;
    const std::string where = absl::StrCat(util::Sv(file), ":", line_no);
    // Messages name the field by position and never quote it: a line with
    // its fields out of order would otherwise echo a token.
    if (fields.size() != 3) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": expected NAME ROLE TOKEN (3 fields separated by spaces), found ",
                       fields.size(), " fields"));
    }
    if (!IsValidTenantName(fields[0])) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the name (field 1) must be 1-",
                                                     kMaxTenantBytes, " bytes of [A-Za-z0-9._-]"));
    }
    const std::optional<Role> role = ParseRole(fields[1]);
    if (!role) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the role (field 2) must be client, admin or peer"));
    }
    const std::string_view token = fields[2];
    if (token.size() < kMinTokenBytes) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the token (field 3) is ",
                                                     token.size(), " bytes; at least ",
                                                     kMinTokenBytes, " are required"));
    }
    if (!std::all_of(token.begin(), token.end(), IsTokenByte)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": the token (field 3) holds a byte that is not printable ASCII (0x21-0x7e)"));
    }
    const Digest d = Hash(token);
    CORTIQ_RETURN_IF_ERROR(t.CheckUnique(d, where));
    t.entries_.push_back({d, Caller{std::string(fields[0]), *role}, line_no});
  }
  if (t.entries_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(util::Sv(file),
                     ": no token (each line: NAME ROLE TOKEN); refusing a token file that "
                     "would let nobody in"));
  }
  return t;
}

absl::StatusOr<TokenTable> TokenTable::Load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    return absl::InvalidArgumentError(absl::StrCat("--auth-tokens: cannot read '", path, "'"));
  }
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) {
    return absl::InvalidArgumentError(absl::StrCat("--auth-tokens: cannot read '", path, "'"));
  }
  return Parse(ss.str(), path);
}

absl::Status TokenTable::AddAdminToken(std::string_view token, std::string_view where) {
  const Digest d = Hash(token);
  CORTIQ_RETURN_IF_ERROR(CheckUnique(d, where));
  entries_.push_back({d, Caller{std::string(kAdminName), Role::kAdmin}, 0});
  return absl::OkStatus();
}

std::optional<Caller> TokenTable::Find(std::string_view token) const {
  const Digest d = Hash(token);
  // Every entry is compared, whatever matched before; the match is picked
  // with a mask, not a branch (tokens are unique: at most one matches).
  size_t found = 0;  // index + 1 of the match; 0 = none
  for (size_t i = 0; i < entries_.size(); ++i) {
    const size_t equal =
        static_cast<size_t>(CRYPTO_memcmp(d.data(), entries_[i].digest.data(), d.size()) == 0);
    found |= (i + 1) & (0 - equal);
  }
  if (found == 0) return std::nullopt;
  return entries_[found - 1].caller;
}

std::vector<std::string> TokenTable::Tenants() const {
  std::vector<std::string> names;
  names.reserve(entries_.size());
  for (const Entry& e : entries_) names.push_back(e.caller.tenant);
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

// ---- Authenticator ----

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(std::string token_file,
                                                                     std::string admin_token) {
  std::unique_ptr<Authenticator> a(
      new Authenticator(std::move(token_file), std::move(admin_token)));
  absl::StatusOr<std::shared_ptr<const TokenTable>> table = a->Build();
  if (!table.ok()) return table.status();
  a->table_ = *std::move(table);
  return a;
}

absl::StatusOr<std::shared_ptr<const TokenTable>> Authenticator::Build() const {
  TokenTable t;
  if (!token_file_.empty()) {
    CORTIQ_ASSIGN_OR_RETURN(t, TokenTable::Load(token_file_));
    struct stat st;
    if (stat(token_file_.c_str(), &st) == 0 && (st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
      spdlog::warn("--auth-tokens {}: readable by other users (mode {:o}); chmod 600 it",
                   util::EscapeForLog(token_file_), st.st_mode & 0777);
    }
  }
  if (!admin_token_.empty()) {
    CORTIQ_RETURN_IF_ERROR(t.AddAdminToken(admin_token_, "--auth-token"));
  }
  return std::make_shared<const TokenTable>(std::move(t));
}

std::shared_ptr<const TokenTable> Authenticator::table() const {
  std::lock_guard lock(mu_);
  return table_;
}

bool Authenticator::enabled() const { return !table()->empty(); }

absl::StatusOr<Caller> Authenticator::Authenticate(
    std::optional<std::string_view> authorization,
    std::optional<std::string_view> on_behalf_of) const {
  const std::shared_ptr<const TokenTable> t = table();
  if (t->empty()) return Caller{"", Role::kAdmin};
  if (!authorization) {
    return absl::UnauthenticatedError("missing 'authorization: Bearer <token>' metadata");
  }
  if (!authorization->starts_with(kBearer)) {
    return absl::UnauthenticatedError("invalid bearer token");
  }
  std::optional<Caller> caller = t->Find(authorization->substr(kBearer.size()));
  if (!caller) return absl::UnauthenticatedError("invalid bearer token");
  if (caller->role != Role::kPeer || !on_behalf_of) return *std::move(caller);
  // A peer acting for a caller: the call is that caller's.
  const size_t semi = on_behalf_of->find(';');
  const std::string_view tenant = on_behalf_of->substr(0, semi);
  const std::optional<Role> role =
      semi == std::string_view::npos ? std::nullopt : ParseRole(on_behalf_of->substr(semi + 1));
  if (!role || !(tenant.empty() || IsValidTenantName(tenant))) {
    return absl::InvalidArgumentError(
        absl::StrCat(util::Sv(kOnBehalfOfHeader), ": expected TENANT;ROLE (TENANT \"\" or 1-",
                     kMaxTenantBytes, " bytes of [A-Za-z0-9._-], ROLE client, admin or peer)"));
  }
  return Caller{std::string(tenant), *role};
}

absl::Status Authenticator::Reload() {
  if (token_file_.empty()) return absl::OkStatus();
  absl::StatusOr<std::shared_ptr<const TokenTable>> table = Build();
  if (!table.ok()) return table.status();
  std::lock_guard lock(mu_);
  table_ = *std::move(table);
  return absl::OkStatus();
}

std::vector<std::string> Authenticator::Tenants() const { return table()->Tenants(); }

}  // namespace cortiq::server
