#!/usr/bin/env bash
# forkd's benchmark suite: cache efficiency against the alternatives, daemon overhead, memory and
# disk per child, durability cost and recovery, notification latency. See docs/benchmarks.md.
#
# Usage: scripts/bench.sh [--quick] [--json FILE] [--only FIGURES] [--dir DIR] [--out FILE]
#
#   --quick          a smaller run (under 2 minutes on 2 cores; the full run is under 10)
#   --json FILE      also write every figure and raw measurement as one JSON object
#   --only FIGURES   comma-separated: cache,overhead,memory,durability,notifications,scale,sandbox,
#                    compaction,scaleout,limits,isolation,branches,schemas,traces,faults,
#                    uploads,sandboxload,webhooks,schedules,hooks
#
# The scale-out figure runs its PostgreSQL rows when FORKD_BENCH_DATABASE_URL names a server
# (postgres://user:password@host:5432/postgres, a role that may create databases).
#   --dir DIR        where the temporary databases go (default: $TMPDIR or /tmp); use a disk,
#                    not tmpfs, for honest fsync figures
#   --out FILE       where the Markdown report goes: `-` for stdout only. Default: a full run
#                    (no --quick, no --only) refreshes docs/benchmarks.md; others print only
#
# It builds the `forkd-bench` binary in release (the build is not part of the run time), runs it
# on the embedded sim (no network), and prints the Markdown tables on stdout; progress goes to
# stderr. Nothing is installed; besides the report, nothing outside the temporary folders is
# written.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

out=""
partial=0
args=()
while (($#)); do
  case "$1" in
    -h|--help)
      sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    --out)
      [[ $# -ge 2 ]] || { echo "--out needs a FILE (or -)" >&2; exit 2; }
      out=$2
      shift 2
      continue
      ;;
    --out=*)
      out=${1#--out=}
      ;;
    --quick|--only|--only=*)
      partial=1
      args+=("$1")
      ;;
    *)
      args+=("$1")
      ;;
  esac
  shift
done
if [[ -z $out ]]; then
  if ((partial)); then out=-; else out=docs/benchmarks.md; fi
fi

echo "Building forkd-bench (release)…" >&2
# forkd too: the scale-out figure runs real `forkd serve` processes beside forkd-bench.
cargo build --release --quiet -p forkd-bench -p forkd -p forkctl
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/forkd-bench"

report=$(mktemp)
trap 'rm -f "$report"' EXIT

start=$(date +%s)
"$BIN" "${args[@]}" | tee "$report"
seconds=$(( $(date +%s) - start ))
command="scripts/bench.sh${args[*]:+ ${args[*]}}"
echo "$command: $seconds s (build excluded)" >&2

if [[ $out != - ]]; then
  commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  if [[ -n $(git status --porcelain --untracked-files=no 2>/dev/null) ]]; then
    commit="$commit, with uncommitted changes"
  fi
  {
    cat <<EOF
# Benchmarks

Written by \`scripts/bench.sh\`; run it again to refresh this file.

Command: \`$command\`, $seconds s (build excluded), on $(date -u +%Y-%m-%d), at commit $commit.

Everything runs on the embedded sim (no network, seeded inputs). Each figure says what it is
compared with, and the last table judges every figure against the targets in
\`docs/contracts.md\` ("Performance targets"): \`met\`, \`MISSED by …\`, or \`n/a\` and why.
Ratios and costs are deterministic up to the sim's timing; latencies depend on the machine and on
what else runs on it.

1. **Cache efficiency** (engine + \`SimProvider\` + SQLite, no gRPC): the children's cache-read
   share and the batch's input cost for (a) forks with warm-up gating, (b) the same forks all at
   once, (c) N independent agents launched together, against (d) \`forkd_core::calc\`'s optimum;
   (c′), the same agents staggered by their commits, for comparison only. Every scenario starts
   on a cold sim, at speed 0 and at speed 0.01, where requests sent together overlap as on a real
   provider.
2. **Daemon overhead**: \`ForkBatch\` of 8 children on a ~100k-token session, through the daemon
   (gRPC over its Unix socket) and as the bare \`Engine::fork_batch\` call.
3. **Memory and disk**: one process per point, one batch of N children at 10k and 100k
   prefixes: database bytes and peak RSS added, per extra child, against the prefix's size.
4. **Durability cost and recovery**: transcript appends per second with \`synchronous=NORMAL\`
   and \`FULL\`; rebuilding a 100k-token child's request from the store; 1000 agents interrupted
   and resumed by a new engine, against the same batches without a restart.
5. **Notifications**: 100 subscribers through the engine and through gRPC, one notification at a
   time and in a burst, from the agent's end to each receipt.
6. **Client batches at CI scale**: 100 and 1000 directives over 10k and 100k histories: request
   size, cost against the calculator, wall time per child, peak RSS.
7. **The sandbox's cost per Bash call**, against the same call unsandboxed.
8. **Long sessions**: 40 turns of large tool output on a 32k window, compacted.
9. **Several daemons on one PostgreSQL** (its PostgreSQL rows need \`FORKD_BENCH_DATABASE_URL\`):
   real \`forkd serve\` processes against one sim-server — \`ForkBatch\` latency, children per
   second, notification latency across daemons, adoption after SIGKILL — against one daemon on
   SQLite.
10. **Client batches at the provider's limits**: the \`anthropic\` provider against
   \`forkd sim-server --rate-limit\` — 1000 children at 50 requests/s and 400k input tokens/s,
   200 at 5 requests/s — wall time against the floor the limits set, 429s as a share of
   requests, the same batch without limits, and another tenant's turn during the batch.
10b. **The limiter at providers that limit otherwise**: the same batch against a sim-server
   counting in a token bucket, a sliding or a fixed window, stating Anthropic's headers, only
   \`retry-after\`, or nothing — 200 children at 20 requests/s and 1000 at 50.
11. **Isolated children**: 100 and 1000 children with \`isolation: copy\`, one edit each, on a
   generated workspace of 10 000 files (~100 MB): the snapshot's time and disk, each copy's
   disk, a child's view setup (p50/p99), applying the batch, and the cache-read share against
   the same batch without isolation.
12. **Branches**: a branch of a 100k-token session from an earlier turn: how long it takes, what
   it stores, and how much of its history its first request reads from the cache.
13. **Output schemas**: one batch over a ~48.5k-token context with an output schema, beside the
   same batch without: the cache read by children 2..N and the input cost.
14. **Traces**: \`ForkBatch\` latency and a 100-child batch's wall time with OTLP export on,
   against the same daemon with export off.
15. **A full disk**: a batch whose SQLite database fills mid-run (\`max_page_count\`), and the time
   from the space returning to the daemon serving again and to the batch's end, without a
   restart.
17. **The sandbox under load**: 1000 children of one batch, each running two Bash commands and a
   Read, sandboxed against full-access and again after 200 more sessions: wall time, slow
   database acquires, a tool call's p50/p99 and the runtime's lag.

EOF
    cat "$report"
  } > "$out.tmp"
  mv "$out.tmp" "$out"
  echo "Report written to $out" >&2
fi
