#!/usr/bin/env bash
# bench/proxy_bench.sh OPENMESH_BIN: the data-plane benchmark
# (docs/BENCHMARKS.md "Data plane"). `make bench` runs it after the C benches.
#
# One upstream (nginx `return 200 "ok"` on two loopback ports, so every proxy
# balances over two stable peers) and three proxies in front of it, measured
# side by side in one run with wrk on loopback:
#   proxy    `openmesh proxy --static` with examples/policies/canary.lua;
#            the topology's instances are all stable (version v1) and the
#            requests carry no user, so every call takes the policy's
#            no-user path to the stable peers;
#   nginx    proxy_pass to an upstream block with a keepalive pool;
#   haproxy  one thread, `http-reuse always`;
#   nginx_b  a second nginx with nginx's config, in the latency pass only:
#            the run's A/A control. Two identical proxies differ at p99 by
#            the machine's noise alone, so the gap between nginx and
#            nginx_b is the resolution of this run's p99 comparison.
# Every contender is one process (one thread) doing the proxying: nginx has
# one worker, HAProxy one thread, as the openmesh proxy has one loop.
#
# Throughput: wrk -t1 -c50, 10 s per run, 2 rounds, interleaved (proxy nginx
# haproxy, then haproxy nginx proxy), after a 1 s warm-up run of each.
# CPU per request: the contender's utime+stime (/proc/PID/stat, every thread
# and child process) over a throughput run, divided by the requests wrk
# counted. Added latency: wrk -t1 -c1 (3 s per run, 12 rounds; the order
# of direct, proxy, nginx and nginx_b is balanced for the run before each,
# see lat_order below); every run writes its quantile
# function (wrk's percentile at every 0.01 %) through a wrk done() script,
# the runs of one contender are pooled into one distribution (each run
# weighted by its requests), and the figure is the pooled p50 (p99) through
# a proxy minus the pooled p50 (p99) straight to the upstream: the p99 of
# every call measured, over rounds spread across the whole pass, so a
# drift of the machine reaches every contender alike. How often the
# proxy's own p99 was below nginx's in a round goes to stderr, beside how
# often nginx_b's was (for equals, about half the rounds). Then all of it
# again with every process (upstream, proxies, wrk) pinned to CPU 0
# (`taskset -c 0`), since this 2-core machine is noisy: the `_pinned`
# figures. Throughput and CPU figures are the median over their rounds; a
# ratio is the median of the per-round ratios, each from runs next to each
# other; latency figures come from the pooled distributions above.
#
# Prints `name value unit` lines (as the C benches do); each run's details
# go to stderr. Exits non-zero when a contender fails to start or answers
# anything but 2xx. Loopback only, ports OM_BENCH_PORT_BASE..+6 (default
# 19480), a temp dir for every config and log; the EXIT trap stops
# everything it started (by pid) and removes the temp dir. About 7 minutes.
#
# Environment: OM_BENCH_DURATION seconds per throughput run (default 10),
# OM_BENCH_ROUNDS (2),
# OM_BENCH_LAT_DURATION seconds per latency run (3), OM_BENCH_LAT_ROUNDS
# (12), OM_BENCH_CONNECTIONS (50), OM_BENCH_PORT_BASE (19480),
# OM_BENCH_PINNED (1; 0 skips the pinned pass), OM_BENCH_POLICY (the
# proxy's traffic policy, default examples/policies/canary.lua; another one
# tells what the policy costs), OM_BENCH_QDIR (a directory to keep every
# latency run's quantile function in), OM_BENCH_PERF (a perf.data path: profile
# the proxy first, see below), OM_BENCH_CLIENT (wrk; c1 takes the latency
# runs with bench/c1_client.c instead, a blocking closed-loop client built
# beside the benches: it makes two syscalls per call where wrk makes six,
# so its percentiles show more of the contender and less of the client;
# the throughput runs stay wrk's).
set -euo pipefail

bin=${1:-}
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
  echo "usage: bash bench/proxy_bench.sh PATH/TO/openmesh" >&2
  exit 2
fi
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
policy=${OM_BENCH_POLICY:-$here/../examples/policies/canary.lua}

duration=${OM_BENCH_DURATION:-10}
rounds=${OM_BENCH_ROUNDS:-2}
lat_duration=${OM_BENCH_LAT_DURATION:-3}
lat_rounds=${OM_BENCH_LAT_ROUNDS:-12}
conns=${OM_BENCH_CONNECTIONS:-50}
base=${OM_BENCH_PORT_BASE:-19480}
pinned_pass=${OM_BENCH_PINNED:-1}
lat_client=${OM_BENCH_CLIENT:-wrk}
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

for tool in wrk nginx haproxy taskset; do
  if ! command -v "$tool" >/dev/null 2>&1 &&
    [ ! -x "/usr/sbin/$tool" ]; then
    echo "proxy_bench: $tool not found (run scripts/deps-bench)" >&2
    exit 1
  fi
done
PATH="$PATH:/usr/sbin"

up_a=$base
up_b=$((base + 1))
proxy_port=$((base + 2))
admin_port=$((base + 3))
nginx_port=$((base + 4))
haproxy_port=$((base + 5))
nginx_b_port=$((base + 6))

log() { echo "proxy_bench: $*" >&2; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/om-proxy-bench.XXXXXX")
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    # nginx and the proxy drain; give them a moment, then insist
    for _ in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  # OM_BENCH_QDIR: keep every latency run's quantile function there
  # (q[_pinned].CONTENDER.ROUND), e.g. to pool several runs
  if [ -n "${OM_BENCH_QDIR:-}" ]; then
    mkdir -p "$OM_BENCH_QDIR" && cp "$tmp"/q[._]* "$OM_BENCH_QDIR"/ 2>/dev/null ||
      true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

for p in $up_a $up_b $proxy_port $admin_port $nginx_port $haproxy_port \
  $nginx_b_port; do
  if port_busy "$p"; then
    log "port $p on 127.0.0.1 is taken; set OM_BENCH_PORT_BASE"
    exit 1
  fi
done

# wait_port PORT PID NAME: until PORT accepts, or PID dies, or 10 s
wait_port() {
  local _
  for _ in $(seq 100); do
    if ! kill -0 "$2" 2>/dev/null; then
      log "$3 exited at start; its output:"
      cat "$tmp/$3.out" "$tmp/$3.log" >&2 2>/dev/null || true
      exit 1
    fi
    port_busy "$1" && return 0
    sleep 0.1
  done
  log "$3 did not listen on 127.0.0.1:$1 within 10 s"
  exit 1
}

# nginx's temp paths and pid file go to the temp dir, never /var
nginx_common() {
  cat <<EOF
worker_processes 1;
pid $tmp/$1.pid;
error_log $tmp/$1.log warn;
events { worker_connections 4096; }
EOF
}
nginx_http_common() {
  cat <<EOF
  access_log off;
  keepalive_timeout 300s;
  keepalive_requests 1000000000;
  client_body_temp_path $tmp/$1-body;
  proxy_temp_path $tmp/$1-proxy;
  fastcgi_temp_path $tmp/$1-fastcgi;
  uwsgi_temp_path $tmp/$1-uwsgi;
  scgi_temp_path $tmp/$1-scgi;
EOF
}

{
  nginx_common upstream
  echo "http {"
  nginx_http_common upstream
  cat <<EOF
  server {
    listen 127.0.0.1:$up_a;
    listen 127.0.0.1:$up_b;
    location / { return 200 "ok"; }
  }
}
EOF
} >"$tmp/upstream.conf"

# nginx_conf NAME PORT: the nginx proxy (nginx, and nginx_b, its A/A twin)
nginx_conf() {
  nginx_common "$1"
  echo "http {"
  nginx_http_common "$1"
  cat <<EOF
  upstream bench {
    server 127.0.0.1:$up_a;
    server 127.0.0.1:$up_b;
    keepalive 64;
    keepalive_requests 1000000000;
    keepalive_timeout 300s;
  }
  server {
    listen 127.0.0.1:$2;
    location / {
      proxy_pass http://bench;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
EOF
}
nginx_conf nginx "$nginx_port" >"$tmp/nginx.conf"
nginx_conf nginx_b "$nginx_b_port" >"$tmp/nginx_b.conf"

cat >"$tmp/haproxy.cfg" <<EOF
global
  nbthread 1
  maxconn 4096
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
  balance roundrobin
  http-reuse always
  server a 127.0.0.1:$up_a
  server b 127.0.0.1:$up_b
EOF

# Two stable peers (not canary: version v1); the canary policy keeps both.
cat >"$tmp/static.json" <<EOF
{"services": {"bench": {"revision": 1, "instances": [
  {"id": "stable-a", "url": "http://127.0.0.1:$up_a", "metadata": {"version": "v1"}},
  {"id": "stable-b", "url": "http://127.0.0.1:$up_b", "metadata": {"version": "v1"}}]}}}
EOF

declare -A pid_of
start() { # NAME PORT CMD...
  local name=$1 port=$2
  shift 2
  "$@" >"$tmp/$name.out" 2>&1 &
  pid_of[$name]=$!
  pids+=("$!")
  wait_port "$port" "${pid_of[$name]}" "$name"
}

start upstream "$up_a" nginx -p "$tmp" -e "$tmp/upstream.log" \
  -c "$tmp/upstream.conf" -g "daemon off;"
start proxy "$proxy_port" "$bin" proxy --listen "127.0.0.1:$proxy_port" \
  --admin "127.0.0.1:$admin_port" --policy "$policy" \
  --static "$tmp/static.json" --log-level warn
start nginx "$nginx_port" nginx -p "$tmp" -e "$tmp/nginx.log" \
  -c "$tmp/nginx.conf" -g "daemon off;"
start nginx_b "$nginx_b_port" nginx -p "$tmp" -e "$tmp/nginx_b.log" \
  -c "$tmp/nginx_b.conf" -g "daemon off;"
start haproxy "$haproxy_port" haproxy -db -f "$tmp/haproxy.cfg"

declare -A port_of=([direct]=$up_a [proxy]=$proxy_port [nginx]=$nginx_port
  [haproxy]=$haproxy_port [nginx_b]=$nginx_b_port)

# A sanity call through each: 200 "ok", the proxy's through a stable peer.
for name in direct proxy nginx haproxy nginx_b; do
  if ! curl -sS -D "$tmp/head" -o "$tmp/body" -H "Host: bench" \
    "http://127.0.0.1:${port_of[$name]}/" ||
    ! head -1 "$tmp/head" | grep -q " 200" ||
    [ "$(cat "$tmp/body")" != "ok" ]; then
    log "$name does not answer 200 ok:"
    cat "$tmp/head" "$tmp/body" >&2 || true
    exit 1
  fi
done
curl -sS -D "$tmp/head" -o /dev/null -H "Host: bench" \
  "http://127.0.0.1:$proxy_port/"
if ! grep -qi '^x-openmesh-peer: stable-' "$tmp/head"; then
  log "the proxy did not route through a stable peer:"
  cat "$tmp/head" >&2
  exit 1
fi

clk_tck=$(getconf CLK_TCK)

# the pid and its children (nginx's master and worker)
tree() {
  local p
  echo "$1"
  for p in $(pgrep -P "$1" || true); do tree "$p"; done
}

# utime+stime of a process tree, in clock ticks (/proc/PID/stat fields 14,
# 15, after the parenthesized comm; a process's line covers all its threads)
cpu_ticks() {
  local p total=0 t
  for p in $(tree "$1"); do
    t=$(awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$p/stat" \
      2>/dev/null) || continue
    total=$((total + t))
  done
  echo "$total"
}

# to_us VALUE: wrk's "82.00us", "1.23ms", "1.01s" in microseconds
to_us() {
  awk -v v="$1" 'BEGIN {
    n = v + 0
    if (v ~ /us$/) m = 1; else if (v ~ /ms$/) m = 1000;
    else if (v ~ /s$/) m = 1000000; else m = -1
    if (m < 0) { print "nan"; exit }
    printf "%.2f", n * m }'
}

# The quantile function of one run: wrk's percentile at p = 0.01 ... 100 %
# in steps of 0.01 (whole microseconds), after the run's request count, to
# the file named by OM_BENCH_QFILE. Pooling these reconstructs the
# distribution of all the runs to within 0.01 % of each run's calls.
cat >"$tmp/quantiles.lua" <<'EOF'
done = function(summary, latency, requests)
  local f = assert(io.open(os.getenv("OM_BENCH_QFILE"), "w"))
  f:write("n ", summary.requests, "\n")
  for k = 1, 10000 do
    f:write(latency:percentile(k / 100), "\n")
  end
  f:close()
end
EOF

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
# run NAME CONNS SECONDS [QFILE]: one wrk run against NAME; sets rps, reqs,
# p50, p99 (us) and cpu_us (the contender's CPU per request, us; "" for
# direct); with QFILE, the run's quantile function is written there
run() {
  local name=$1 c=$2 secs=$3 qfile=${4:-} out c0=0 c1=0 errs non2xx
  local -a script=()
  out="$tmp/wrk.out"
  [ -z "$qfile" ] || script=(-s "$tmp/quantiles.lua")
  [ "$name" = direct ] || c0=$(cpu_ticks "${pid_of[$name]}")
  local tool=wrk
  [ -z "$qfile" ] || tool=$lat_client
  if [ "$tool" = c1 ]; then
    $pin "$c1_bin" "${port_of[$name]}" "$secs" "$qfile" >"$out" 2>&1
  else
    OM_BENCH_QFILE=$qfile $pin wrk -t1 -c"$c" -d"${secs}s" --latency \
      "${script[@]}" -H "Host: bench" \
      "http://127.0.0.1:${port_of[$name]}/" >"$out" 2>&1
  fi || {
    log "$tool against $name failed:"
    cat "$out" >&2
    exit 1
  }
  [ "$name" = direct ] || c1=$(cpu_ticks "${pid_of[$name]}")
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
  log "$(printf '%-8s c=%-3s %10s req/s  p50 %8s us  p99 %8s us  cpu %6s us/req' \
    "$name" "$c" "$rps" "$p50" "$p99" "${cpu_us:--}")"
}

median() { # VALUES...
  printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END {
    if (NR == 0) { print "nan"; exit }
    if (NR % 2) printf "%.2f", v[(NR + 1) / 2];
    else printf "%.2f", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.4f", a / b }'; }
sub_() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a - b }'; }
report() { printf '%s %s %s\n' "$1" "$2" "$3"; }

# lat_order ROUND: the order of the latency runs in round ROUND (from 1).
# A run's tail depends on the run before it: in the pinned passes of ten
# bench runs, calls of 150 us or more were 9-21 % rarer in a run that
# followed a run of the same contender than in one that followed another's
# (docs/BENCHMARKS.md, "Carry-over"). A 4x4 Latin square of orders does not
# balance that: it let the proxy and nginx_b follow themselves in one round
# of four and nginx never. So the order is a cycle of 12 rounds over the
# rows of a Williams square (W1..W4 below, taken
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

# pass SUFFIX: every figure once (throughput and CPU, then added latency)
pass() {
  local sfx=$1 r name order
  local -a p_rps=() n_rps=() h_rps=() pn=() ph=() p_cpu=() n_cpu=() h_cpu=()
  local below=0 below_b=0
  declare -A got
  for r in $(seq "$rounds"); do
    if [ $((r % 2)) -eq 1 ]; then order="proxy nginx haproxy"; else
      order="haproxy nginx proxy"; fi
    for name in $order; do
      run "$name" "$conns" "$duration"
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
  log "p99 below nginx's in a round, of $lat_rounds${sfx:+ (pinned)}: proxy $below, nginx_b (A/A) $below_b"
  local d50 d99 p50_ p99_ n50 n99 b50 b99
  d50=$(pooled 50 "$tmp/q$sfx".direct.*)
  d99=$(pooled 99 "$tmp/q$sfx".direct.*)
  p50_=$(pooled 50 "$tmp/q$sfx".proxy.*)
  p99_=$(pooled 99 "$tmp/q$sfx".proxy.*)
  n50=$(pooled 50 "$tmp/q$sfx".nginx.*)
  n99=$(pooled 99 "$tmp/q$sfx".nginx.*)
  b50=$(pooled 50 "$tmp/q$sfx".nginx_b.*)
  b99=$(pooled 99 "$tmp/q$sfx".nginx_b.*)
  log "pooled over $lat_rounds rounds${sfx:+ (pinned)}: p50/p99 direct $d50/$d99, proxy $p50_/$p99_, nginx $n50/$n99, nginx_b $b50/$b99 us"
  report "proxy_req_per_s$sfx" "$(median "${p_rps[@]}")" req/s
  report "nginx_req_per_s$sfx" "$(median "${n_rps[@]}")" req/s
  report "haproxy_req_per_s$sfx" "$(median "${h_rps[@]}")" req/s
  report "proxy_vs_nginx$sfx" "$(median "${pn[@]}")" ratio
  report "proxy_vs_haproxy$sfx" "$(median "${ph[@]}")" ratio
  report "proxy_added_p50_us$sfx" "$(sub_ "$p50_" "$d50")" us
  report "proxy_added_p99_us$sfx" "$(sub_ "$p99_" "$d99")" us
  report "nginx_added_p50_us$sfx" "$(sub_ "$n50" "$d50")" us
  report "nginx_added_p99_us$sfx" "$(sub_ "$n99" "$d99")" us
  report "nginx_b_added_p50_us$sfx" "$(sub_ "$b50" "$d50")" us
  report "nginx_b_added_p99_us$sfx" "$(sub_ "$b99" "$d99")" us
  report "nginx_aa_p99_gap_us$sfx" "$(sub_ "$b99" "$n99" | tr -d -)" us
  report "direct_p50_us$sfx" "$d50" us
  report "direct_p99_us$sfx" "$d99" us
  report "proxy_cpu_per_request_us$sfx" "$(median "${p_cpu[@]}")" us
  report "nginx_cpu_per_request_us$sfx" "$(median "${n_cpu[@]}")" us
  report "haproxy_cpu_per_request_us$sfx" "$(median "${h_cpu[@]}")" us
}

log "wrk -t1 -c$conns ${duration}s x $rounds rounds, $lat_client at one connection ${lat_duration}s x $lat_rounds rounds; temp dir $tmp"
# warm-up: pools filled, pages touched, caches warm
for name in proxy nginx nginx_b haproxy; do run "$name" "$conns" 1 >/dev/null; done

# OM_BENCH_PERF=FILE: first a profile of the proxy (perf record -g on its
# pid) over one extra throughput run, not counted in the figures.
if [ -n "${OM_BENCH_PERF:-}" ]; then
  perf record -q -g -o "$OM_BENCH_PERF" -p "${pid_of[proxy]}" \
    -- sleep "$((duration + 1))" >"$tmp/perf.out" 2>&1 &
  perf_pid=$!
  sleep 0.3
  run proxy "$conns" "$duration"
  wait "$perf_pid" || { log "perf record failed:"; cat "$tmp/perf.out" >&2; }
  log "profile written to $OM_BENCH_PERF (perf report -i $OM_BENCH_PERF)"
fi
pass ""

if [ "$pinned_pass" = 1 ]; then
  log "pinned: every process on CPU 0"
  for name in upstream proxy nginx nginx_b haproxy; do
    for p in $(tree "${pid_of[$name]}"); do
      taskset -a -p -c 0 "$p" >/dev/null
    done
  done
  pin="taskset -c 0"
  for name in proxy nginx nginx_b haproxy; do
    run "$name" "$conns" 1 >/dev/null
  done
  pass _pinned
fi
