#!/usr/bin/env bash
# bench/pool_bench.sh OPENMESH_BIN: does the proxy's upstream keep-alive pool
# reuse (docs/BENCHMARKS.md "Upstream pool reuse")? `make bench` runs it.
#
# One nginx (`return 200 "ok"` on two loopback ports: the service's two
# peers; keep-alive without a request limit, so every connection it accepts
# is one the proxy chose to open) and `openmesh proxy --static` in front of
# it with a pass-through policy and the default pool (idle per peer: the
# peer's share of max_inflight, 256 / 2 = 128). For each client count
# (32, 200, 1000; OM_BENCH_CONNS): a 1 s warm-up run of wrk -t2 (the pool
# grows to what the load needs), then OM_BENCH_ROUNDS runs of
# OM_BENCH_DURATION s each; per run, new upstream connections per request:
#   proxy  from openmesh_proxy_upstream_connections_total{reason="new"} over
#          new + reused (every attempt the proxy sent), as an operator
#          reads it from /metrics;
#   nginx  the cross-check: what nginx accepted in the run (stub_status
#          "accepts", less this script's own status calls) over the
#          requests wrk counted.
# The figure is the median over rounds (and the largest round beside it).
#
# Prints one line per figure, `name value (bar: ...)` where there is a bar
# (the 200-connection figure is the issue's: <= 0.01); each run's detail
# goes to stderr. Exits non-zero when something fails to start or answers
# anything but 2xx. Ports OM_BENCH_PORT_BASE..+4 (default 19600); the EXIT
# trap stops what it started (by pid) and removes its temp dir. About
# 1 minute (--quick: 2 s runs, one round, about 15 s).
#
# Environment: OM_BENCH_DURATION seconds per run (10), OM_BENCH_ROUNDS (3),
# OM_BENCH_CONNS ("32 200 1000"), OM_BENCH_PORT_BASE (19600),
# OM_BENCH_MAX_IDLE (the policy's pool.max_idle_per_peer; unset: the
# default share; 32 shows the limit that used to be fixed in C).
set -euo pipefail

quick=0
if [ "${1:-}" = "--quick" ]; then
  quick=1
  shift
fi
bin=${1:-}
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
  echo "usage: bash bench/pool_bench.sh [--quick] PATH/TO/openmesh" >&2
  exit 2
fi
duration=${OM_BENCH_DURATION:-10}
rounds=${OM_BENCH_ROUNDS:-3}
if [ "$quick" = 1 ]; then
  duration=${OM_BENCH_DURATION:-2}
  rounds=${OM_BENCH_ROUNDS:-1}
fi
conn_counts=${OM_BENCH_CONNS:-32 200 1000}
base=${OM_BENCH_PORT_BASE:-19600}
max_idle=${OM_BENCH_MAX_IDLE:-}

up_a=$base
up_b=$((base + 1))
status_port=$((base + 2))
proxy_port=$((base + 3))
admin_port=$((base + 4))

log() { echo "pool_bench: $*" >&2; }

# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
om_bench_need wrk nginx curl
om_bench_tmp pool-bench
om_bench_ports_free OM_BENCH_PORT_BASE $up_a $up_b $status_port $proxy_port $admin_port

start() { # NAME PORT CMD...
  local name=$1 port=$2
  shift 2
  "$@" >"$tmp/$name.out" 2>&1 &
  pids+=("$!")
  wait_port "$port" "$!" "$name"
}

# nginx's temp paths and pid file go to the temp dir, never /var
cat >"$tmp/nginx.conf" <<EOF
worker_processes 1;
pid $tmp/nginx.pid;
error_log $tmp/nginx.log warn;
events { worker_connections 8192; }
http {
  access_log off;
  keepalive_timeout 300s;
  keepalive_requests 1000000000;
  $(om_nginx_temp_paths "$tmp/")
  server {
    listen 127.0.0.1:$up_a;
    listen 127.0.0.1:$up_b;
    location / { return 200 "ok"; }
  }
  server {
    listen 127.0.0.1:$status_port;
    location / { stub_status; }
  }
}
EOF

pool_field=
if [ -n "$max_idle" ]; then
  pool_field="pool = { max_idle_per_peer = $max_idle },"
fi
cat >"$tmp/traffic.lua" <<EOF
return {
  kind = "traffic",
  description = "All peers, the upstream pool of OM_BENCH_MAX_IDLE.",
  subset = function(_, peers) return peers end,
  $pool_field
}
EOF

cat >"$tmp/static.json" <<EOF
{"services": {"bench": {"revision": 1, "instances": [
  {"id": "a", "url": "http://127.0.0.1:$up_a"},
  {"id": "b", "url": "http://127.0.0.1:$up_b"}]}}}
EOF

start nginx "$up_a" nginx -p "$tmp" -e "$tmp/nginx.log" \
  -c "$tmp/nginx.conf" -g "daemon off;"
start proxy "$proxy_port" "$bin" proxy --listen "127.0.0.1:$proxy_port" \
  --admin "127.0.0.1:$admin_port" --policy "$tmp/traffic.lua" \
  --static "$tmp/static.json" --log-level warn

if [ "$(curl -sS -H 'Host: bench' "http://127.0.0.1:$proxy_port/")" != ok ]; then
  log "the proxy does not answer ok"
  exit 1
fi

# nginx_accepts: the connections nginx accepted so far, this call's own
# included (so a difference of two counts one status call too many)
nginx_accepts() {
  curl -sS "http://127.0.0.1:$status_port/" | awk 'NR == 3 { print $1 }'
}

# proxy_conns: "NEW REUSED" from the proxy's metric for service bench
proxy_conns() {
  curl -sS "http://127.0.0.1:$admin_port/metrics" | awk '
    /^openmesh_proxy_upstream_connections_total\{service="bench",reason="new"\}/ { n = $2 }
    /^openmesh_proxy_upstream_connections_total\{service="bench",reason="reused"\}/ { r = $2 }
    END { printf "%d %d\n", n, r }'
}

# run_wrk CONNS SECONDS: wrk's request count; fails on non-2xx answers
run_wrk() {
  local out n bad
  out=$(wrk -t2 -c"$1" -d"$2"s -H 'Host: bench' "http://127.0.0.1:$proxy_port/")
  n=$(echo "$out" | awk '/requests in/ { print $1 }')
  bad=$(echo "$out" | awk '/Non-2xx/ { print $NF }')
  if [ -n "$bad" ] && [ "$bad" != 0 ]; then
    log "wrk -c$1 saw $bad non-2xx answers:"
    echo "$out" >&2
    exit 1
  fi
  echo "$n"
}

# median and max of the numbers on stdin
med_max() {
  sort -g | awk '{ v[NR] = $1 } END {
    m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf "%.4f %.4f\n", m, v[NR] }'
}

for c in $conn_counts; do
  run_wrk "$c" 1 >/dev/null # warm-up: the pool grows to what c callers need
  : >"$tmp/proxy.$c"
  : >"$tmp/nginx.$c"
  for r in $(seq "$rounds"); do
    read -r new0 reused0 < <(proxy_conns)
    acc0=$(nginx_accepts)
    n=$(run_wrk "$c" "$duration")
    read -r new1 reused1 < <(proxy_conns)
    acc1=$(nginx_accepts)
    sent=$(((new1 + reused1) - (new0 + reused0)))
    if [ "$sent" -le 0 ] || [ "$n" -le 0 ]; then
      log "c=$c round $r: no requests went through (wrk $n, attempts $sent)"
      exit 1
    fi
    awk -v a=$((new1 - new0)) -v b="$sent" 'BEGIN { printf "%.6f\n", a / b }' \
      >>"$tmp/proxy.$c"
    acc=$((acc1 - acc0 - 1))
    awk -v a="$acc" -v b="$n" 'BEGIN { printf "%.6f\n", a / b }' \
      >>"$tmp/nginx.$c"
    log "c=$c round $r: wrk $n requests; proxy $((new1 - new0)) new of" \
      "$sent attempts; nginx accepted $acc"
  done
  read -r pm px < <(med_max <"$tmp/proxy.$c")
  read -r nm nx < <(med_max <"$tmp/nginx.$c")
  name=proxy_new_upstream_conns_per_request
  [ "$c" = 200 ] || name=${name}_c$c
  echo "$name $pm (bar: <= 0.01; max over $rounds rounds $px)"
  echo "nginx_accepts_per_request_c$c $nm (cross-check of the line above; max $nx)"
done
