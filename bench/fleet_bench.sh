#!/usr/bin/env bash
# bench/fleet_bench.sh OPENMESH_BIN [--quick]: what a call costs as the
# fleet grows (docs/BENCHMARKS.md "Fleet size").
#
# One upstream, nginx `return 200 "ok"` listening on every address of one
# port, answers for every peer: peer i is 127.1.(i / 250).(i % 250 + 1)
# (all of 127/8 is loopback). `openmesh proxy --static` serves a service of
# 2, 16, 4,096 and 10,000 such peers; the first two carry metadata
# group = hot. Three traffic policies:
#   cached  vary = {}: returns the hot peers, so the decision is cached and
#           a call never runs Lua; unkeyed (P2C over the cached subset).
#   keyed   vary = {}: returns every peer; wrk sends a distinct
#           x-openmesh-key per request, so each call picks the key's
#           rendezvous peer among all of them.
#   novary  no vary: the policy runs on every call and returns the hot
#           peers (policy.by(peers, "group", "hot"): a group made once
#           per topology).
# And nginx with `hash $http_x_openmesh_key consistent` over the same 4,096
# servers (keepalive pool) as the keyed baseline.
#
# CPU per request: the proxy's utime+stime (/proc/PID/stat of the process
# tree) over a wrk run (-t1 -c$CONNS) divided by wrk's request count.
# Rounds are interleaved: each round runs every configuration once; a
# ratio is the median of the per-round ratios, with min and max.
#
# Prints one line per bar, `name value (bar: ...)`, and the per-size
# figures as `name value unit`; details go to stderr. Loopback only, ports
# OM_BENCH_PORT_BASE..+3 (default 19580); the EXIT trap stops everything
# it started and removes its temp dir.
#
# Environment: DURATION seconds per run (default 5), ROUNDS (default 5),
# CONNS (default 32), OM_BENCH_PORT_BASE. --quick: 1 round of 2 s.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/lib.sh
. "$here/lib.sh"

bin=${1:?usage: fleet_bench.sh OPENMESH_BIN [--quick]}
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
duration=${DURATION:-5}
rounds=${ROUNDS:-5}
conns=${CONNS:-32}
if [ "${2:-}" = "--quick" ]; then
  duration=2
  rounds=1
fi
base=${OM_BENCH_PORT_BASE:-19580}
up_port=$base
proxy_port=$((base + 1))
admin_port=$((base + 2))
nginx_port=$((base + 3))
sizes=(2 16 4096 10000)

log() { echo "fleet_bench: $*" >&2; }
wait_port_s=30 # 10,000 peers and 4,096 servers take a while to start

om_bench_ports_free OM_BENCH_PORT_BASE $up_port $proxy_port $admin_port $nginx_port

om_bench_tmp fleet

addr_of() { echo "127.1.$(($1 / 250)).$(($1 % 250 + 1))"; }

nginx_head() { # NAME
  cat <<EOF
worker_processes 1;
pid $tmp/$1.pid;
error_log $tmp/$1.log warn;
events { worker_connections 65536; }
http {
  access_log off;
  keepalive_timeout 300s;
  keepalive_requests 1000000000;
  $(om_nginx_temp_paths "$tmp/$1-")
EOF
}

{
  nginx_head upstream
  cat <<EOF
  server {
    listen $up_port reuseport;
    location / { return 200 "ok"; }
  }
}
EOF
} >"$tmp/upstream.conf"

{
  nginx_head nginx
  echo "  upstream fleet {"
  echo "    hash \$http_x_openmesh_key consistent;"
  for ((i = 0; i < 4096; i++)); do
    echo "    server $(addr_of "$i"):$up_port;"
  done
  cat <<EOF
    keepalive 64;
  }
  server {
    listen 127.0.0.1:$nginx_port;
    location / {
      proxy_pass http://fleet;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
EOF
} >"$tmp/nginx.conf"

# The topologies: N peers, the first two in group "hot".
for n in "${sizes[@]}"; do
  {
    printf '{"services": {"fleet": {"revision": 1, "instances": [\n'
    for ((i = 0; i < n; i++)); do
      g=cold
      [ "$i" -lt 2 ] && g=hot
      sep=,
      [ "$i" -eq $((n - 1)) ] && sep=
      printf '  {"id": "p%05d", "url": "http://%s:%s", "metadata": {"group": "%s"}}%s\n' \
        "$i" "$(addr_of "$i")" "$up_port" "$g" "$sep"
    done
    printf ']}}}\n'
  } >"$tmp/static-$n.json"
done

cat >"$tmp/cached.lua" <<'EOF'
local policy = require "openmesh.policy"
return {
  kind = "traffic",
  vary = {},
  subset = function(req, peers) return policy.by(peers, "group", "hot") end,
}
EOF
cat >"$tmp/keyed.lua" <<'EOF'
return {
  kind = "traffic",
  vary = {},
  subset = function(req, peers) return peers end,
}
EOF
cat >"$tmp/novary.lua" <<'EOF'
local policy = require "openmesh.policy"
return {
  kind = "traffic",
  subset = function(req, peers) return policy.by(peers, "group", "hot") end,
}
EOF
# distinct keys: a counter per wrk thread
cat >"$tmp/keys.lua" <<'EOF'
local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", "/", { ["Host"] = "fleet",
    ["x-openmesh-key"] = "user-" .. n })
end
EOF
cat >"$tmp/host.lua" <<'EOF'
wrk.headers["Host"] = "fleet"
EOF

"$bin" check "$tmp/cached.lua" "$tmp/keyed.lua" "$tmp/novary.lua" >&2

nginx -p "$tmp" -e "$tmp/upstream.log" -c "$tmp/upstream.conf" \
  -g "daemon off;" >"$tmp/upstream.out" 2>&1 &
pids+=("$!")
wait_port "$up_port" "$!" upstream

clk_tck=$(getconf CLK_TCK)
# run PID PORT SCRIPT: CPU microseconds per request of PID over one wrk run
run() {
  local pid=$1 port=$2 script=$3 t0 t1 out reqs bad
  out="$tmp/wrk.out"
  t0=$(om_bench_cpu_ticks "$pid")
  wrk -t1 -c"$conns" -d"${duration}s" -s "$script" \
    "http://127.0.0.1:$port/" >"$out" 2>&1
  t1=$(om_bench_cpu_ticks "$pid")
  reqs=$(awk '/ requests in / {print $1}' "$out")
  bad=$(awk '/Non-2xx/ {print $NF}' "$out")
  if [ -z "$reqs" ] || [ "$reqs" -eq 0 ] || [ -n "$bad" ]; then
    log "run on port $port failed:"
    cat "$out" >&2
    exit 1
  fi
  awk -v d=$((t1 - t0)) -v r="$reqs" -v hz="$clk_tck" \
    'BEGIN { printf "%.2f", d / hz * 1e6 / r }'
}

# proxy N POLICY: start the proxy on topology N with POLICY; sets ppid
proxy() {
  "$bin" proxy --listen "127.0.0.1:$proxy_port" \
    --admin "127.0.0.1:$admin_port" --policy "$tmp/$2.lua" \
    --static "$tmp/static-$1.json" --log-level warn \
    >"$tmp/proxy.out" 2>&1 &
  ppid=$!
  pids+=("$ppid")
  wait_port "$proxy_port" "$ppid" proxy
  # a first call through it: 200, through a peer
  curl -sS -o /dev/null -w '%{http_code}' -H "Host: fleet" \
    "http://127.0.0.1:$proxy_port/" | grep -q 200 || {
    log "the proxy on $1 peers with $2 does not answer 200"
    exit 1
  }
}

stop() {
  kill -TERM "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  while port_busy "$proxy_port"; do sleep 0.1; done
}

declare -A fig
for ((r = 1; r <= rounds; r++)); do
  for n in "${sizes[@]}"; do
    for pol in cached keyed novary; do
      script=$tmp/host.lua
      [ "$pol" = keyed ] && script=$tmp/keys.lua
      proxy "$n" "$pol"
      v=$(run "$ppid" "$proxy_port" "$script")
      stop "$ppid"
      fig[$pol,$n,$r]=$v
      log "round $r: $pol at $n peers: $v us of CPU per request"
    done
  done
  nginx -p "$tmp" -e "$tmp/nginx.log" -c "$tmp/nginx.conf" \
    -g "daemon off;" >"$tmp/nginx.out" 2>&1 &
  npid=$!
  pids+=("$npid")
  wait_port "$nginx_port" "$npid" nginx
  v=$(run "$npid" "$nginx_port" "$tmp/keys.lua")
  kill -TERM "$npid" 2>/dev/null || true
  wait "$npid" 2>/dev/null || true
  fig[nginx,4096,$r]=$v
  log "round $r: nginx hash consistent at 4096 servers: $v us per request"
done

# ratios NUM DEN: "median min max" of the per-round ratios
ratios() {
  local r
  for ((r = 1; r <= rounds; r++)); do
    awk -v a="${fig[$1,$r]}" -v b="${fig[$2,$r]}" 'BEGIN { printf "%.4f\n", a / b }'
  done | sort -g | awk '{ v[NR] = $1 } END {
    m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf "%.2f %.2f %.2f", m, v[1], v[NR] }'
}
median() { # KEY
  local r
  for ((r = 1; r <= rounds; r++)); do echo "${fig[$1,$r]}"; done | sort -g |
    awk '{ v[NR] = $1 } END {
      printf "%.2f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

for pol in cached keyed novary; do
  for n in "${sizes[@]}"; do
    echo "fleet_${pol}_cpu_us_${n} $(median "$pol,$n") us/request"
  done
done
echo "fleet_nginx_hash_cpu_us_4096 $(median nginx,4096) us/request"

read -r m lo hi <<<"$(ratios keyed,4096 nginx,4096)"
echo "fleet_keyed_4096_vs_nginx_hash $m (bar: <= 1.0; min $lo max $hi)"
read -r m lo hi <<<"$(ratios cached,10000 cached,2)"
echo "fleet_cached_10000_vs_2 $m (bar: <= 1.3; min $lo max $hi)"
read -r m lo hi <<<"$(ratios novary,4096 novary,16)"
echo "fleet_novary_4096_vs_16 $m (bar: <= 5.0; min $lo max $hi)"
