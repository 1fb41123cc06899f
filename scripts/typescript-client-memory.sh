#!/usr/bin/env bash
# The TypeScript client's memory at CI scale: a Node process that forks N children through
# `Client` and waits on every notification (clients/typescript/test/wait_many.mjs), against a
# real daemon (sim at speed 0), for 100 and 1000 children: its peak RSS and wall. Needs the
# package installed and built (`npm ci && npm run build` in clients/typescript).
#
#   scripts/typescript-client-memory.sh            # builds release binaries first
#   FORKD_BIN_DIR=target/debug scripts/typescript-client-memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/lib.sh
forkd_binaries
[[ -f clients/typescript/dist/index.js ]] || {
  echo "build the client first: (cd clients/typescript && npm ci && npm run build)" >&2; exit 1; }

home="$(mktemp -d /tmp/forkd-tsmem.XXXXXX)"
# Beside the home, never in it: the home is never a workspace.
ws="$(mktemp -d /tmp/forkd-tsmem-ws.XXXXXX)"
cleanup() {
  stop_forkd
  rm -rf "$home" "$ws"
}
trap cleanup EXIT
start_forkd "$home" --sim-speed 0

printf '| N | client peak RSS, MiB | wall s | completed |\n|---|---|---|---|\n'
for n in 100 1000; do
  start=$(date +%s.%N)
  out=$(node clients/typescript/test/wait_many.mjs "unix:$home/forkd.sock" "$ws" "$n")
  end=$(date +%s.%N)
  python3 -c "import json, sys; r = json.loads(sys.argv[1]); print(f'| $n | {r[\"peakRssMiB\"]} | {float(sys.argv[3]) - float(sys.argv[2]):.2f} | {r[\"completed\"]} |')" \
    "$out" "$start" "$end"
done
