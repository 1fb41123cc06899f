#!/usr/bin/env bash
# forkctl's memory at CI scale: `forkctl run FILE --wait --junit OUT` against a real daemon (sim
# at speed 0) for batches of 100 and 1000 children, and the client's peak RSS for each (GNU
# time's %M). A client that stays flat in memory grows by far less than 10x between the two.
#
#   scripts/forkctl-memory.sh            # builds release binaries first
#   FORKD_BIN_DIR=target/debug scripts/forkctl-memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/lib.sh
forkd_binaries
[[ -x /usr/bin/time ]] || { echo "needs GNU time (/usr/bin/time; Debian: apt-get install time)" >&2; exit 1; }

home="$(mktemp -d /tmp/forkd-ctlmem.XXXXXX)"
cleanup() {
  stop_forkd
  rm -rf "$home"
}
trap cleanup EXIT
start_forkd "$home" --sim-speed 0

echo "You are a careful reviewer." >"$home/system.md"
printf '| N | forkctl peak RSS, MiB | wall s | JUnit cases |\n|---|---|---|---|\n'
for n in 100 1000; do
  file="$home/batch-$n.yaml"
  {
    echo "key: memory-$n-$$"
    echo "session:"
    echo "  system_file: system.md"
    echo "  context_files: [$(pwd)/README.md, $(pwd)/ARCHITECTURE.md]"
    echo "directives:"
    for i in $(seq 1 "$n"); do
      echo "  - \"Review file $i of the change; say what is wrong.\""
    done
  } >"$file"
  start=$(date +%s.%N)
  /usr/bin/time -f '%M' -o "$home/rss-$n" \
    "$FORKCTL" run "$file" --wait --junit "$home/junit-$n.xml" >"$home/run-$n.out" 2>&1 || {
    cat "$home/run-$n.out" >&2; exit 1; }
  end=$(date +%s.%N)
  cases=$(grep -c '<testcase' "$home/junit-$n.xml")
  python3 -c "import sys; kb, s, e = int(open(sys.argv[1]).read().split()[-1]), float(sys.argv[2]), float(sys.argv[3]); print(f'| $n | {kb/1024:.1f} | {e-s:.2f} | $cases |')" \
    "$home/rss-$n" "$start" "$end"
done
