#!/usr/bin/env bash
# The handoff that frees the parent, timed against a real daemon (sim at its realistic pace): a
# parent turn calls a typed agent scripted to sleep 30 s, and
#   1. `forkctl bg` on the session's main-loop agent 1 s later, or
#   2. the auto-background delay, set to 2 s,
# hands the wait to the background. Printed: how long after the signal the parent's turn ended
# (its `turn` notification: the parent went on without the typed agent), and when the typed
# agent's own notification came (its report reaches the transcript then, once).
#
#   scripts/handoff.sh            # builds release binaries first
#   FORKD_BIN_DIR=target/debug scripts/handoff.sh
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/lib.sh
forkd_binaries
forkctl="$FORKCTL"

now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$1" "$2"; }

# Waits until `watch` has a notification of `kind` (and, for a typed one, the agent `id`).
wait_for() {
  local kind="$1"
  for _ in $(seq 1 600); do
    if "$forkctl" --json watch --since 0 --no-follow |
      python3 -c "import json,sys; sys.exit(0 if any(json.loads(l)['kind'] == '$kind' for l in sys.stdin) else 1)"; then
      return 0
    fi
    sleep 0.05
  done
  echo "no $kind notification" >&2
  return 1
}

run() {
  local how="$1" auto="$2"
  local dir home ws
  # The home and the session's workspace side by side: the home is never a workspace.
  dir="$(mktemp -d /tmp/forkd-handoff.XXXXXX)"
  home="$dir/home" ws="$dir/ws"
  mkdir -p "$home" "$ws"
  FORKD_AUTO_BACKGROUND_SECS="$auto" start_forkd "$home" --sim-speed 1
  trap 'stop_forkd; rm -rf "$dir"' RETURN
  echo "You plan work." >"$home/system.md"
  local sid
  sid="$("$forkctl" --json session create --system-file "$home/system.md" --workspace "$ws" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["session_id"])')"
  local script='Plan it.
@sim agent {"description":"plan","prompt":"Plan slowly.\n@sim sleep 30s\n@sim say the plan","subagent_type":"Plan"}
@sim say delegated'
  local sent signal
  sent=$(now)
  "$forkctl" session send "$sid" "$script" >"$home/send.out" 2>&1 &
  if [[ "$how" == bg ]]; then
    sleep 1
    local main
    main="$("$forkctl" --json ps | python3 -c 'import json,sys; print(next(a["agent_id"] for a in map(json.loads, sys.stdin) if a["kind"] == "parent"))')"
    signal=$(now)
    "$forkctl" bg "$main" >/dev/null
  else
    signal=$(python3 -c "print($sent + $auto)")
  fi
  wait_for turn
  local turn_ended
  turn_ended=$(now)
  wait_for typed
  local typed_ended
  typed_ended=$(now)
  printf '| %s | %s | %s |\n' "$how" "$(since "$signal" "$turn_ended")" "$(since "$sent" "$typed_ended")"
}

printf '| signal | signal → parent turn ended, s | send → typed agent ended, s |\n|---|---|---|\n'
run bg 0
run auto 2
