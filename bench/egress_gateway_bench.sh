#!/usr/bin/env bash
# bench/egress_gateway_bench.sh [--quick] OPENMESH_BIN: `openmesh egress`
# against the Portkey AI gateway (npm @portkey-ai/gateway, pinned by
# bench/portkey/package-lock.json) in front of the same loopback provider
# (docs/BENCHMARKS.md "Egress gateways"). `make bench` runs it.
#
# The provider is bench/fast_provider (answers at once, so a gateway's own
# cost is not hidden by the provider's); every contender gets the same
# chat completion from the same client:
#   direct    the provider itself, twice per round (direct and direct_b:
#             the A/A control of the latency figures);
#   openmesh  `openmesh egress` with one OpenAI route to the provider
#             (a fallback policy of one route, retries on);
#   portkey   Portkey's start-server with an x-portkey-config of a
#             fallback strategy whose one target is the provider
#             (custom_host), its retries on;
#   hop       nginx proxy_pass to the provider (one worker, upstream
#             keep-alive, no buffering): one more process on the path and
#             nothing else, the floor under any gateway's added latency
#             on this machine in this run.
# Per round (OM_BENCH_ROUNDS, 5), in rotated order: bench/chat_client at
# one connection for OM_BENCH_DURATION s (JSON; then streamed, where the
# contender streams), and wrk -c50 for the throughput. Added latency is a
# contender's p50 (p99) minus direct's in the same round, the median over
# rounds; a ratio is the median of per-round ratios. The gateway's own
# time per call (openmesh_egress_overhead_seconds, its mean over each of
# its three runs of a round) is read from its /metrics. RSS is read from
# /proc after the runs. Portkey's calls are checked to reach the provider
# (its /_count grows by what the client counted).
#
# Prints `name value (bar: ...)` for the figures with a bar and `name value
# unit` for the rest; details to stderr. Ports OM_BENCH_PORT_BASE..+2
# (default 19800). About 2 minutes (--quick: 2 rounds of 2 s).
set -euo pipefail

quick=0
if [ "${1:-}" = "--quick" ]; then
  quick=1
  shift
fi
bin=${1:-}
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
  echo "usage: bash bench/egress_gateway_bench.sh [--quick] PATH/TO/openmesh" >&2
  exit 2
fi
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tools=$(dirname "$bin")/../bench
rounds=${OM_BENCH_ROUNDS:-5}
duration=${OM_BENCH_DURATION:-4}
if [ "$quick" = 1 ]; then
  rounds=${OM_BENCH_ROUNDS:-2}
  duration=${OM_BENCH_DURATION:-2}
fi
base=${OM_BENCH_PORT_BASE:-19800}
for v in rounds duration base; do
  if ! [[ ${!v} =~ ^[1-9][0-9]*$ ]]; then
    echo "egress_gateway_bench: $v must be a positive integer, not '${!v}'" >&2
    exit 2
  fi
done
prov_port=$base
om_port=$((base + 1))
pk_port=$((base + 2))
hop_port=$((base + 3))

log() { echo "egress_gateway_bench: $*" >&2; }

# shellcheck source=bench/lib.sh
. "$here/lib.sh"
om_bench_need wrk node curl nginx
for t in fast_provider chat_client; do
  if [ ! -x "$tools/$t" ]; then
    log "$tools/$t not found (build the bench targets)"
    exit 1
  fi
done
if [ ! -f "$here/portkey/node_modules/@portkey-ai/gateway/build/start-server.js" ]; then
  log "Portkey is not installed (scripts/deps-bench runs npm ci in bench/portkey)"
  exit 1
fi
om_bench_tmp egress-gateway-bench
om_bench_ports_free OM_BENCH_PORT_BASE "$prov_port" "$om_port" "$pk_port" "$hop_port"
declare -A pid_of port_of=([direct]=$prov_port [direct_b]=$prov_port [openmesh]=$om_port [portkey]=$pk_port [hop]=$hop_port)

start() { # NAME PORT CMD...
  local name=$1 port=$2
  shift 2
  "$@" >"$tmp/$name.out" 2>&1 &
  pids+=("$!")
  pid_of[$name]=$!
  wait_port_s=30 wait_port "$port" "$!" "$name"
}

cat >"$tmp/fallback.lua" <<EOF
return {
  kind = "fallback",
  routes = {
    { name = "fast", provider = "openai", base_url = "http://127.0.0.1:$prov_port/v1",
      model = "gpt-fast", attempt_timeout_ms = 5000, first_byte_timeout_ms = 2000 },
  },
  max_attempts = 3,
}
EOF
pk_config='{"strategy":{"mode":"fallback"},"retry":{"attempts":2},"targets":[{"provider":"openai","api_key":"sk-bench","custom_host":"http://127.0.0.1:'$prov_port'/v1"}]}'

start provider "$prov_port" "$tools/fast_provider" "$prov_port"
pid_of[direct]=${pid_of[provider]}
pid_of[direct_b]=${pid_of[provider]}
start openmesh "$om_port" "$bin" egress --listen "127.0.0.1:$om_port" \
  --fallback "$tmp/fallback.lua" --heuristics "$here/../policies/egress_heuristics.lua" \
  --errors "$tmp/errors.jsonl" --log-level warn
cat >"$tmp/hop.conf" <<EOF
worker_processes 1;
pid $tmp/hop.pid;
events { worker_connections 1024; }
http {
  access_log off;
  keepalive_timeout 300s;
  keepalive_requests 1000000000;
$(om_nginx_temp_paths "$tmp/hop-")
  upstream provider { server 127.0.0.1:$prov_port; keepalive 64; keepalive_requests 1000000000; }
  server {
    listen 127.0.0.1:$hop_port;
    location / {
      proxy_pass http://provider;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
EOF
start hop "$hop_port" nginx -p "$tmp" -e "$tmp/hop.log" -c "$tmp/hop.conf" -g "daemon off;"
(cd "$here/portkey" && NODE_ENV=production exec node --import ./loopback.mjs \
  node_modules/@portkey-ai/gateway/build/start-server.js --port="$pk_port" --headless) \
  >"$tmp/portkey.out" 2>&1 &
pids+=("$!")
pid_of[portkey]=$!
wait_port_s=30 wait_port "$pk_port" "$!" portkey

headers_of() { # NAME: the extra headers the contender needs
  if [ "$1" = portkey ]; then
    echo "x-portkey-config: $pk_config"
  fi
}

provider_count() {
  curl -sS "http://127.0.0.1:$prov_port/_count" | sed 's/.*"total":\([0-9]*\).*/\1/'
}

# client NAME MODE: chat_client's figures ("p50 p99 [ttft_p50]") for one run
client() {
  local name=$1 mode=$2 h out
  h=$(headers_of "$name")
  out=$("$tools/chat_client" --port "${port_of[$name]}" --mode "$mode" \
    --seconds "$duration" --warmup 200 --path /v1/chat/completions \
    ${h:+--header "$h"}) || {
    log "$name ($mode) failed:"
    echo "$out" >&2
    tail -20 "$tmp/$name.out" >&2 2>/dev/null || true
    return 1
  }
  echo "$out" >"$tmp/last.$name.$mode"
  awk '/^p50_us/ { p = $2 } /^p99_us/ { q = $2 } /^ttft_p50_us/ { t = $2 }
       /^n / { n = $2 } END { print p, q, (t == "" ? "-" : t), n }' <<<"$out"
}

# rps NAME: requests per second of wrk -c50 (every answer a 200)
rps() {
  local name=$1 h out bad
  h=$(headers_of "$name")
  out=$(wrk -t2 -c50 -d"$duration"s -s "$here/wrk/chat.lua" ${h:+-H "$h"} \
    "http://127.0.0.1:${port_of[$name]}/v1/chat/completions")
  bad=$(awk '/Non-2xx/ { print $NF }' <<<"$out")
  if [ -n "$bad" ] && [ "$bad" != 0 ]; then
    log "$name: wrk saw $bad non-2xx answers"
    echo "$out" >&2
    exit 1
  fi
  awk '/^Requests\/sec:/ { print $2 }' <<<"$out"
}

# own_time: "COUNT SUM" of the gateway's openmesh_egress_overhead_seconds
# {api="chat"} (its own time per call: docs/EGRESS.md "The gateway's own
# time")
own_time() {
  curl -sS "http://127.0.0.1:${port_of[openmesh]}/metrics" | awk '
    /^openmesh_egress_overhead_seconds_count\{api="chat"\}/ { n = $2 }
    /^openmesh_egress_overhead_seconds_sum\{api="chat"\}/ { s = $2 }
    END { print n + 0, s + 0 }'
}

# own_mean N0 S0 N1 S1: the mean own time in us of the calls in between
own_mean() {
  awk -v n0="$1" -v s0="$2" -v n1="$3" -v s1="$4" \
    'BEGIN { printf "%.2f\n", (n1 > n0) ? (s1 - s0) / (n1 - n0) * 1e6 : 0 }'
}

rss_mb() {
  awk '/^VmRSS:/ { printf "%.1f\n", $2 / 1024 }' "/proc/$1/status"
}

med() {
  sort -g | awk '{ v[NR] = $1 } END {
    m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf "%.3f %.3f %.3f\n", m, v[1], v[NR] }'
}

# Portkey must really reach the provider: count both sides once.
c0=$(provider_count)
read -r _ _ _ n < <(client portkey json)
c1=$(provider_count)
if [ "$((c1 - c0))" -lt "$n" ]; then
  log "portkey answered $n calls but the provider served $((c1 - c0))"
  exit 1
fi
log "portkey reached the provider: $n calls answered, $((c1 - c0)) served (warm-up included)"
pk_streams=1
if ! client portkey stream >/dev/null 2>&1; then
  pk_streams=0
  log "portkey does not stream here (its answer is in $tmp/portkey.out); streamed figures without it"
fi

contenders=(direct openmesh portkey hop direct_b)
for r in $(seq "$rounds"); do
  declare -A p50=() p99=() ttft=() tput=()
  for i in 0 1 2 3 4; do
    c=${contenders[$(((i + r) % 5))]}
    [ "$c" != openmesh ] || read -r on0 os0 < <(own_time)
    read -r p50[$c] p99[$c] _ _ < <(client "$c" json)
    [ "$c" != openmesh ] || read -r on1 os1 < <(own_time)
    if [ "$c" != portkey ] || [ "$pk_streams" = 1 ]; then
      read -r _ _ ttft[$c] _ < <(client "$c" stream)
    fi
    [ "$c" != openmesh ] || read -r on2 os2 < <(own_time)
    [ "$c" = direct_b ] || [ "$c" = hop ] || tput[$c]=$(rps "$c")
    if [ "$c" = openmesh ]; then
      read -r on3 os3 < <(own_time)
      own_mean "$on0" "$os0" "$on1" "$os1" >>"$tmp/own.c1"
      own_mean "$on1" "$os1" "$on2" "$os2" >>"$tmp/own.stream"
      own_mean "$on2" "$os2" "$on3" "$os3" >>"$tmp/own.c50"
    fi
    log "round $r: $c p50 ${p50[$c]} us, p99 ${p99[$c]} us, ttft p50 ${ttft[$c]:--} us, ${tput[$c]:--} req/s"
  done
  for c in openmesh portkey hop direct_b; do
    echo "${p50[$c]} ${p50[direct]}" | awk '{ print $1 - $2 }' >>"$tmp/add50.$c"
    echo "${p99[$c]} ${p99[direct]}" | awk '{ print $1 - $2 }' >>"$tmp/add99.$c"
  done
  for c in openmesh hop direct_b; do
    echo "${ttft[$c]} ${ttft[direct]}" | awk '{ print $1 - $2 }' >>"$tmp/ttft.$c"
  done
  # the gateway's latency over the bare hop's, in the same round
  echo "${p50[openmesh]} ${p50[hop]}" | awk '{ print $1 - $2 }' >>"$tmp/over_hop50"
  echo "${ttft[openmesh]} ${ttft[hop]}" | awk '{ print $1 - $2 }' >>"$tmp/over_hop_ttft"
  if [ "$pk_streams" = 1 ]; then
    echo "${ttft[portkey]} ${ttft[direct]}" | awk '{ print $1 - $2 }' >>"$tmp/ttft.portkey"
  fi
  echo "${p50[openmesh]} ${p50[direct]} ${p50[portkey]}" |
    awk '{ a = $1 - $2; b = $3 - $2; print (b > 0 ? a / b : 0) }' >>"$tmp/ratio50"
  echo "${tput[openmesh]} ${tput[portkey]}" | awk '{ print $1 / $2 }' >>"$tmp/ratio_tput"
  echo "${tput[openmesh]}" >>"$tmp/tput.openmesh"
  echo "${tput[portkey]}" >>"$tmp/tput.portkey"
  echo "${tput[direct]}" >>"$tmp/tput.direct"
done

read -r m lo hi < <(med <"$tmp/ratio50")
echo "egress_added_p50_vs_portkey $m (bar: <= 0.25; min $lo, max $hi over $rounds rounds)"
read -r m lo hi < <(med <"$tmp/ratio_tput")
echo "egress_throughput_vs_portkey_c50 $m (bar: >= 4; min $lo, max $hi)"
read -r m lo hi < <(med <"$tmp/add50.openmesh")
echo "egress_added_p50_us_c1 $m (bar: <= 20; min $lo, max $hi; A/A direct_b $(med <"$tmp/add50.direct_b" | cut -d' ' -f1))"
read -r m _ _ < <(med <"$tmp/add99.openmesh")
echo "egress_added_p99_us_c1 $m us"
read -r m lo hi < <(med <"$tmp/ttft.openmesh")
echo "egress_streamed_ttft_added_us $m (bar: <= 50; min $lo, max $hi; A/A direct_b $(med <"$tmp/ttft.direct_b" | cut -d' ' -f1))"
read -r m lo hi < <(med <"$tmp/add50.hop")
echo "hop_added_p50_us_c1 $m us (nginx proxy_pass, the floor; min $lo, max $hi)"
read -r m lo hi < <(med <"$tmp/ttft.hop")
echo "hop_streamed_ttft_added_us $m us (min $lo, max $hi)"
read -r m lo hi < <(med <"$tmp/over_hop50")
echo "egress_p50_over_hop_us_c1 $m us (the gateway's own share; min $lo, max $hi)"
read -r m lo hi < <(med <"$tmp/over_hop_ttft")
echo "egress_ttft_over_hop_us $m us (min $lo, max $hi)"
read -r m lo hi < <(med <"$tmp/own.c1")
echo "egress_own_time_mean_us_c1 $m us (openmesh_egress_overhead_seconds, JSON at one connection; min $lo, max $hi)"
read -r m lo hi < <(med <"$tmp/own.stream")
echo "egress_own_time_mean_us_stream $m us (a whole streamed call, every event relayed; min $lo, max $hi)"
read -r m lo hi < <(med <"$tmp/own.c50")
echo "egress_own_time_mean_us_c50 $m us (JSON at 50 connections; min $lo, max $hi)"
read -r m _ _ < <(med <"$tmp/add50.portkey")
echo "portkey_added_p50_us_c1 $m us"
read -r m _ _ < <(med <"$tmp/add99.portkey")
echo "portkey_added_p99_us_c1 $m us"
if [ "$pk_streams" = 1 ]; then
  read -r m _ _ < <(med <"$tmp/ttft.portkey")
  echo "portkey_streamed_ttft_added_us $m us"
else
  echo "portkey_streamed_ttft_added_us n/a (Portkey answered 500 to a streamed call)"
fi
for c in openmesh portkey direct; do
  read -r m _ _ < <(med <"$tmp/tput.$c")
  echo "${c}_rps_c50 $m req/s"
done
echo "openmesh_egress_rss_mb $(rss_mb "${pid_of[openmesh]}") MB"
echo "portkey_rss_mb $(rss_mb "${pid_of[portkey]}") MB"
