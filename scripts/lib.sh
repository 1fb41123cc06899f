# Shared by the scripts that drive a real `forkd serve`: the binaries, and one daemon on a home.
# Source it from the repository root: `source scripts/lib.sh`.

# Sets FORKD and FORKCTL: release binaries, built first unless FORKD_BIN_DIR names a folder that
# holds them already (e.g. FORKD_BIN_DIR=target/debug).
forkd_binaries() {
  local bin_dir="${FORKD_BIN_DIR:-target/release}"
  if [[ -z "${FORKD_BIN_DIR:-}" ]]; then
    cargo build --release --locked --bin forkd --bin forkctl >&2
  fi
  # Relative to the repository's root, or absolute.
  [[ "$bin_dir" == /* ]] || bin_dir="$(pwd)/$bin_dir"
  FORKD="$bin_dir/forkd"
  FORKCTL="$bin_dir/forkctl"
}

# start_forkd HOME [SERVE_ARGS...]: starts `forkd serve` on HOME (exported as FORKD_HOME, with
# FORKD_ADDR its socket), its log in HOME/forkd.log, and waits until the socket is there. Sets
# DAEMON_PID.
start_forkd() {
  local home=$1
  shift
  export FORKD_HOME="$home" FORKD_ADDR="unix://$home/forkd.sock"
  "$FORKD" serve "$@" >"$home/forkd.log" 2>&1 &
  DAEMON_PID=$!
  for _ in $(seq 1 100); do
    [[ -S "$home/forkd.sock" ]] && return 0
    sleep 0.1
  done
  cat "$home/forkd.log" >&2
  echo "forkd did not start" >&2
  return 1
}

# Stops the daemon start_forkd started last, if it still runs.
stop_forkd() {
  if [[ -n "${DAEMON_PID:-}" ]] && kill -0 "$DAEMON_PID" 2>/dev/null; then
    kill "$DAEMON_PID" 2>/dev/null || true
    wait "$DAEMON_PID" 2>/dev/null || true
  fi
}
