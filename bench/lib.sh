# bench/lib.sh: what the shell benches share; sourced, never run.
#
# om_bench_tmp NAME: a fresh temp dir in $tmp (om-NAME.XXXXXX under
# $TMPDIR), an empty $pids array, and traps so that on any exit every pid
# in $pids is stopped (TERM, up to 2 s to drain, then KILL, then reaped)
# and $tmp removed; INT and TERM exit 130 and 143 through that path.
# om_bench_stop PID: stop one process the bench started (as on exit: TERM,
# up to 2 s, KILL, reaped) and drop it from $pids, so that a bench can
# restart its contenders with another configuration within one run.
# port_busy PORT: whether something accepts on 127.0.0.1:PORT.
# wait_port PORT PID NAME: until PORT accepts (return), or PID exits or
# $wait_port_s seconds pass (default 10): then say so through the script's
# log(), show $tmp/NAME.out and $tmp/NAME.log, and exit 1.
# om_bench_need TOOL...: each TOOL on PATH (which gains /usr/sbin, where
# nginx and haproxy live), or say which is missing and exit 1.
# om_bench_ports_free HINT PORT...: each PORT free on 127.0.0.1, or say
# which is taken and which variable (HINT) moves the bench, and exit 1.
# om_nginx_temp_paths PREFIX: nginx's five temp-path directives under
# PREFIX, so that an nginx started by a bench never writes outside $tmp.
# om_bench_tree PID: PID and its descendants (nginx's master and workers).
# om_bench_cpu_ticks PID: utime+stime of om_bench_tree PID, in clock ticks
# (getconf CLK_TCK per second).

# om_bench_reap PID: after a TERM, up to 2 s to drain, then KILL, reaped
om_bench_reap() {
  for _ in $(seq 20); do
    kill -0 "$1" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

om_bench_cleanup() {
  local pid
  for pid in "${pids[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    om_bench_reap "$pid"
  done
  rm -rf "$tmp"
}

om_bench_stop() {
  local pid keep=()
  kill -TERM "$1" 2>/dev/null || true
  om_bench_reap "$1"
  for pid in "${pids[@]}"; do
    [ "$pid" = "$1" ] || keep+=("$pid")
  done
  pids=("${keep[@]}")
}

om_bench_tmp() {
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/om-$1.XXXXXX")
  pids=()
  trap om_bench_cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
}

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() {
  local _
  for _ in $(seq $((${wait_port_s:-10} * 10))); do
    if ! kill -0 "$2" 2>/dev/null; then
      log "$3 exited at start; its output:"
      cat "$tmp/$3.out" "$tmp/$3.log" >&2 2>/dev/null || true
      exit 1
    fi
    port_busy "$1" && return 0
    sleep 0.1
  done
  log "$3 did not listen on 127.0.0.1:$1 within ${wait_port_s:-10} s"
  exit 1
}

om_bench_need() {
  local t
  PATH="$PATH:/usr/sbin"
  for t in "$@"; do
    command -v "$t" >/dev/null 2>&1 && continue
    log "$t not found (run scripts/deps-bench)"
    exit 1
  done
}

om_bench_ports_free() {
  local hint=$1 p
  shift
  for p in "$@"; do
    port_busy "$p" || continue
    log "port $p on 127.0.0.1 is taken; set $hint"
    exit 1
  done
}

om_nginx_temp_paths() {
  local d
  for d in client_body proxy fastcgi uwsgi scgi; do
    printf '  %s_temp_path %s%s;\n' "$d" "$1" "${d#client_}"
  done
}

om_bench_tree() {
  local p
  echo "$1"
  for p in $(pgrep -P "$1" || true); do om_bench_tree "$p"; done
}

# /proc/PID/stat fields 14 and 15, after the parenthesized comm; a
# process's line covers all its threads
om_bench_cpu_ticks() {
  local p total=0 t
  for p in $(om_bench_tree "$1"); do
    t=$(awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$p/stat" \
      2>/dev/null) || continue
    total=$((total + t))
  done
  echo "$total"
}
