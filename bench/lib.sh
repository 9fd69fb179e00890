# bench/lib.sh: what the shell benches share; sourced, never run.
#
# om_bench_tmp NAME: a fresh temp dir in $tmp (om-NAME.XXXXXX under
# $TMPDIR), an empty $pids array, and traps so that on any exit every pid
# in $pids is stopped (TERM, up to 2 s to drain, then KILL, then reaped)
# and $tmp removed; INT and TERM exit 130 and 143 through that path.
# port_busy PORT: whether something accepts on 127.0.0.1:PORT.

om_bench_cleanup() {
  local pid
  for pid in "${pids[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 20); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$tmp"
}

om_bench_tmp() {
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/om-$1.XXXXXX")
  pids=()
  trap om_bench_cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
}

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
