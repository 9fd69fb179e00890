#!/usr/bin/env bash
# bench/body_bench.sh OPENMESH_BIN: CPU per request of a 256 KiB POST
# through `openmesh proxy` against HAProxy with its default threads, both
# in front of the same upstream (docs/BENCHMARKS.md "Request bodies").
#
# The upstream is bench/upload_sink (built beside the benches): it reads
# every body to its last byte before it answers, so each proxy moves the
# whole body. wrk posts the same 256 KiB body over keep-alive connections
# to one proxy at a time, for DURATION seconds; the proxy's CPU (user +
# system, from /proc/PID/stat, every thread) over that run divided by the
# requests wrk completed is its CPU per request. The order of the two
# proxies alternates per round; the figure is the median of the per-round
# ratios (openmesh over HAProxy), with min and max on stderr.
#
# Prints one line per bar, `name value (bar: ...)`; details to stderr.
# Loopback only, ports OM_BENCH_BODY_PORT (default 19600) ..+3; a temp dir
# for every file; the EXIT trap stops what it started.
#
# Environment: ROUNDS (8), DURATION (5 s), CONNS (8),
# OM_BENCH_BODY_BYTES (262144), OM_BENCH_BODY_PORT (19600). --quick: 3
# rounds of 2 s.
set -euo pipefail

bin=${1:-}
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
  echo "usage: bash bench/body_bench.sh PATH/TO/openmesh [--quick]" >&2
  exit 2
fi
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
rounds=${ROUNDS:-8}
duration=${DURATION:-5}
if [ "${2:-}" = --quick ]; then
  rounds=${ROUNDS:-3}
  duration=${DURATION:-2}
fi
conns=${CONNS:-8}
bytes=${OM_BENCH_BODY_BYTES:-262144}
base=${OM_BENCH_BODY_PORT:-19600}
sink_port=$base
proxy_port=$((base + 1))
admin_port=$((base + 2))
haproxy_port=$((base + 3))
sink_bin=$(dirname "$bin")/../bench/upload_sink

log() { echo "body_bench: $*" >&2; }

# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
om_bench_need wrk haproxy
om_bench_tmp body-bench
if [ ! -x "$sink_bin" ]; then
  log "$sink_bin not found (build the bench targets)"
  exit 2
fi
om_bench_ports_free OM_BENCH_BODY_PORT $sink_port $proxy_port $admin_port $haproxy_port

"$sink_bin" "$sink_port" >"$tmp/sink.out" 2>&1 &
pids+=($!)
wait_port "$sink_port" $! sink

# HAProxy as shipped: default threads (one per CPU), HTTP mode, keep-alive
# to the upstream, no splicing (not on by default)
cat >"$tmp/haproxy.cfg" <<EOF
global
  maxconn 4096
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
  http-reuse safe
frontend f
  bind 127.0.0.1:$haproxy_port
  default_backend sink
backend sink
  server s1 127.0.0.1:$sink_port
EOF
haproxy -f "$tmp/haproxy.cfg" -db >"$tmp/haproxy.out" 2>&1 &
haproxy_pid=$!
pids+=("$haproxy_pid")
wait_port "$haproxy_port" $haproxy_pid haproxy

cat >"$tmp/static.json" <<EOF
{"services": {
  "sink": {"revision": 1, "instances": [
    {"id": "sink", "url": "http://127.0.0.1:$sink_port"}]}}}
EOF
"$bin" proxy --static "$tmp/static.json" --listen "127.0.0.1:$proxy_port" \
  --admin "127.0.0.1:$admin_port" --log-level warn >"$tmp/proxy.out" 2>&1 &
proxy_pid=$!
pids+=("$proxy_pid")
wait_port "$proxy_port" $proxy_pid proxy

cat >"$tmp/post.lua" <<EOF
wrk.method = "POST"
wrk.headers["Host"] = "sink"
wrk.headers["Content-Type"] = "application/octet-stream"
wrk.body = string.rep("x", $bytes)
done = function(summary, latency, requests)
  io.stderr:write(string.format("wrk_result %d %d\n", summary.requests,
    summary.errors.status + summary.errors.connect + summary.errors.read +
    summary.errors.write + summary.errors.timeout))
end
EOF

# cpu_ticks PID: user + system clock ticks of every thread of PID so far
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# run PID URL: CPU microseconds per request of PID while wrk posts to URL
run() {
  local t0 t1 out reqs errs hz
  hz=$(getconf CLK_TCK)
  t0=$(cpu_ticks "$1")
  out=$(wrk -t 1 -c "$conns" -d "${duration}s" -s "$tmp/post.lua" "$2" 2>&1 >/dev/null)
  t1=$(cpu_ticks "$1")
  read -r _ reqs errs <<<"$(grep wrk_result <<<"$out")"
  if [ -z "${reqs:-}" ] || [ "$reqs" -eq 0 ] || [ "$errs" -ne 0 ]; then
    log "wrk against $2: ${reqs:-no} requests, ${errs:-?} errors"
    log "$out"
    exit 1
  fi
  awk -v a="$t0" -v b="$t1" -v n="$reqs" -v hz="$hz" \
    'BEGIN {printf "%.1f\n", (b - a) * 1e6 / hz / n}'
}

median() { sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }

# one short warm-up each, not counted: pools and caches filled
run "$proxy_pid" "http://127.0.0.1:$proxy_port/upload" >/dev/null
run "$haproxy_pid" "http://127.0.0.1:$haproxy_port/upload" >/dev/null
: >"$tmp/ratio"
: >"$tmp/om"
: >"$tmp/ha"
for r in $(seq "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then
    o=$(run "$proxy_pid" "http://127.0.0.1:$proxy_port/upload")
    h=$(run "$haproxy_pid" "http://127.0.0.1:$haproxy_port/upload")
  else
    h=$(run "$haproxy_pid" "http://127.0.0.1:$haproxy_port/upload")
    o=$(run "$proxy_pid" "http://127.0.0.1:$proxy_port/upload")
  fi
  log "round $r: openmesh $o us/req, haproxy $h us/req"
  echo "$o" >>"$tmp/om"
  echo "$h" >>"$tmp/ha"
  awk -v a="$o" -v b="$h" 'BEGIN {printf "%.3f\n", a / b}' >>"$tmp/ratio"
done

log "openmesh median $(median <"$tmp/om") us/req, haproxy median $(median <"$tmp/ha") us/req"
log "ratio min $(sort -g "$tmp/ratio" | head -1) max $(sort -g "$tmp/ratio" | tail -1)"
echo "proxy_post256k_cpu_vs_haproxy $(median <"$tmp/ratio" | awk '{printf "%.2f", $1}') (bar: <= 1.2)"
