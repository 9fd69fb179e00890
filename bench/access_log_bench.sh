#!/usr/bin/env bash
# bench/access_log_bench.sh [--quick] OPENMESH_BIN: the cost of the access
# log and the speed of replay (docs/BENCHMARKS.md "Access log and replay").
#
# access_log_overhead: `openmesh proxy` (its default workers) in front of
# one nginx (`return 200 "ok"`), the canary policy with a distinct user per
# request (bench/wrk/users.lua, so every request has a varied field to
# log), wrk -t2 -c50; the proxy with --access-log and without, started
# fresh for each run, OM_BENCH_ROUNDS (4) rounds of OM_BENCH_DURATION
# (3) s, the order alternated each round. The figure is the median of the
# per-round ratios of requests/s, log on over log off (bar >= 0.9).
#
# replay_requests_per_s: `openmesh replay` of a 100,000-line log (made by
# python3 in the access log's format, users distinct) through two canary
# policies (10% and 50%) with --against; logged requests over the wall
# time of the run (bar >= 100,000). Ports OM_BENCH_PORT_BASE (19700)..+2.
set -euo pipefail

quick=0
if [ "${1:-}" = --quick ]; then
  quick=1
  shift
fi
bin=${1:-}
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
  echo "usage: bash bench/access_log_bench.sh [--quick] PATH/TO/openmesh" >&2
  exit 2
fi
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rounds=${OM_BENCH_ROUNDS:-4}
duration=${OM_BENCH_DURATION:-3}
[ "$quick" = 1 ] && rounds=2 duration=2
base=${OM_BENCH_PORT_BASE:-19700}
up_port=$base px_port=$((base + 1)) adm_port=$((base + 2))

log() { echo "access_log_bench: $*" >&2; }
. "$here/lib.sh"
om_bench_need nginx wrk python3
om_bench_ports_free OM_BENCH_PORT_BASE "$up_port" "$px_port" "$adm_port"
om_bench_tmp access-log

cat >"$tmp/nginx.conf" <<EOF
worker_processes 1;
error_log $tmp/nginx.log;
pid $tmp/nginx.pid;
daemon off;
events { worker_connections 4096; }
http {
  access_log off;
$(om_nginx_temp_paths "$tmp/ng_")
  server { listen 127.0.0.1:$up_port; location / { return 200 "ok"; } }
}
EOF
nginx -c "$tmp/nginx.conf" -p "$tmp" >"$tmp/nginx.out" 2>&1 &
pids+=($!)
wait_port "$up_port" "$!" nginx

cat >"$tmp/static.json" <<EOF
{"services": {"bench": {"revision": 1, "instances": [
  {"id": "v1-a", "url": "http://127.0.0.1:$up_port", "metadata": {"version": "v1"}},
  {"id": "v2-a", "url": "http://127.0.0.1:$up_port/", "metadata": {"version": "v2"}}]}}}
EOF
policy=$here/../examples/policies/canary.lua

# run ON|OFF: requests/s of one fresh proxy
run() {
  local extra=() pid rps
  [ "$1" = on ] && extra=(--access-log "$tmp/access.log")
  "$bin" proxy --listen "127.0.0.1:$px_port" --admin "127.0.0.1:$adm_port" \
    --static "$tmp/static.json" --policy "$policy" --log-level warn \
    "${extra[@]}" >"$tmp/proxy.out" 2>&1 &
  pid=$!
  pids+=("$pid")
  wait_port "$px_port" "$pid" proxy
  rps=$(wrk -t2 -c50 -d"${duration}s" -H "Host: bench" \
    -s "$here/wrk/users.lua" "http://127.0.0.1:$px_port/" |
    awk '/Requests\/sec/ {print $2}')
  om_bench_stop "$pid"
  rm -f "$tmp/access.log"
  log "log $1: $rps requests/s"
  echo "$rps"
}

ratios=()
for r in $(seq "$rounds"); do
  if [ $((r % 2)) = 1 ]; then
    off=$(run off)
    on=$(run on)
  else
    on=$(run on)
    off=$(run off)
  fi
  ratios+=("$(awk -v a="$on" -v b="$off" 'BEGIN {printf "%.3f", a / b}')")
done
printf '%s\n' "${ratios[@]}" | sort -n | awk -v n="${#ratios[@]}" '
  { v[NR] = $1 }
  END { m = n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
        printf "access_log_overhead %.3f (bar: >= 0.9; log on / log off requests/s, median of %d rounds, min %s max %s)\n", m, n, v[1], v[n] }'

# replay
python3 - "$tmp/big.log" <<'EOF'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(100000):
        f.write(json.dumps({"time": "2026-01-01T00:00:00.000Z",
            "request_id": "%032x" % i, "service": "bench", "method": "GET",
            "path": "/?i=%d" % i, "fields": {"x-user": "user-%d" % i},
            "status": 200, "peer": {"id": "v1-a", "address": "http://127.0.0.1:1"},
            "attempts": 1, "duration_ms": 0.5,
            "policy": {"name": "canary", "version": 1, "revision": 0},
            "outcome": "ok"}, separators=(",", ":")) + "\n")
EOF
cat >"$tmp/peers.json" <<EOF
{"service": "bench", "revision": 1, "instances": [
  {"id": "v1-a", "url": "http://127.0.0.1:$up_port", "weight": 1, "ttl_ms": 10000, "metadata": {"version": "v1"}},
  {"id": "v1-b", "url": "http://127.0.0.1:$up_port", "weight": 1, "ttl_ms": 10000, "metadata": {"version": "v1"}},
  {"id": "v2-a", "url": "http://127.0.0.1:$up_port", "weight": 1, "ttl_ms": 10000, "metadata": {"version": "v2"}}]}
EOF
sed 's/local PERCENT = 10$/local PERCENT = 50/; /^  examples = {/,/^  },$/d' \
  "$policy" >"$tmp/new.lua"
t0=$(date +%s.%N)
set +e
"$bin" replay --log "$tmp/big.log" --policy "$tmp/new.lua" --against "$policy" \
  --peers "$tmp/peers.json" >"$tmp/replay.out" 2>&1
rc=$?
set -e
t1=$(date +%s.%N)
if [ "$rc" -ne 0 ]; then
  log "replay exited $rc:"
  cat "$tmp/replay.out" >&2
  exit 1
fi
cat "$tmp/replay.out" >&2
awk -v a="$t0" -v b="$t1" 'BEGIN {
  printf "replay_requests_per_s %.0f (bar: >= 100000; 100,000 logged requests through two policies, %.2f s)\n", 100000 / (b - a), b - a }'
