#!/usr/bin/env bash
# End-to-end smoke test of a real `forkd serve` driven by `forkctl`, as a user would:
# create a session, fork 5 directives and wait, replay the notifications, compare the batch
# stats with them, check the error codes, then stop the daemon with SIGTERM (it must exit 0).
#
#   scripts/smoke.sh            # builds release binaries first
#   FORKD_BIN_DIR=target/debug scripts/smoke.sh
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/lib.sh
forkd_binaries
forkd="$FORKD"
forkctl="$FORKCTL"

# The home and the session's workspace side by side: the home is never a workspace.
dir="$(mktemp -d /tmp/forkd-smoke.XXXXXX)"
home="$dir/home" ws="$dir/ws"
mkdir -p "$home" "$ws"
cleanup() {
  stop_forkd
  rm -rf "$dir"
}
trap cleanup EXIT
start_forkd "$home" --sim-speed 0
daemon_pid=$DAEMON_PID

echo "You are a careful reviewer." >"$home/system.md"
sid="$("$forkctl" --json session create --system-file "$home/system.md" \
  --context-file README.md --context-file ARCHITECTURE.md --workspace "$ws" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["session_id"])')"
echo "session $sid"

"$forkctl" --json fork "$sid" --wait \
  -d "Review the README" -d "Summarize the architecture" -d "List the crates" \
  -d "Find the invariants" -d "Draft a changelog" >"$home/fork.jsonl"
"$forkctl" --json watch --since 0 --no-follow >"$home/watch.jsonl"
batch="$(head -1 "$home/fork.jsonl" | python3 -c 'import json,sys; print(json.load(sys.stdin)["batch_id"])')"
"$forkctl" --json stats --batch "$batch" >"$home/stats.json"

python3 - "$home" <<'PY'
import json, sys
home = sys.argv[1]
lines = [json.loads(l) for l in open(f"{home}/fork.jsonl")]
fork, notes = lines[0], lines[1:]
watched = [json.loads(l) for l in open(f"{home}/watch.jsonl")]
stats = json.load(open(f"{home}/stats.json"))
assert len(notes) == 5 and all(n["status"] == "completed" for n in notes), notes
assert all(n["report"]["result"] for n in notes)
key = lambda n: n["seq"]
assert sorted(watched, key=key) == sorted(notes, key=key), "watch --since 0 must replay exactly the 5"
for k in ["input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens"]:
    assert stats[k] == sum(n["usage"][k] for n in notes), k
assert abs(stats["cost_usd"] - sum(n["cost_usd"] for n in notes)) < 1e-9
reads = sorted(n["usage"]["cache_read_input_tokens"] for n in notes)
print(f"5 completed; shared prefix {stats['shared_prefix_tokens']} tokens; "
      f"siblings read {reads[1:]}; cost ${stats['cost_usd']:.4f} vs independent "
      f"${stats['independent_cost_usd']:.4f} (saving {100*stats['saving']:.1f}%)")
PY

expect_code() {
  local want="$1"; shift
  set +e; "$@" >/dev/null 2>"$home/err"; local got=$?; set -e
  [[ "$got" == "$want" ]] || { echo "expected exit $want, got $got: $*" >&2; cat "$home/err" >&2; exit 1; }
  echo "exit $got as expected: $(head -1 "$home/err")"
}
expect_code 3 "$forkctl" session get 01a22937-0000-7000-8000-000000000000
expect_code 4 "$forkctl" fork "$sid" -d "   "
expect_code 4 "$forkctl" fork "$sid" -d "$(head -c 70000 /dev/zero | tr '\0' x)"
expect_code 1 "$forkctl" fork "$sid" -d "@sim fail 400" --wait
"$forkctl" session get "$sid" >/dev/null  # still serving

kill -TERM "$daemon_pid"
wait "$daemon_pid"
echo "forkd exited $? on SIGTERM"
daemon_pid=""
