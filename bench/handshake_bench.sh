#!/usr/bin/env bash
# bench/handshake_bench.sh OPENMESH_BIN: full TLS handshakes per second of
# an openmesh listener against nginx's (docs/BENCHMARKS.md "TLS
# handshakes"). `make bench` runs it.
#
# Contenders, one process (one thread) each, on the same throwaway
# certificate (EC P-256, tests/fixtures/tls_certs.sh):
#   openmesh  `openmesh control --tls-cert --tls-key` (its HTTP server is
#             the one every openmesh listener uses);
#   nginx     one worker, `listen ssl`, ssl_session_cache off and
#             ssl_session_tickets off;
#   nginx_b   a second nginx with the same config: the A/A control (the
#             nginx_b/nginx ratio is the run's noise).
# Client: `openssl s_time -new` (a new session per connection, no
# resumption, handshake only: no payload), for OM_BENCH_TLS_SECONDS (4)
# per run, OM_BENCH_TLS_ROUNDS (5) rounds, the contenders' order rotated
# each round. A run's figure is the connections s_time completed over
# the wall-clock time it took; a ratio
# is the median of the per-round ratios (each from runs next to each
# other).
#
# Also the server's CPU time per handshake (utime + stime of the process
# doing them, /proc/PID/stat, over the run): tls_handshake_cpu_ratio is
# nginx's over openmesh's (above 1: openmesh spends less), steadier on a
# loaded machine than the rates.
#
# Prints `name value unit` lines; each run's figures go to stderr. Exits
# non-zero when a contender does not start. Loopback only, ports
# OM_BENCH_TLS_PORT_BASE..+2 (default 19520); a temp dir for certificates,
# configs and logs; the EXIT trap stops what it started (by pid). About
# 70 s.
set -euo pipefail

bin=${1:?usage: handshake_bench.sh OPENMESH_BIN}
secs=${OM_BENCH_TLS_SECONDS:-4}
rounds=${OM_BENCH_TLS_ROUNDS:-5}
base=${OM_BENCH_TLS_PORT_BASE:-19520}
here=$(cd "$(dirname "$0")/.." && pwd)

log() { echo "handshake_bench: $*" >&2; }

# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
om_bench_need nginx openssl
om_bench_tmp handshake-bench

om_port=$base
ng_port=$((base + 1))
ngb_port=$((base + 2))
om_bench_ports_free OM_BENCH_TLS_PORT_BASE $om_port $ng_port $ngb_port

"$here/tests/fixtures/tls_certs.sh" "$tmp/certs"
cert=$tmp/certs/server.pem
key=$tmp/certs/server.key

"$bin" control --listen "127.0.0.1:$om_port" --log-level warn \
  --tls-cert "$cert" --tls-key "$key" >"$tmp/openmesh.out" 2>&1 &
pids+=($!)
om_pid=$!
wait_port $om_port $om_pid openmesh

nginx_conf() { # NAME PORT
  cat <<CONF
worker_processes 1;
pid $tmp/$1.pid;
error_log $tmp/$1.out warn;
events { worker_connections 4096; }
http {
  access_log off;
  $(om_nginx_temp_paths "$tmp/$1-")
  server {
    listen 127.0.0.1:$2 ssl;
    ssl_certificate $cert;
    ssl_certificate_key $key;
    ssl_session_cache off;
    ssl_session_tickets off;
    location / { return 200 "ok"; }
  }
}
CONF
}
for n in nginx:$ng_port nginx_b:$ngb_port; do
  name=${n%%:*}
  port=${n##*:}
  nginx_conf "$name" "$port" >"$tmp/$name.conf"
  nginx -c "$tmp/$name.conf" -g 'daemon off;' >"$tmp/$name.out" 2>&1 &
  pids+=($!)
  wait_port "$port" $! "$name"
done
# nginx's handshakes happen in its worker, the master's child
ng_pid=$(pgrep -P "$(cat "$tmp/nginx.pid")" | head -1)
ngb_pid=$(pgrep -P "$(cat "$tmp/nginx_b.pid")" | head -1)

# cpu PID: utime + stime of PID in clock ticks (/proc/PID/stat)
cpu() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

# run PORT PID: "RATE CPU_US": full handshakes per second (the connections
# s_time completed over the wall-clock time it ran; its own "connections/
# user sec" is the client's CPU time) and the server's CPU time per
# handshake (PID: the process doing the handshakes), which a loaded
# machine disturbs less than the rate
run() {
  local t0 t1 c0 c1 n
  c0=$(cpu "$2")
  t0=$(date +%s.%N)
  n=$(openssl s_time -connect "127.0.0.1:$1" -new -time "$secs" 2>/dev/null |
    awk '/connections in [0-9]+ real seconds/ { print $1 }')
  t1=$(date +%s.%N)
  c1=$(cpu "$2")
  [ -n "$n" ] && [ "$n" -gt 0 ] &&
    awk -v n="$n" -v a="$t0" -v b="$t1" -v c="$((c1 - c0))" -v hz="$hz" \
      'BEGIN { printf "%.1f %.1f", n / (b - a), c * 1e6 / hz / n }'
}

declare -A port=([openmesh]=$om_port [nginx]=$ng_port [nginx_b]=$ngb_port)
declare -A pid=([openmesh]=$om_pid [nginx]=$ng_pid [nginx_b]=$ngb_pid)
order=(openmesh nginx nginx_b)
ratios=() aa=() cpu_ratios=() cpu_aa=() om_rate=() ng_rate=() om_cpu=() ng_cpu=()
div() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
for r in $(seq "$rounds"); do
  declare -A rate=() us=()
  for c in "${order[@]}"; do
    out=$(run "${port[$c]}" "${pid[$c]}") || true
    [ -n "$out" ] || {
      log "round $r: $c gave no figure"
      exit 1
    }
    rate[$c]=${out% *}
    us[$c]=${out#* }
  done
  log "round $r: openmesh ${rate[openmesh]}/s ${us[openmesh]} us," \
    "nginx ${rate[nginx]}/s ${us[nginx]} us, nginx_b ${rate[nginx_b]}/s ${us[nginx_b]} us"
  ratios+=("$(div "${rate[openmesh]}" "${rate[nginx]}")")
  aa+=("$(div "${rate[nginx_b]}" "${rate[nginx]}")")
  # CPU: nginx's per handshake over ours, so above 1 is better as for rates
  cpu_ratios+=("$(div "${us[nginx]}" "${us[openmesh]}")")
  cpu_aa+=("$(div "${us[nginx]}" "${us[nginx_b]}")")
  om_rate+=("${rate[openmesh]}")
  ng_rate+=("${rate[nginx]}")
  om_cpu+=("${us[openmesh]}")
  ng_cpu+=("${us[nginx]}")
  order=("${order[@]:1}" "${order[0]}") # rotate
  unset rate us
done

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END {
  if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "tls_handshakes_per_s_openmesh $(median "${om_rate[@]}") handshakes/s"
echo "tls_handshakes_per_s_nginx $(median "${ng_rate[@]}") handshakes/s"
echo "tls_handshakes_per_s $(median "${ratios[@]}") ratio"
echo "tls_handshakes_per_s_aa $(median "${aa[@]}") ratio"
echo "tls_handshake_cpu_us_openmesh $(median "${om_cpu[@]}") us"
echo "tls_handshake_cpu_us_nginx $(median "${ng_cpu[@]}") us"
echo "tls_handshake_cpu_ratio $(median "${cpu_ratios[@]}") ratio"
echo "tls_handshake_cpu_ratio_aa $(median "${cpu_aa[@]}") ratio"
