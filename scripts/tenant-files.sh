#!/usr/bin/env bash
# A tenant reaches only its own files: what a hostile tenant gets from a shared daemon.
#
# Two tenants, alice and mallory, each with a token and a root (`[tenants.NAME]
# workspace_roots`), share one `forkd serve` over TCP. Alice's workspace holds a secret. Mallory
# asks for a session in each door the tenant-workspaces issue found open — alice's directory, its
# parent, `/`, FORKD_HOME — and, where the daemon lets it in, forks a child that Reads the secret,
# `secret.key` and `tokens.json` there. One line per door: what the daemon answered, and what the
# child read. Run it against any build (FORKD_BIN_DIR=DIR for binaries built elsewhere, such as an
# older commit's) to compare:
#
#   scripts/tenant-files.sh                                # this tree (release build)
#   FORKD_BIN_DIR=/tmp/old/target/debug scripts/tenant-files.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
forkd_binaries

dir="$(mktemp -d /tmp/forkd-tenant-files.XXXXXX)"
dir="$(cd "$dir" && pwd -P)"
home="$dir/home"
alice_ws="$dir/srv/ci/alice/ws"
mkdir -p "$home" "$alice_ws" "$dir/srv/ci/mallory"
chmod 700 "$home"
cleanup() {
  stop_forkd
  rm -rf "$dir"
}
trap cleanup EXIT

echo "alice's secret" >"$alice_ws/secret.txt"
echo "You are a careful engineer." >"$dir/system.md"
cat >"$home/config.toml" <<TOML
[tenants.alice]
workspace_roots = ["$dir/srv/ci/alice"]
[tenants.mallory]
workspace_roots = ["$dir/srv/ci/mallory"]
TOML
# An older build may not know workspace_roots: it then starts without the file.
export FORKD_HOME="$home"
alice="$("$FORKD" token create alice)"
mallory="$("$FORKD" token create mallory)"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
if ! start_forkd "$home" --sim-speed 0 --listen "127.0.0.1:$port" 2>/dev/null; then
  mv "$home/config.toml" "$dir/config.toml.unknown"
  start_forkd "$home" --sim-speed 0 --listen "127.0.0.1:$port"
fi

as() {
  local token=$1
  shift
  FORKD_TOKEN="$token" "$FORKCTL" --addr "http://127.0.0.1:$port" "$@"
}

# What the daemon's own files hold, to recognise them in a transcript.
key="$(tr -d '[:space:]' <"$home/secret.key")"
digest="$(grep -oE '[0-9a-f]{64}' "$home/tokens.json" | head -1)"

# A session of alice's, so that her secret is in a workspace the daemon knows.
as "$alice" --json session create --system-file "$dir/system.md" --workspace "$alice_ws" >/dev/null

printf '%-28s %-22s %s\n' "mallory's workspace" "the daemon answered" "the child read"
for door in "$alice_ws" "$(dirname "$alice_ws")" / "$home" relative/ws; do
  shown="${door/#$dir/DIR}"
  if ! out="$(as "$mallory" --json session create --system-file "$dir/system.md" --workspace "$door" 2>&1)"; then
    printf '%-28s %-22s %s\n' "$shown" "refused" "$(echo "$out" | head -1 | cut -c1-90)"
    continue
  fi
  sid="$(echo "$out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["session_id"])')"
  # Where the secret lies beneath the door, and the daemon's own files.
  rel_secret="$(python3 -c 'import os,sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' "$alice_ws/secret.txt" "$door" 2>/dev/null || echo secret.txt)"
  directive="Read them.
@sim tool Read {\"file_path\":\"$rel_secret\"}
@sim tool Read {\"file_path\":\"$home/secret.key\"}
@sim tool Read {\"file_path\":\"$home/tokens.json\"}
@sim say read"
  agent="$(as "$mallory" --json fork "$sid" -d "$directive" --wait | head -1 |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["agent_ids"][0])')"
  logs="$(as "$mallory" logs "$agent" 2>&1 || true)"
  read=()
  grep -q "alice's secret" <<<"$logs" && read+=("alice's secret")
  grep -qF "$key" <<<"$logs" && read+=("secret.key")
  grep -qF "$digest" <<<"$logs" && read+=("tokens.json")
  printf '%-28s %-22s %s\n' "$shown" "session $sid" "${read[*]:-nothing}"
done
