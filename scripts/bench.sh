#!/usr/bin/env bash
# forkd's benchmark suite: cache efficiency against the alternatives, daemon overhead, memory and
# disk per child, durability cost and recovery, notification latency. See README.md, "Benchmarks".
#
# Usage: scripts/bench.sh [--quick] [--json FILE] [--only FIGURES] [--dir DIR]
#
#   --quick          a smaller run (under 2 minutes on 2 cores; the full run is under 10)
#   --json FILE      also write every figure and raw measurement as one JSON object
#   --only FIGURES   comma-separated: cache,overhead,memory,durability,notifications
#   --dir DIR        where the temporary databases go (default: $TMPDIR or /tmp); use a disk,
#                    not tmpfs, for honest fsync figures
#
# It builds the `forkd-bench` binary in release (the build is not part of the run time), runs it
# on the embedded sim (no network), and prints the Markdown tables on stdout; progress goes to
# stderr. Nothing is installed and nothing outside the temporary folders is written.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

case "${1:-}" in
  -h|--help)
    sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
esac

echo "Building forkd-bench (release)…" >&2
cargo build --release --quiet -p forkd-bench
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/forkd-bench"

start=$(date +%s)
"$BIN" "$@"
echo "scripts/bench.sh $*: $(( $(date +%s) - start )) s (build excluded)" >&2
