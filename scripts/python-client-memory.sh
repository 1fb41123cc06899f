#!/usr/bin/env bash
# The Python client's memory at CI scale: a process that forks N children through
# `forkd.Client` and waits on every notification (clients/python/tests/wait_many.py), against a
# real daemon (sim at speed 0), for 100 and 1000 children: its peak RSS (ru_maxrss) and wall.
# The client goes into a virtual environment of its own (FORKD_PY_VENV, default
# /var/tmp/forkd-python-memory-venv), from this tree.
#
#   scripts/python-client-memory.sh            # builds release binaries first
#   FORKD_BIN_DIR=target/debug scripts/python-client-memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/lib.sh
forkd_binaries

venv="${FORKD_PY_VENV:-/var/tmp/forkd-python-memory-venv}"
[[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --force-reinstall ./clients/python </dev/null
rm -rf clients/python/build

home="$(mktemp -d /tmp/forkd-pymem.XXXXXX)"
# Beside the home, never in it: the home is never a workspace.
ws="$(mktemp -d /tmp/forkd-pymem-ws.XXXXXX)"
cleanup() {
  stop_forkd
  rm -rf "$home" "$ws"
}
trap cleanup EXIT
start_forkd "$home" --sim-speed 0

printf '| N | client peak RSS, MiB | wall s | completed |\n|---|---|---|---|\n'
for n in 100 1000; do
  start=$(date +%s.%N)
  out=$("$venv/bin/python" clients/python/tests/wait_many.py "unix:$home/forkd.sock" "$ws" "$n")
  end=$(date +%s.%N)
  python3 -c "import json, sys; r = json.loads(sys.argv[1]); print(f'| $n | {r[\"peak_rss_mib\"]} | {float(sys.argv[3]) - float(sys.argv[2]):.2f} | {r[\"completed\"]} |')" \
    "$out" "$start" "$end"
done
