#!/usr/bin/env bash
# No child hangs a batch (docs/contracts.md, "Limits"): a batch of 10 whose children 8 to 10 hang
# — a Bash call that sleeps for an hour, a model stream that stalls after its first token, a
# loop of tool calls that never ends — forked with `--timeout` and waited for. It prints the
# wait's notifications and summary, and the batch's wall time beside the timeout.
#
#   scripts/hung-children.sh                       # builds release binaries first; --timeout 5s
#   TIMEOUT=10s FORKD_BIN_DIR=target/debug scripts/hung-children.sh
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/lib.sh
forkd_binaries
timeout="${TIMEOUT:-5s}"

home="$(mktemp -d /tmp/forkd-hung.XXXXXX)"
# Beside the home, never in it: the home is never a workspace.
ws="$(mktemp -d /tmp/forkd-hung-ws.XXXXXX)"
cleanup() {
  stop_forkd
  rm -rf "$home" "$ws"
}
trap cleanup EXIT
# The sim at a realistic pace (speed 1): the quick children take a second or two.
start_forkd "$home" --sim-speed 1

echo "You are a careful engineer." >"$home/system.md"
sid=$("$FORKCTL" session create --system-file "$home/system.md" --workspace "$ws" \
  --permission-mode bypassPermissions)

args=()
for i in 1 2 3 4 5 6 7; do
  args+=(-d "Check part $i.
@sim say part $i is fine")
done
args+=(-d 'Wait for the build.
@sim tool Bash {"command":"sleep 3600"}
@sim say built')
args+=(-d 'Explain the design.
@sim stall
@sim say never said')
loop='Poll until green.'
for _ in $(seq 1 500); do
  loop+=$'\n@sim tool Bash {"command":"sleep 0.5"}\n@sim think not yet'
done
args+=(-d "$loop
@sim say green")

echo "-- asked first (nothing forked):"
"$FORKCTL" fork "$sid" "${args[@]}" --timeout "$timeout" --dry-run
start=$(date +%s.%N)
status=0
"$FORKCTL" fork "$sid" "${args[@]}" --timeout "$timeout" --wait || status=$?
end=$(date +%s.%N)
python3 -c "import sys; print(f'wall {float(sys.argv[2]) - float(sys.argv[1]):.2f} s, --timeout {sys.argv[3]}, forkctl exit {sys.argv[4]}')" \
  "$start" "$end" "$timeout" "$status"
echo "-- the same batch asked again, now that runs have ended here:"
"$FORKCTL" fork "$sid" "${args[@]}" --timeout "$timeout" --dry-run
