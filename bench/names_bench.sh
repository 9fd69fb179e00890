#!/usr/bin/env bash
# bench/names_bench.sh OPENMESH_BIN: peers by name against the same peers by
# address (docs/BENCHMARKS.md "Peers by name"). `make bench` runs it.
#
# One upstream (nginx `return 200 "ok"` on two loopback ports) and three
# `openmesh proxy --static` processes in front of it, each with one loop:
#   addr    the two peers as http://127.0.0.1:PORT;
#   names   the same peers as http://up-a.bench:PORT and up-b.bench, names
#           resolved from a hosts-format file (OPENMESH_RESOLVE_HOSTS, the
#           proxy's test hook: a lookup reads it on libuv's thread pool,
#           as uv_getaddrinfo does), looked up again every 10 ms
#           (resolve_interval_ms) so lookups keep running through the
#           whole run: if one ran on the loop, it would show here;
#   addr_b  addr's twin, the run's A/A control.
# Same policy (pass-through), same client: wrk -t1 -c50 on loopback,
# OM_BENCH_DURATION s per run (default 2), OM_BENCH_ROUNDS rounds (9), the
# order within a round rotated, after a 1 s warm-up of each. Figures: the
# median over rounds of names/addr and of addr_b/addr (the noise: how far
# two equal proxies differ on this machine), for requests per second and
# for the proxy's CPU per request (utime+stime of all its threads, the
# lookups' pool threads included, over wrk's requests: less sensitive
# than rps to what else runs on the machine), plus each median.
#
# Prints `name value unit` lines; each run's detail goes to stderr. Ports
# OM_BENCH_PORT_BASE..+7 (default 19540); the EXIT trap stops what it
# started (by pid) and removes its temp dir. About 1 minute.
set -euo pipefail

bin=${1:-}
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
  echo "usage: bash bench/names_bench.sh PATH/TO/openmesh" >&2
  exit 2
fi
duration=${OM_BENCH_DURATION:-2}
rounds=${OM_BENCH_ROUNDS:-9}
base=${OM_BENCH_PORT_BASE:-19540}

up_a=$base
up_b=$((base + 1))
declare -A port_of=([addr]=$((base + 2)) [names]=$((base + 4))
  [addr_b]=$((base + 6)))

log() { echo "names_bench: $*" >&2; }

# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
om_bench_need wrk nginx curl
om_bench_tmp names-bench
for p in $up_a $up_b ${port_of[addr]} ${port_of[names]} ${port_of[addr_b]}; do
  if port_busy "$p" || port_busy $((p + 1)); then
    log "port $p or $((p + 1)) on 127.0.0.1 is taken; set OM_BENCH_PORT_BASE"
    exit 1
  fi
done

cat >"$tmp/upstream.conf" <<EOF
worker_processes 1;
pid $tmp/upstream.pid;
error_log $tmp/upstream.log warn;
events { worker_connections 4096; }
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
}
EOF

cat >"$tmp/policy.lua" <<EOF
return {
  kind = "traffic",
  subset = function(_, peers) return peers end,
  resolve_interval_ms = 10,
}
EOF

printf '127.0.0.1 up-a.bench\n127.0.0.1 up-b.bench\n' >"$tmp/hosts"
static() { # HOST_A HOST_B
  cat <<EOF
{"services": {"bench": {"revision": 1, "instances": [
  {"id": "a", "url": "http://$1:$up_a"},
  {"id": "b", "url": "http://$2:$up_b"}]}}}
EOF
}
static 127.0.0.1 127.0.0.1 >"$tmp/addr.json"
static up-a.bench up-b.bench >"$tmp/names.json"

declare -A pid_of
start() { # NAME PORT CMD...
  local name=$1 port=$2
  shift 2
  "$@" >"$tmp/$name.out" 2>&1 &
  pid_of[$name]=$!
  pids+=("$!")
  wait_port "$port" "${pid_of[$name]}" "$name"
}
proxy() { # NAME STATIC [ENV=VALUE]
  local name=$1 file=$2 port=${port_of[$1]}
  shift 2
  start "$name" "$port" env "$@" "$bin" proxy --listen "127.0.0.1:$port" \
    --admin "127.0.0.1:$((port + 1))" --policy "$tmp/policy.lua" \
    --static "$file" --log-level warn
}

start upstream "$up_a" nginx -p "$tmp" -e "$tmp/upstream.log" \
  -c "$tmp/upstream.conf" -g "daemon off;"
proxy addr "$tmp/addr.json" OM_BENCH=1
proxy names "$tmp/names.json" "OPENMESH_RESOLVE_HOSTS=$tmp/hosts"
proxy addr_b "$tmp/addr.json" OM_BENCH=1

# Each answers 200 "ok" through both peers (the names resolved first).
for name in addr names addr_b; do
  ok=0
  for _ in $(seq 50); do
    if [ "$(curl -s -H 'Host: bench' "http://127.0.0.1:${port_of[$name]}/")" = ok ]; then
      ok=1
      break
    fi
    sleep 0.1
  done
  if [ $ok -ne 1 ]; then
    log "$name does not answer 200 ok:"
    cat "$tmp/$name.out" >&2 || true
    exit 1
  fi
done

# ticks PID: utime + stime of every thread of PID, in clock ticks.
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

# run NAME SECONDS: "RPS CPU_US_PER_REQUEST" through NAME (wrk's requests
# per second; the proxy's CPU over the run divided by wrk's requests);
# fails on non-2xx or socket errors.
run() {
  local out t0 t1
  t0=$(ticks "${pid_of[$1]}")
  out=$(wrk -t1 -c50 -d"$2"s -H 'Host: bench' "http://127.0.0.1:${port_of[$1]}/" 2>&1)
  t1=$(ticks "${pid_of[$1]}")
  if echo "$out" | grep -qE 'Non-2xx|Socket errors'; then
    log "$1: errors in the run:"
    echo "$out" >&2
    exit 1
  fi
  echo "$out" | awk -v d=$((t1 - t0)) -v hz="$hz" '
    /requests in/ { n = $1 }
    /^Requests\/sec:/ { r = $2 }
    END { printf "%s %.3f\n", r, d / hz * 1e6 / n }'
}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

for name in addr names addr_b; do
  run "$name" 1 >/dev/null
done

orders=("addr names addr_b" "names addr_b addr" "addr_b addr names")
for f in ratio_names ratio_aa cpu_names cpu_aa; do : >"$tmp/$f"; done
declare -A all allcpu
for r in $(seq "$rounds"); do
  declare -A got cpu
  for name in ${orders[$(((r - 1) % 3))]}; do
    read -r got[$name] cpu[$name] < <(run "$name" "$duration")
    all[$name]="${all[$name]:-} ${got[$name]}"
    allcpu[$name]="${allcpu[$name]:-} ${cpu[$name]}"
  done
  log "round $r: rps addr ${got[addr]} names ${got[names]} addr_b ${got[addr_b]};" \
    "CPU us/req addr ${cpu[addr]} names ${cpu[names]} addr_b ${cpu[addr_b]}"
  ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.4f\n", b / a }'; }
  ratio "${got[addr]}" "${got[names]}" >>"$tmp/ratio_names"
  ratio "${got[addr]}" "${got[addr_b]}" >>"$tmp/ratio_aa"
  ratio "${cpu[addr]}" "${cpu[names]}" >>"$tmp/cpu_names"
  ratio "${cpu[addr]}" "${cpu[addr_b]}" >>"$tmp/cpu_aa"
done

lookups=$(curl -s "http://127.0.0.1:$((port_of[names] + 1))/status" |
  python3 -c 'import json,sys; s=json.load(sys.stdin)["services"]["bench"]; print(",".join(p["resolve"] for p in s["peers"]))')
log "names proxy peers after the runs: $lookups"

for name in addr names addr_b; do
  echo "names_rps_$name $(echo "${all[$name]}" | tr ' ' '\n' | grep . | median) req/s"
  echo "names_cpu_per_req_$name $(echo "${allcpu[$name]}" | tr ' ' '\n' | grep . | median) us"
done
echo "names_vs_addr_ratio $(median <"$tmp/ratio_names") ratio"
echo "names_aa_noise_ratio $(median <"$tmp/ratio_aa") ratio"
echo "names_vs_addr_cpu_ratio $(median <"$tmp/cpu_names") ratio"
echo "names_aa_noise_cpu_ratio $(median <"$tmp/cpu_aa") ratio"
