#!/usr/bin/env bash
# Makes the tokens a deployment needs, once, into a folder that git ignores:
#
#   deploy/make-tokens.sh deploy/secrets alice bob        # compose
#   deploy/make-tokens.sh deploy/k8s/secrets alice bob    # Kubernetes (kustomization.yaml)
#
# DIR/tokens       the roles file every node reads (--auth-tokens): one
#                  "NAME ROLE TOKEN" line each for `admin` (role admin: drain,
#                  migrate, import, every tenant's sessions), `peer` (role peer:
#                  what nodes present to each other) and every CLIENT name given
#                  (role client: its own sessions; the name is its tenant)
# DIR/admin-token  the admin line's token (`cortiq drain`, the preStop hook)
# DIR/peer-token   the peer line's token (each node's --peer-token)
#
# Tokens are 32 random bytes in hex (no trailing newline in the one-token
# files). DIR is mode 700 (only you reach the files); the files are 644,
# because compose bind-mounts a secret file as it is and the image's user
# (uid 10001) must read it. An existing DIR/tokens is never overwritten: to add
# a client later, append "NAME client $(openssl rand -hex 32)" to it and send
# the nodes SIGHUP (deploy/README.md, "Tokens").
set -euo pipefail

usage() { echo "usage: deploy/make-tokens.sh DIR [CLIENT_NAME...]" >&2; exit 2; }
[ $# -ge 1 ] || usage
dir=$1
shift

for name in "$@"; do
  if ! [[ $name =~ ^[A-Za-z0-9._-]{1,64}$ ]]; then
    echo "make-tokens: client name '$name': 1 to 64 characters of [A-Za-z0-9._-]" >&2
    exit 2
  fi
  if [ "$name" = admin ] || [ "$name" = peer ]; then
    echo "make-tokens: client name '$name' is taken by the $name line" >&2
    exit 2
  fi
done
if [ -e "$dir/tokens" ]; then
  echo "make-tokens: $dir/tokens exists; not overwriting it (remove the folder's tokens, admin-token and peer-token to start over)" >&2
  exit 1
fi

token() { head -c 32 /dev/urandom | od -An -tx1 -v | tr -d ' \n'; }

mkdir -p "$dir"
chmod 700 "$dir"
umask 022
admin=$(token)
peer=$(token)
{
  echo "# NAME ROLE TOKEN (deploy/README.md, \"Tokens\"); made by deploy/make-tokens.sh"
  echo "admin admin $admin"
  echo "peer peer $peer"
  for name in "$@"; do echo "$name client $(token)"; done
} >"$dir/tokens"
printf '%s' "$admin" >"$dir/admin-token"
printf '%s' "$peer" >"$dir/peer-token"
echo "make-tokens: wrote $dir/tokens (admin, peer${*:+, clients: $*}), $dir/admin-token, $dir/peer-token"
