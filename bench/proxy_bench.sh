#!/usr/bin/env bash
# bench/proxy_bench.sh [--quick] OPENMESH_BIN: the data-plane benchmark
# (docs/BENCHMARKS.md "Data plane"). `make bench` runs it after the C benches.
#
# Two passes, each against nginx `proxy_pass` and HAProxy in front of the
# same nginx upstream (`return 200 "ok"`, and a 64 KiB file at /64k), with
# wrk on loopback:
#
# 1. The headline: what users deploy. Nothing pinned, every contender on
#    every core: `openmesh proxy` (with `--workers $(nproc)` when its --help
#    lists the flag, else its one loop), nginx `worker_processes auto` with
#    an upstream keepalive pool, HAProxy 2.6 with its default threads (no
#    nbthread line) and `http-reuse always`, and nginx_b, a second nginx
#    with nginx's config: the run's A/A control, compared with nginx the
#    way the proxy is, so its ratio is the noise of every other ratio. The
#    upstream is nginx `worker_processes auto` on OM_BENCH_PEERS (256)
#    loopback ports. Scenarios (name: peers, selection, request):
#      base_cN     2 peers, unkeyed (the canary policy, no user: its decision
#                  comes from the proxy's decision cache), GET / of "ok";
#                  at N = 32, 200 and 1,000 connections;
#      policy_cN   the same with a distinct user on every request
#                  (bench/wrk/users.lua), so the canary policy's Lua runs
#                  per request; nginx and HAProxy have no equivalent and
#                  proxy plainly (round robin); at 32, 200 and 1,000;
#      peers256    base at 200 connections over 256 peers;
#      keyed256    256 peers, keyed on x-session from 1,024 sessions
#                  (bench/wrk/sessions.lua, examples/policies/keyed_affinity.lua;
#                  nginx `hash $http_x_session consistent`, HAProxy
#                  `balance hdr(x-session)` + `hash-type consistent`), 200;
#      post4k      base with a 4 KiB POST body (bench/wrk/post4k.lua), 200;
#      resp64k     base with GET /64k, a 64 KiB response, 200.
#    Per scenario: the four contenders start fresh, answer one sanity call,
#    run 1 s each to warm up, then OM_BENCH_ROUNDS (8) rounds of one
#    `wrk -t$(nproc)` run each, OM_BENCH_DURATION (3) s per run, the order
#    of the contenders rotated by one place every round. A ratio is the
#    median of the per-round ratios (each from runs of the same round),
#    printed with its min and max; CPU per request is the contender's
#    utime+stime (/proc/PID/stat: every thread, and every child process)
#    over the run, divided by the requests wrk counted.
# 2. The diagnostic: CPU per request of the chain, one core. Every process
#    (a one-worker upstream on two ports, the proxy with one worker, nginx
#    with one worker, HAProxy `nbthread 1`, nginx_b, wrk) pinned to CPU 0
#    (`taskset -c 0`): wrk -t1 -c50, OM_BENCH_DIAG_DURATION (10) s per run,
#    OM_BENCH_DIAG_ROUNDS (2) rounds, interleaved (proxy nginx haproxy,
#    then haproxy nginx proxy); then added latency at one connection, wrk
#    -t1 -c1, OM_BENCH_LAT_DURATION (2) s per run, OM_BENCH_LAT_ROUNDS (12)
#    rounds in a balanced order (lat_order below), every run's quantile
#    function written by a wrk done() script and the runs of a contender
#    pooled; a figure is the pooled p50 (p99) through a proxy minus the
#    pooled p50 (p99) straight to the upstream. Its figures are named
#    `diag_pinned_*`: they measure the work per call, not a deployment.
#
# Prints `name value (bar: ...)` for every figure with a bar or a ratio
# (ratios with `min`, `max` and the rounds), `name value unit` for the
# rest; each run's detail goes to stderr. Exits non-zero when a contender
# fails to start or answers anything but 2xx. Loopback only: ports
# OM_BENCH_PORT_BASE..+6 (default 19480) for the proxies, the upstream on
# OM_BENCH_PEER_PORT_BASE.. (20100, one port per peer); a temp dir for
# every config and log; the EXIT trap stops everything it started (by pid)
# and removes the temp dir. The default run takes about 20 minutes (the
# headline 16, the diagnostic 4); --quick (2 rounds of 2 s everywhere)
# about 5, to check the script.
#
# Environment: OM_BENCH_ROUNDS (8), OM_BENCH_DURATION (3 s), OM_BENCH_SCENARIOS
# (the headline scenarios to run, space-separated, default all of the
# above), OM_BENCH_PEERS (256: the peers of peers256 and keyed256),
# OM_BENCH_WORKERS (the proxy's --workers, default nproc, when the binary
# has the flag), OM_BENCH_WRK_THREADS (nproc), OM_BENCH_DIAG (1; 0 skips
# the diagnostic), OM_BENCH_DIAG_ROUNDS (2), OM_BENCH_DIAG_DURATION (10 s),
# OM_BENCH_LAT_ROUNDS (12), OM_BENCH_LAT_DURATION (2 s),
# OM_BENCH_CONNECTIONS (50: the diagnostic's), OM_BENCH_PORT_BASE (19480),
# OM_BENCH_PEER_PORT_BASE (20100), OM_BENCH_POLICY (the proxy's policy in
# the unkeyed scenarios and the diagnostic, default
# examples/policies/canary.lua), OM_BENCH_QDIR (a directory to keep every
# diagnostic latency run's quantile function in), OM_BENCH_PERF (a
# perf.data path: profile the proxy over one extra diagnostic run first),
# OM_BENCH_CLIENT (wrk; c1 takes the diagnostic latency runs with
# bench/c1_client.c instead, a blocking closed-loop client built beside the
# benches: two syscalls per call where wrk makes six).
set -euo pipefail

quick=0
if [ "${1:-}" = --quick ]; then
  quick=1
  shift
fi
bin=${1:-}
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
  echo "usage: bash bench/proxy_bench.sh [--quick] PATH/TO/openmesh" >&2
  exit 2
fi
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
policy=${OM_BENCH_POLICY:-$here/../examples/policies/canary.lua}
keyed_policy=$here/../examples/policies/keyed_affinity.lua

ncpu=$(nproc)
if [ "$quick" = 1 ]; then q_r=2 q_d=2; else q_r="" q_d=""; fi
rounds=${q_r:-${OM_BENCH_ROUNDS:-8}}
duration=${q_d:-${OM_BENCH_DURATION:-3}}
diag_rounds=${q_r:-${OM_BENCH_DIAG_ROUNDS:-2}}
diag_duration=${q_d:-${OM_BENCH_DIAG_DURATION:-10}}
lat_rounds=${q_r:-${OM_BENCH_LAT_ROUNDS:-12}}
lat_duration=${q_d:-${OM_BENCH_LAT_DURATION:-2}}
conns=${OM_BENCH_CONNECTIONS:-50}
base=${OM_BENCH_PORT_BASE:-19480}
peer_base=${OM_BENCH_PEER_PORT_BASE:-20100}
npeers=${OM_BENCH_PEERS:-256}
wrk_threads=${OM_BENCH_WRK_THREADS:-$ncpu}
diag_pass=${OM_BENCH_DIAG:-1}
all_scenarios="base_c32 base_c200 base_c1000 policy_c32 policy_c200 policy_c1000 peers256 keyed256 post4k resp64k"
scenarios=${OM_BENCH_SCENARIOS:-$all_scenarios}
lat_client=${OM_BENCH_CLIENT:-wrk}
for s in $scenarios; do
  case " $all_scenarios " in
  *" $s "*) ;;
  *)
    echo "proxy_bench: OM_BENCH_SCENARIOS: unknown scenario '$s' (known: $all_scenarios)" >&2
    exit 2
    ;;
  esac
done
for v in rounds duration diag_rounds diag_duration lat_rounds lat_duration \
  conns npeers wrk_threads; do
  if ! [[ ${!v} =~ ^[1-9][0-9]*$ ]]; then
    echo "proxy_bench: $v must be a positive integer, not '${!v}'" >&2
    exit 2
  fi
done
if [ "$npeers" -lt 2 ]; then
  echo "proxy_bench: OM_BENCH_PEERS must be at least 2, not $npeers" >&2
  exit 2
fi
case $lat_client in
wrk) ;;
c1)
  c1_bin=$(dirname "$bin")/../bench/c1_client
  if [ ! -x "$c1_bin" ]; then
    echo "proxy_bench: $c1_bin not found (build the bench targets)" >&2
    exit 2
  fi
  ;;
*)
  echo "proxy_bench: OM_BENCH_CLIENT must be wrk or c1, not '$lat_client'" >&2
  exit 2
  ;;
esac

# The proxy's --workers, when this binary has it; the diagnostic gives it 1.
workers_flag=0
if "$bin" proxy --help 2>&1 | grep -q -- '--workers'; then workers_flag=1; fi
workers=${OM_BENCH_WORKERS:-$ncpu}
if [ -n "${OM_BENCH_WORKERS:-}" ] && [ "$workers_flag" = 0 ]; then
  echo "proxy_bench: OM_BENCH_WORKERS is set but '$bin proxy --help' lists no --workers" >&2
  exit 2
fi

proxy_port=$((base + 2))
admin_port=$((base + 3))
nginx_port=$((base + 4))
haproxy_port=$((base + 5))
nginx_b_port=$((base + 6))

log() { echo "proxy_bench: $*" >&2; }

# shellcheck source=bench/lib.sh
. "$here/lib.sh"
om_bench_need wrk nginx haproxy taskset curl
om_bench_tmp proxy-bench
# OM_BENCH_QDIR: keep every diagnostic latency run's quantile function
# there (q_pinned.CONTENDER.ROUND), e.g. to pool several runs
keep_qdir() {
  if [ -n "${OM_BENCH_QDIR:-}" ]; then
    mkdir -p "$OM_BENCH_QDIR" && cp "$tmp"/q_* "$OM_BENCH_QDIR"/ 2>/dev/null ||
      true
  fi
}
trap 'keep_qdir; om_bench_cleanup' EXIT

om_bench_ports_free "OM_BENCH_PORT_BASE or OM_BENCH_PEER_PORT_BASE" $proxy_port $admin_port $nginx_port $haproxy_port $nginx_b_port \
  $(seq "$peer_base" $((peer_base + npeers - 1)))

# nginx_common NAME WORKERS: nginx's temp paths and pid file go to the
# temp dir, never /var; the workers run as the bench's user (under root
# they would be nobody's, and the temp dir is 0700)
nginx_common() {
  [ "$(id -u)" != 0 ] || echo "user $(id -un);"
  cat <<EOT
worker_processes $2;
worker_rlimit_nofile 16384;
pid $tmp/$1.pid;
error_log $tmp/$1.log warn;
events { worker_connections 8192; }
EOT
}
nginx_http_common() {
  cat <<EOT
  access_log off;
  keepalive_timeout 300s;
  keepalive_requests 1000000000;
  $(om_nginx_temp_paths "$tmp/$1-")
EOT
}

# The upstream's 64 KiB response
mkdir -p "$tmp/www"
head -c 65536 /dev/zero | tr '\0' 'x' >"$tmp/www/64k"
head -c 4096 /dev/zero | tr '\0' x >"$tmp/post4k"

# upstream_conf WORKERS PEERS: nginx on PEERS ports from peer_base
upstream_conf() {
  local i
  nginx_common upstream "$1"
  echo "http {"
  nginx_http_common upstream
  echo "  server {"
  for i in $(seq 0 $(($2 - 1))); do
    echo "    listen 127.0.0.1:$((peer_base + i)) backlog=4096;"
  done
  cat <<EOT
    root $tmp/www;
    location / { return 200 "ok"; }
    location = /64k { default_type application/octet-stream; }
    location = /om-bench-status { stub_status; }
  }
}
EOT
}

# nginx_conf NAME PORT WORKERS PEERS KEYED: the nginx proxy (nginx, and
# nginx_b, its A/A twin); KEYED 1 hashes on x-session, consistently
nginx_conf() {
  local i
  nginx_common "$1" "$3"
  echo "http {"
  nginx_http_common "$1"
  echo "  upstream bench {"
  [ "$5" = 0 ] || echo "    hash \$http_x_session consistent;"
  for i in $(seq 0 $(($4 - 1))); do
    echo "    server 127.0.0.1:$((peer_base + i));"
  done
  cat <<EOT
    keepalive 1024;
    keepalive_requests 1000000000;
    keepalive_timeout 300s;
  }
  server {
    listen 127.0.0.1:$2 backlog=4096;
    location / {
      proxy_pass http://bench;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
EOT
}

# haproxy_conf THREADS PEERS KEYED: THREADS "" keeps HAProxy's default
haproxy_conf() {
  local i
  echo "global"
  [ -z "$1" ] || echo "  nbthread $1"
  cat <<EOT
  maxconn 8192
defaults
  mode http
  timeout connect 5s
  timeout client 300s
  timeout server 300s
  timeout http-keep-alive 300s
frontend bench
  bind 127.0.0.1:$haproxy_port
  default_backend bench
backend bench
  http-reuse always
EOT
  if [ "$3" = 0 ]; then
    echo "  balance roundrobin"
  else
    echo "  balance hdr(x-session)"
    echo "  hash-type consistent"
  fi
  for i in $(seq 0 $(($2 - 1))); do
    echo "  server p$i 127.0.0.1:$((peer_base + i))"
  done
}

# static_json PEERS: every instance stable (version v1), so the canary
# policy keeps them all
static_json() {
  local i sep=""
  printf '{"services": {"bench": {"revision": 1, "instances": [\n'
  for i in $(seq 0 $(($1 - 1))); do
    printf '%s  {"id": "stable-%d", "url": "http://127.0.0.1:%d", "metadata": {"version": "v1"}}' \
      "$sep" "$i" $((peer_base + i))
    sep=$',\n'
  done
  printf ']}}}\n'
}

declare -A pid_of
start() { # NAME PORT CMD...
  local name=$1 port=$2
  shift 2
  "$@" >"$tmp/$name.out" 2>&1 &
  pid_of[$name]=$!
  pids+=("$!")
  wait_port "$port" "${pid_of[$name]}" "$name"
}
stop() { # NAME...: stop what start started, and wait until its port is free
  local name
  for name in "$@"; do
    om_bench_stop "${pid_of[$name]}"
    unset "pid_of[$name]"
  done
}

declare -A port_of=([direct]=$peer_base [proxy]=$proxy_port
  [nginx]=$nginx_port [haproxy]=$haproxy_port [nginx_b]=$nginx_b_port)

# start_contenders PIN PROXY_WORKERS NGINX_WORKERS HAPROXY_THREADS PEERS
# KEYED POLICY: the four proxies, fresh
start_contenders() {
  local pin_=$1 pw=$2 nw=$3 ht=$4 np=$5 keyed=$6 pol=$7
  local -a wflag=()
  [ "$pw" = "" ] || wflag=(--workers "$pw")
  static_json "$np" >"$tmp/static.json"
  nginx_conf nginx "$nginx_port" "$nw" "$np" "$keyed" >"$tmp/nginx.conf"
  nginx_conf nginx_b "$nginx_b_port" "$nw" "$np" "$keyed" >"$tmp/nginx_b.conf"
  haproxy_conf "$ht" "$np" "$keyed" >"$tmp/haproxy.cfg"
  start proxy "$proxy_port" $pin_ "$bin" proxy --listen "127.0.0.1:$proxy_port" \
    --admin "127.0.0.1:$admin_port" --policy "$pol" \
    --static "$tmp/static.json" --log-level warn "${wflag[@]}"
  start nginx "$nginx_port" $pin_ nginx -p "$tmp" -e "$tmp/nginx.log" \
    -c "$tmp/nginx.conf" -g "daemon off;"
  start nginx_b "$nginx_b_port" $pin_ nginx -p "$tmp" -e "$tmp/nginx_b.log" \
    -c "$tmp/nginx_b.conf" -g "daemon off;"
  start haproxy "$haproxy_port" $pin_ haproxy -db -f "$tmp/haproxy.cfg"
}

# sanity PATH METHOD: one call through each contender answers 200 with the
# upstream's body ("ok", or the 64 KiB file), the proxy's from a stable peer
sanity() {
  local path=$1 method=$2 name want
  local -a extra=(-H "Host: bench" -H "x-session: s-1")
  [ "$method" = GET ] || extra+=(-X "$method" --data-binary "@$tmp/post4k")
  for name in direct proxy nginx haproxy nginx_b; do
    if ! curl -sS -D "$tmp/head" -o "$tmp/body" "${extra[@]}" \
      "http://127.0.0.1:${port_of[$name]}$path" ||
      ! head -1 "$tmp/head" | grep -q " 200"; then
      log "$name does not answer 200 to $method $path:"
      cat "$tmp/head" "$tmp/body" >&2 || true
      exit 1
    fi
    if [ "$path" = /64k ]; then want=65536; else want=2; fi
    if [ "$(wc -c <"$tmp/body")" != "$want" ]; then
      log "$name answered $method $path with $(wc -c <"$tmp/body") bytes, not $want"
      exit 1
    fi
  done
  curl -sS -D "$tmp/head" -o /dev/null -H "Host: bench" \
    "http://127.0.0.1:$proxy_port$path"
  if ! grep -qi '^x-openmesh-peer: stable-' "$tmp/head"; then
    log "the proxy did not route through a stable peer:"
    cat "$tmp/head" >&2
    exit 1
  fi
}

clk_tck=$(getconf CLK_TCK)

# to_us VALUE: wrk's "82.00us", "1.23ms", "1.01s" in microseconds
to_us() {
  awk -v v="$1" 'BEGIN {
    n = v + 0
    if (v ~ /us$/) m = 1; else if (v ~ /ms$/) m = 1000;
    else if (v ~ /s$/) m = 1000000; else m = -1
    if (m < 0) { print "nan"; exit }
    printf "%.2f", n * m }'
}

# upstream_accepts: the connections the upstream has accepted so far
# (nginx stub_status, over all its workers), this call's own excluded
upstream_accepts() {
  curl -sS "http://127.0.0.1:$peer_base/om-bench-status" |
    awk 'NR == 3 { print $1 - 1 }'
}

# policy_counts: "HITS MISSES" of the proxy's decision cache so far, from
# its admin /metrics (summed over label sets); "" when it has no such
# counters
policy_counts() {
  curl -sS "http://127.0.0.1:$admin_port/metrics" | awk '
    $1 ~ /^openmesh_proxy_policy_cache_hits_total/ { h += $NF; seen = 1 }
    $1 ~ /^openmesh_proxy_policy_cache_misses_total/ { m += $NF; seen = 1 }
    END { if (seen) printf "%d %d", h, m }'
}

# The quantile function of one run: wrk's percentile at p = 0.01 ... 100 %
# in steps of 0.01 (whole microseconds), after the run's request count, to
# the file named by OM_BENCH_QFILE. Pooling these reconstructs the
# distribution of all the runs to within 0.01 % of each run's calls.
cat >"$tmp/quantiles.lua" <<'EOT'
done = function(summary, latency, requests)
  local f = assert(io.open(os.getenv("OM_BENCH_QFILE"), "w"))
  f:write("n ", summary.requests, "\n")
  for k = 1, 10000 do
    f:write(latency:percentile(k / 100), "\n")
  end
  f:close()
end
EOT

# pooled P FILES...: the P-th percentile (us) of the runs' pooled
# distribution; each line of a run's quantile function stands for 1/10000
# of its requests
pooled() {
  local p=$1
  shift
  awk -v p="$p" '
    FNR == 1 { n = $2; total += n; next }
    { v = $1 + 0; mass[v] += n / 10000; if (v > max) max = v }
    END {
      if (total == 0) { print "nan"; exit }
      want = p / 100 * total
      for (v = 0; v <= max; v++) {
        if (v in mass) { acc += mass[v]; if (acc >= want - 1e-9) break }
      }
      printf "%.2f", v
    }' "$@"
}

pin=""
threads=1
wrk_script=""
path=/
# run NAME CONNS SECONDS [QFILE]: one wrk run against NAME (wrk -t$threads,
# $wrk_script if set, GET or the script's method on $path, under $pin);
# sets rps, reqs, p50, p99 (us), cpu_us (the contender's CPU per request,
# us; "" for direct) and upc (new upstream connections per request: the
# upstream's accepts over the run, divided by the requests); with QFILE,
# the run's quantile function is written there
run() {
  local name=$1 c=$2 secs=$3 qfile=${4:-} out c0=0 c1=0 errs non2xx t=$threads
  local a0 a1
  local -a script=()
  out="$tmp/wrk.out"
  [ -z "$wrk_script" ] || script=(-s "$wrk_script")
  [ -z "$qfile" ] || script=(-s "$tmp/quantiles.lua")
  [ "$c" -ge "$t" ] || t=$c
  [ "$name" = direct ] || c0=$(om_bench_cpu_ticks "${pid_of[$name]}")
  a0=$(upstream_accepts)
  local tool=wrk
  [ -z "$qfile" ] || tool=$lat_client
  if [ "$tool" = c1 ]; then
    $pin "$c1_bin" "${port_of[$name]}" "$secs" "$qfile" >"$out" 2>&1
  else
    OM_BENCH_QFILE=$qfile $pin wrk -t"$t" -c"$c" -d"${secs}s" --latency \
      "${script[@]}" -H "Host: bench" \
      "http://127.0.0.1:${port_of[$name]}$path" >"$out" 2>&1
  fi || {
    log "$tool against $name failed:"
    cat "$out" >&2
    exit 1
  }
  [ "$name" = direct ] || c1=$(om_bench_cpu_ticks "${pid_of[$name]}")
  a1=$(upstream_accepts)
  non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $NF}' "$out")
  errs=$(awk '/Socket errors:/ {sub(/.*Socket errors: /, ""); print}' "$out")
  if [ -n "$non2xx" ]; then
    log "$name answered $non2xx non-2xx responses:"
    cat "$out" >&2
    exit 1
  fi
  [ -z "$errs" ] || log "$name: socket errors: $errs"
  rps=$(awk '/^Requests\/sec:/ {print $2}' "$out")
  reqs=$(awk '/ requests in / {print $1}' "$out")
  p50=$(to_us "$(awk '$1 == "50%" {print $2}' "$out")")
  p99=$(to_us "$(awk '$1 == "99%" {print $2}' "$out")")
  if [ "$name" = direct ]; then
    cpu_us=""
  else
    cpu_us=$(awk -v t=$((c1 - c0)) -v hz="$clk_tck" -v n="$reqs" \
      'BEGIN { printf "%.2f", t / hz * 1e6 / n }')
  fi
  upc=$(awk -v a=$((a1 - a0)) -v n="$reqs" 'BEGIN { printf "%.4f", a / n }')
  log "$(printf '%-8s c=%-4s %10s req/s  p50 %8s us  p99 %8s us  cpu %6s us/req  upstream conns %s/req' \
    "$name" "$c" "$rps" "$p50" "$p99" "${cpu_us:--}" "$upc")"
}

# median VALUES... and spread VALUES... ("min A, max B, N rounds") print
# $prec decimals (2 unless set)
median() {
  printf '%s\n' "$@" | sort -g | awk -v d="${prec:-2}" '{ v[NR] = $1 } END {
    if (NR == 0) { print "nan"; exit }
    f = "%." d "f"
    if (NR % 2) printf f, v[(NR + 1) / 2];
    else printf f, (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
spread() {
  printf '%s\n' "$@" | sort -g | awk -v d="${prec:-2}" '{ v[NR] = $1 } END {
    f = "%." d "f"
    printf "min " f ", max " f ", %d rounds", v[1], v[NR], NR }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.4f", a / b }'; }
sub_() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a - b }'; }
report() { printf '%s %s %s\n' "$1" "$2" "$3"; }
# bar NAME BAR VALUES...: "NAME median (bar: BAR; min, max, rounds)"
bar() {
  local name=$1 b=$2
  shift 2
  printf '%s %s (bar: %s; %s)\n' "$name" "$(median "$@")" "$b" "$(spread "$@")"
}

# scenario NAME: one headline scenario (see the header): its contenders
# started fresh, a warm-up, $rounds rotated rounds, its figures printed
scenario() {
  local sc=$1 c=200 np=2 keyed=0 pol=$policy method=GET r i name bar_t bar_c
  local -a order=(proxy nginx haproxy nginx_b) ro=()
  local -a pn=() ph=() aa=() cn=() caa=() p_rps=() n_rps=() h_rps=() \
    p_cpu=() n_cpu=() h_cpu=() p_con=() n_con=() h_con=()
  local pc0 pc1 hits misses
  declare -A got
  path=/
  wrk_script=""
  case $sc in
  base_c*) c=${sc#base_c} ;;
  policy_c*)
    c=${sc#policy_c}
    wrk_script=$here/wrk/users.lua
    ;;
  peers256) np=$npeers ;;
  keyed256)
    np=$npeers keyed=1 pol=$keyed_policy
    wrk_script=$here/wrk/sessions.lua
    ;;
  post4k)
    wrk_script=$here/wrk/post4k.lua
    method=POST
    ;;
  resp64k) path=/64k ;;
  esac
  start_contenders "" "$([ "$workers_flag" = 0 ] || echo "$workers")" auto "" \
    "$np" "$keyed" "$pol"
  sanity "$path" "$method"
  log "$sc: $np peers, $c connections, ${wrk_script:+$(basename "$wrk_script"), }$method $path"
  for name in "${order[@]}"; do run "$name" "$c" 1 >/dev/null; done
  pc0=$(policy_counts)
  for r in $(seq "$rounds"); do
    # the order rotates by one place every round
    ro=()
    for i in 0 1 2 3; do ro+=("${order[$(((i + r - 1) % 4))]}"); done
    for name in "${ro[@]}"; do
      run "$name" "$c" "$duration"
      got[$name.rps]=$rps
      got[$name.cpu]=$cpu_us
      got[$name.con]=$upc
    done
    p_rps+=("${got[proxy.rps]}")
    n_rps+=("${got[nginx.rps]}")
    h_rps+=("${got[haproxy.rps]}")
    p_cpu+=("${got[proxy.cpu]}")
    n_cpu+=("${got[nginx.cpu]}")
    h_cpu+=("${got[haproxy.cpu]}")
    p_con+=("${got[proxy.con]}")
    n_con+=("${got[nginx.con]}")
    h_con+=("${got[haproxy.con]}")
    pn+=("$(ratio "${got[proxy.rps]}" "${got[nginx.rps]}")")
    ph+=("$(ratio "${got[proxy.rps]}" "${got[haproxy.rps]}")")
    aa+=("$(ratio "${got[nginx_b.rps]}" "${got[nginx.rps]}")")
    cn+=("$(ratio "${got[proxy.cpu]}" "${got[nginx.cpu]}")")
    caa+=("$(ratio "${got[nginx_b.cpu]}" "${got[nginx.cpu]}")")
  done
  # What the proxy's decision cache did over the rounds: the policy
  # scenarios must run the policy's Lua on (nearly) every call, or they
  # measure the cache
  pc1=$(policy_counts)
  if [ -n "$pc0" ] && [ -n "$pc1" ]; then
    hits=$((${pc1% *} - ${pc0% *}))
    misses=$((${pc1#* } - ${pc0#* }))
    log "$sc: decision cache $hits hits, $misses misses"
    case $sc in
    policy_c*)
      if [ $((misses * 10)) -lt $(((hits + misses) * 9)) ]; then
        log "$sc: the policy ran on fewer than 90 % of the calls; the scenario measures the cache"
        exit 1
      fi
      ;;
    esac
  else
    log "$sc: the proxy's /metrics has no decision cache counters"
  fi
  stop proxy nginx nginx_b haproxy
  # The bars: throughput and CPU with the per-request policy running
  bar_t=report bar_c=report
  case $sc in policy_c*) bar_t=">= 1.0" bar_c="<= 0.9" ;; esac
  bar "${sc}_proxy_vs_nginx" "$bar_t" "${pn[@]}"
  bar "${sc}_proxy_vs_haproxy" "$bar_t" "${ph[@]}"
  bar "${sc}_cpu_vs_nginx" "$bar_c" "${cn[@]}"
  bar "${sc}_aa_nginx_b_vs_nginx" "noise of the ratios above" "${aa[@]}"
  bar "${sc}_aa_cpu_nginx_b_vs_nginx" "noise of the CPU ratio" "${caa[@]}"
  report "${sc}_proxy_req_per_s" "$(median "${p_rps[@]}")" req/s
  report "${sc}_nginx_req_per_s" "$(median "${n_rps[@]}")" req/s
  report "${sc}_haproxy_req_per_s" "$(median "${h_rps[@]}")" req/s
  report "${sc}_proxy_cpu_per_request_us" "$(median "${p_cpu[@]}")" us
  report "${sc}_nginx_cpu_per_request_us" "$(median "${n_cpu[@]}")" us
  report "${sc}_haproxy_cpu_per_request_us" "$(median "${h_cpu[@]}")" us
  case $sc in base_c200) bar_t="<= 0.01" ;; *) bar_t=report ;; esac
  prec=4 bar "${sc}_proxy_upstream_conns_per_request" "$bar_t" "${p_con[@]}"
  report "${sc}_nginx_upstream_conns_per_request" \
    "$(prec=4 median "${n_con[@]}")" conns
  report "${sc}_haproxy_upstream_conns_per_request" \
    "$(prec=4 median "${h_con[@]}")" conns
}

# lat_order ROUND: the order of the diagnostic's latency runs in round
# ROUND (from 1). A run's tail depends on the run before it: in the pinned
# passes of ten bench runs, calls of 150 us or more were 9-21 % rarer in a
# run that followed a run of the same contender than in one that followed
# another's (docs/BENCHMARKS.md, "Carry-over"). A 4x4 Latin square of
# orders does not balance that: it let the proxy and nginx_b follow
# themselves in one round of four and nginx never. So the order is a cycle
# of 12 rounds over the rows of a Williams square (W1..W4 below, taken
# W1 W1 W2 W2 W3 W3 W4 W4 W3 W2 W1 W4):
# counting the step from each round into the next and from round 12 back
# into round 1, every contender follows each of the other three exactly 4
# times and never itself, and takes every place in a round 3 times. Any
# number of rounds works; multiples of 12 are balanced.
lat_order() {
  local -a cycle=(1 1 2 2 3 3 4 4 3 2 1 4)
  case ${cycle[$((($1 - 1) % 12))]} in
  1) echo "direct proxy nginx_b nginx" ;;
  2) echo "proxy nginx direct nginx_b" ;;
  3) echo "nginx nginx_b proxy direct" ;;
  4) echo "nginx_b direct nginx proxy" ;;
  esac
}

# diag: the one-core pass (see the header), figures named diag_pinned_*
diag() {
  local sfx=_pinned pfx=diag_pinned_ r name order
  local -a p_rps=() n_rps=() h_rps=() pn=() ph=() p_cpu=() n_cpu=() h_cpu=()
  local below=0 below_b=0
  declare -A got
  pin="taskset -c 0"
  threads=1
  path=/
  wrk_script=""
  upstream_conf 1 2 >"$tmp/upstream.conf"
  start upstream "$peer_base" $pin nginx -p "$tmp" -e "$tmp/upstream.log" \
    -c "$tmp/upstream.conf" -g "daemon off;"
  start_contenders "$pin" "$([ "$workers_flag" = 0 ] || echo 1)" 1 1 2 0 \
    "$policy"
  sanity / GET
  log "diagnostic, every process on CPU 0: wrk -t1 -c$conns ${diag_duration}s x $diag_rounds rounds, $lat_client at one connection ${lat_duration}s x $lat_rounds rounds"
  # warm-up: pools filled, pages touched, caches warm
  for name in proxy nginx nginx_b haproxy; do
    run "$name" "$conns" 1 >/dev/null
  done
  # OM_BENCH_PERF=FILE: first a profile of the proxy (perf record -g on its
  # pid) over one extra throughput run, not counted in the figures.
  if [ -n "${OM_BENCH_PERF:-}" ]; then
    perf record -q -g -o "$OM_BENCH_PERF" -p "${pid_of[proxy]}" \
      -- sleep "$((diag_duration + 1))" >"$tmp/perf.out" 2>&1 &
    perf_pid=$!
    sleep 0.3
    run proxy "$conns" "$diag_duration"
    wait "$perf_pid" || {
      log "perf record failed:"
      cat "$tmp/perf.out" >&2
    }
    log "profile written to $OM_BENCH_PERF (perf report -i $OM_BENCH_PERF)"
  fi
  for r in $(seq "$diag_rounds"); do
    if [ $((r % 2)) -eq 1 ]; then order="proxy nginx haproxy"; else
      order="haproxy nginx proxy"; fi
    for name in $order; do
      run "$name" "$conns" "$diag_duration"
      got[$name.rps]=$rps
      got[$name.cpu]=$cpu_us
    done
    p_rps+=("${got[proxy.rps]}")
    n_rps+=("${got[nginx.rps]}")
    h_rps+=("${got[haproxy.rps]}")
    pn+=("$(ratio "${got[proxy.rps]}" "${got[nginx.rps]}")")
    ph+=("$(ratio "${got[proxy.rps]}" "${got[haproxy.rps]}")")
    p_cpu+=("${got[proxy.cpu]}")
    n_cpu+=("${got[nginx.cpu]}")
    h_cpu+=("${got[haproxy.cpu]}")
  done
  # The run before the first round is the one the cycle ends with, so the
  # first round's first run follows what it follows in the cycle (taken by
  # the latency client; its quantiles are not pooled).
  run "$(lat_order "$lat_rounds" | awk '{ print $NF }')" 1 1 \
    "$tmp/lead-in.q" >/dev/null
  for r in $(seq "$lat_rounds"); do
    for name in $(lat_order "$r"); do
      run "$name" 1 "$lat_duration" "$tmp/q$sfx.$name.$r"
      got[$name.p99]=$p99
    done
    if awk -v a="${got[proxy.p99]}" -v b="${got[nginx.p99]}" \
      'BEGIN { exit !(a < b) }'; then below=$((below + 1)); fi
    if awk -v a="${got[nginx_b.p99]}" -v b="${got[nginx.p99]}" \
      'BEGIN { exit !(a < b) }'; then below_b=$((below_b + 1)); fi
  done
  stop proxy nginx nginx_b haproxy upstream
  pin=""
  log "p99 below nginx's in a round, of $lat_rounds (pinned): proxy $below, nginx_b (A/A) $below_b"
  local d50 d99 p50_ p99_ n50 n99 b50 b99
  d50=$(pooled 50 "$tmp/q$sfx".direct.*)
  d99=$(pooled 99 "$tmp/q$sfx".direct.*)
  p50_=$(pooled 50 "$tmp/q$sfx".proxy.*)
  p99_=$(pooled 99 "$tmp/q$sfx".proxy.*)
  n50=$(pooled 50 "$tmp/q$sfx".nginx.*)
  n99=$(pooled 99 "$tmp/q$sfx".nginx.*)
  b50=$(pooled 50 "$tmp/q$sfx".nginx_b.*)
  b99=$(pooled 99 "$tmp/q$sfx".nginx_b.*)
  log "pooled over $lat_rounds rounds (pinned): p50/p99 direct $d50/$d99, proxy $p50_/$p99_, nginx $n50/$n99, nginx_b $b50/$b99 us"
  report "${pfx}proxy_req_per_s" "$(median "${p_rps[@]}")" req/s
  report "${pfx}nginx_req_per_s" "$(median "${n_rps[@]}")" req/s
  report "${pfx}haproxy_req_per_s" "$(median "${h_rps[@]}")" req/s
  bar "${pfx}proxy_vs_nginx" report "${pn[@]}"
  bar "${pfx}proxy_vs_haproxy" report "${ph[@]}"
  report "${pfx}proxy_added_p50_us" "$(sub_ "$p50_" "$d50")" us
  report "${pfx}proxy_added_p99_us" "$(sub_ "$p99_" "$d99")" us
  report "${pfx}nginx_added_p50_us" "$(sub_ "$n50" "$d50")" us
  report "${pfx}nginx_added_p99_us" "$(sub_ "$n99" "$d99")" us
  report "${pfx}nginx_b_added_p50_us" "$(sub_ "$b50" "$d50")" us
  report "${pfx}nginx_b_added_p99_us" "$(sub_ "$b99" "$d99")" us
  report "${pfx}nginx_aa_p99_gap_us" "$(sub_ "$b99" "$n99" | tr -d -)" us
  report "${pfx}direct_p50_us" "$d50" us
  report "${pfx}direct_p99_us" "$d99" us
  printf '%s %s (bar: <= 35 us)\n' "${pfx}proxy_cpu_per_request_us" \
    "$(median "${p_cpu[@]}")"
  report "${pfx}nginx_cpu_per_request_us" "$(median "${n_cpu[@]}")" us
  report "${pfx}haproxy_cpu_per_request_us" "$(median "${h_cpu[@]}")" us
}

log "headline: $(echo $scenarios | wc -w) scenarios x $rounds rounds x ${duration}s, wrk -t$wrk_threads, proxy $([ "$workers_flag" = 0 ] && echo "without --workers (one loop)" || echo "--workers $workers"); temp dir $tmp"
upstream_conf auto "$npeers" >"$tmp/upstream.conf"
start upstream "$peer_base" nginx -p "$tmp" -e "$tmp/upstream.log" \
  -c "$tmp/upstream.conf" -g "daemon off;"
threads=$wrk_threads
for sc in $scenarios; do scenario "$sc"; done
stop upstream

if [ "$diag_pass" = 1 ]; then diag; fi
