#!/usr/bin/env bash
# bench/h2_bench.sh [--quick] OPENMESH_BIN: HTTP/2 callers through the proxy
# (docs/BENCHMARKS.md "HTTP/2"). `make bench` runs it.
#
# proxy_h2_vs_nginx: h2load with 100 concurrent streams over 10 h2c
# connections (prior knowledge: -c10 -m10) through each contender to the
# same HTTP/1.1 upstream, nginx `return 200 "ok"` (worker_processes auto):
#   proxy    `openmesh proxy --static` (its h2c listener is the same port as
#            its HTTP/1.1 one: a connection opening with the HTTP/2 preface
#            is HTTP/2), the default workers, a pass-through policy;
#   nginx    nginx `listen ... http2` (h2c) with `proxy_pass` to the
#            upstream over a keep-alive pool, worker_processes auto;
#   nginx_b  a second nginx configured the same: the run's A/A control,
#            compared with nginx the way the proxy is, so its ratio is the
#            noise of the proxy's.
# OM_BENCH_ROUNDS rounds (5) of one OM_BENCH_DURATION (5 s) h2load run per
# contender, the order rotated by one each round, after a 1 s warm-up
# each. A ratio is the median of the per-round ratios (each from runs of
# the same round) with min and max; CPU per request is the contender's
# utime+stime (every process and thread) over the run, over the requests
# h2load counted.
#
# proxy_grpc_unary_rps: unary gRPC calls (h2load POSTing one gRPC frame
# with content-type application/grpc and te: trailers, the same -c/-m) to
# a gRPC upstream that answers every call with one message and
# grpc-status 0 in its trailers (nginx on h2c: a static frame and
# add_trailer, so the upstream is C and never the bottleneck), two ways:
# grpc_direct (the upstream itself) and grpc_proxy (`openmesh proxy
# --static` with protocol = "h2c"), alternating first per round; same
# rounds and medians as above. No nginx grpc_pass beside them: this
# upstream answers before it reads the request body, which grpc_pass
# turns into a 502 for about 1 % of calls ("upstream sent frame for
# unknown stream"), so its figure would measure that instead.
#
# Prints `name value (bar: ...)` for the figures with a bar, `name value
# unit` for the rest; each run's detail goes to stderr. Exits non-zero when
# a contender fails to start or answers anything but 2xx. Ports
# OM_BENCH_PORT_BASE..+4 (default 19700); the EXIT trap stops what it
# started and removes its temp dir. About 1.5 minutes (--quick: 2 rounds
# of 2 s, about 20 s).
#
# Environment: OM_BENCH_ROUNDS (5), OM_BENCH_DURATION (5 s),
# OM_BENCH_PORT_BASE (19700), OM_BENCH_H2_CONNS (10), OM_BENCH_H2_STREAMS
# (10 per connection).
set -euo pipefail

quick=0
if [ "${1:-}" = "--quick" ]; then
  quick=1
  shift
fi
bin=${1:-}
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
  echo "usage: bash bench/h2_bench.sh [--quick] PATH/TO/openmesh" >&2
  exit 2
fi
rounds=${OM_BENCH_ROUNDS:-5}
duration=${OM_BENCH_DURATION:-5}
if [ "$quick" = 1 ]; then
  rounds=${OM_BENCH_ROUNDS:-2}
  duration=${OM_BENCH_DURATION:-2}
fi
h2_conns=${OM_BENCH_H2_CONNS:-10}
h2_streams=${OM_BENCH_H2_STREAMS:-10}
base=${OM_BENCH_PORT_BASE:-19700}
for v in rounds duration h2_conns h2_streams base; do
  if ! [[ ${!v} =~ ^[1-9][0-9]*$ ]]; then
    echo "h2_bench: $v must be a positive integer, not '${!v}'" >&2
    exit 2
  fi
done

up_port=$base
declare -A port_of=([proxy]=$((base + 1)) [nginx]=$((base + 2)) [nginx_b]=$((base + 3)))
admin_port=$((base + 4))
contenders=(proxy nginx nginx_b)

log() { echo "h2_bench: $*" >&2; }

# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
om_bench_need h2load nginx curl
om_bench_tmp h2-bench
port_of+=([grpc_direct]=$((base + 5)) [grpc_proxy]=$((base + 6)))
grpc_admin_port=$((base + 7))
om_bench_ports_free OM_BENCH_PORT_BASE "$up_port" "${port_of[proxy]}" \
  "${port_of[nginx]}" "${port_of[nginx_b]}" "$admin_port" \
  "${port_of[grpc_direct]}" "${port_of[grpc_proxy]}" "$grpc_admin_port"
clk_tck=$(getconf CLK_TCK)
declare -A pid_of

start() { # NAME PORT CMD...
  local name=$1 port=$2
  shift 2
  "$@" >"$tmp/$name.out" 2>&1 &
  pids+=("$!")
  pid_of[$name]=$!
  wait_port "$port" "$!" "$name"
}

# nginx_conf NAME BODY: an nginx config of its own temp paths and pid file
# (never under /var) around the server block BODY
nginx_conf() {
  mkdir -p "$tmp/$1"
  cat >"$tmp/$1/nginx.conf" <<EOF
worker_processes auto;
pid $tmp/$1/nginx.pid;
error_log $tmp/$1/nginx.log warn;
events { worker_connections 8192; }
http {
  access_log off;
  keepalive_timeout 300s;
  keepalive_requests 1000000000;
  http2_max_concurrent_streams 128;
$(om_nginx_temp_paths "$tmp/$1/")
  upstream up { server 127.0.0.1:$up_port; keepalive 256; }
  $2
}
EOF
}

nginx_conf upstream "server { listen 127.0.0.1:$up_port; location / { return 200 \"ok\"; } }"
for n in nginx nginx_b; do
  nginx_conf "$n" "server { listen 127.0.0.1:${port_of[$n]} http2;
    location / { proxy_pass http://up; proxy_http_version 1.1;
                 proxy_set_header Connection \"\"; } }"
done

cat >"$tmp/traffic.lua" <<'EOF'
return {
  kind = "traffic",
  description = "Every peer: plain proxying, as nginx does.",
  subset = function(_, peers) return peers end,
}
EOF
cat >"$tmp/static.json" <<EOF
{"services": {"bench": {"revision": 1, "instances": [
  {"id": "a", "url": "http://127.0.0.1:$up_port"}]}}}
EOF

start upstream "$up_port" nginx -p "$tmp/upstream" -e "$tmp/upstream/nginx.log" \
  -c "$tmp/upstream/nginx.conf" -g "daemon off;"
for n in nginx nginx_b; do
  start "$n" "${port_of[$n]}" nginx -p "$tmp/$n" -e "$tmp/$n/nginx.log" \
    -c "$tmp/$n/nginx.conf" -g "daemon off;"
done
start proxy "${port_of[proxy]}" "$bin" proxy --listen "127.0.0.1:${port_of[proxy]}" \
  --admin "127.0.0.1:$admin_port" --policy "$tmp/traffic.lua" \
  --static "$tmp/static.json" --log-level warn

for n in "${contenders[@]}"; do
  got=$(curl -sS --http2-prior-knowledge -H 'Host: bench' -o /dev/null \
    -w '%{http_version} %{http_code}' "http://127.0.0.1:${port_of[$n]}/")
  if [ "$got" != "2 200" ]; then
    log "$n does not answer HTTP/2 200 (got: $got)"
    exit 1
  fi
done

# run NAME SECONDS: "REQUESTS_PER_S CPU_US_PER_REQUEST" of one h2load run
# (h2load_extra: more arguments; path: the request's path)
h2load_extra=()
path=/
run() {
  local name=$1 secs=$2 out c0 c1 rps n ok
  c0=$(om_bench_cpu_ticks "${pid_of[$name]}")
  out=$(h2load -c"$h2_conns" -m"$h2_streams" -t2 -D"$secs" -H ':authority: bench' \
    "${h2load_extra[@]}" "http://127.0.0.1:${port_of[$name]}$path" 2>&1)
  c1=$(om_bench_cpu_ticks "${pid_of[$name]}")
  if ! kill -0 "${pid_of[$name]}" 2>/dev/null; then
    log "$name died during the run; its output:"
    tail -40 "$tmp/$name.out" >&2
    exit 1
  fi
  rps=$(echo "$out" | awk '/^finished in/ { gsub(/,/, ""); print $4 }')
  read -r n ok < <(echo "$out" | awk '/^status codes:/ { gsub(/,/, ""); print $3 + $5 + $7 + $9, $3 }')
  if [ -z "$rps" ] || [ -z "$n" ] || [ "$n" -le 0 ] || [ "$ok" != "$n" ]; then
    log "$name: h2load failed or saw non-2xx answers:"
    echo "$out" >&2
    exit 1
  fi
  awk -v r="$rps" -v t=$((c1 - c0)) -v hz="$clk_tck" -v n="$n" \
    'BEGIN { printf "%.1f %.2f\n", r, t / hz * 1e6 / n }'
}

# median, min and max of the numbers on stdin
med_min_max() {
  sort -g | awk '{ v[NR] = $1 } END {
    m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf "%.3f %.3f %.3f\n", m, v[1], v[NR] }'
}

for n in "${contenders[@]}"; do run "$n" 1 >/dev/null; done # warm-up
: >"$tmp/ratio.proxy"
: >"$tmp/ratio.nginx_b"
: >"$tmp/cpu.proxy"
: >"$tmp/cpu.nginx"
: >"$tmp/rps.proxy"
: >"$tmp/rps.nginx"
for r in $(seq "$rounds"); do
  declare -A rps_of=() cpu_of=()
  for i in 0 1 2; do
    n=${contenders[$(((i + r) % 3))]}
    read -r rps_of[$n] cpu_of[$n] < <(run "$n" "$duration")
    log "round $r: $n ${rps_of[$n]} req/s, ${cpu_of[$n]} us CPU per request"
  done
  for n in proxy nginx_b; do
    awk -v a="${rps_of[$n]}" -v b="${rps_of[nginx]}" 'BEGIN { printf "%.4f\n", a / b }' \
      >>"$tmp/ratio.$n"
  done
  awk -v a="${cpu_of[proxy]}" -v b="${cpu_of[nginx]}" 'BEGIN { printf "%.4f\n", a / b }' \
    >>"$tmp/cpu.proxy"
  echo "${cpu_of[nginx]}" >>"$tmp/cpu.nginx"
  echo "${rps_of[proxy]}" >>"$tmp/rps.proxy"
  echo "${rps_of[nginx]}" >>"$tmp/rps.nginx"
done

read -r m lo hi < <(med_min_max <"$tmp/ratio.proxy")
echo "proxy_h2_vs_nginx $m (bar: >= 1.0; min $lo, max $hi over $rounds rounds;" \
  "h2load -c$h2_conns -m$h2_streams)"
read -r m lo hi < <(med_min_max <"$tmp/ratio.nginx_b")
echo "h2_aa_nginx_b_vs_nginx $m (A/A noise; min $lo, max $hi)"
read -r m lo hi < <(med_min_max <"$tmp/cpu.proxy")
echo "proxy_h2_cpu_vs_nginx $m (CPU per request; min $lo, max $hi)"
read -r m _ _ < <(med_min_max <"$tmp/rps.proxy")
echo "proxy_h2_rps $m req/s"
read -r m _ _ < <(med_min_max <"$tmp/rps.nginx")
echo "nginx_h2_rps $m req/s"
read -r m _ _ < <(med_min_max <"$tmp/cpu.nginx")
echo "nginx_h2_cpu_us_per_request $m us"

# --- gRPC unary calls --------------------------------------------------
# one message "ok" (a 5-byte prefix: not compressed, length 2), the
# request h2load sends (one message "hi") and the upstream's answer
mkdir -p "$tmp/grpcroot"
printf '\0\0\0\0\2ok' >"$tmp/grpcroot/reply"
printf '\0\0\0\0\2hi' >"$tmp/grpc.req"
# nginx's workers run as another user (nobody, when the bench is root)
chmod 755 "$tmp" "$tmp/grpcroot"
chmod 644 "$tmp/grpcroot/reply"
nginx_conf grpc_direct "server { listen 127.0.0.1:${port_of[grpc_direct]} http2;
    location / { root $tmp/grpcroot; default_type application/grpc;
                 error_page 405 =200 /reply; try_files /reply =404;
                 add_trailer grpc-status 0 always; } }"
cat >"$tmp/grpc.lua" <<'EOF'
return {
  kind = "traffic",
  description = "Every peer, over HTTP/2: plain gRPC proxying.",
  subset = function(_, peers) return peers end,
  protocol = "h2c",
}
EOF
cat >"$tmp/grpc.json" <<EOF
{"services": {"bench": {"revision": 1, "instances": [
  {"id": "a", "url": "http://127.0.0.1:${port_of[grpc_direct]}"}]}}}
EOF
start grpc_direct "${port_of[grpc_direct]}" nginx -p "$tmp/grpc_direct" \
  -e "$tmp/grpc_direct/nginx.log" -c "$tmp/grpc_direct/nginx.conf" -g "daemon off;"
start grpc_proxy "${port_of[grpc_proxy]}" "$bin" proxy \
  --listen "127.0.0.1:${port_of[grpc_proxy]}" --admin "127.0.0.1:$grpc_admin_port" \
  --policy "$tmp/grpc.lua" --static "$tmp/grpc.json" --log-level warn

h2load_extra=(-d "$tmp/grpc.req" -H 'content-type: application/grpc' -H 'te: trailers')
path=/echo.Echo/Unary
grpc=(grpc_direct grpc_proxy)
for n in "${grpc[@]}"; do run "$n" 1 >/dev/null; done # warm-up
for f in proxy_direct rps rps_direct; do : >"$tmp/g.$f"; done
for r in $(seq "$rounds"); do
  declare -A rps_of=() cpu_of=()
  for i in 0 1; do
    n=${grpc[$(((i + r) % 2))]}
    read -r rps_of[$n] cpu_of[$n] < <(run "$n" "$duration")
    log "grpc round $r: $n ${rps_of[$n]} req/s"
  done
  awk -v a="${rps_of[grpc_proxy]}" -v b="${rps_of[grpc_direct]}" \
    'BEGIN { printf "%.4f\n", a / b }' >>"$tmp/g.proxy_direct"
  echo "${rps_of[grpc_proxy]}" >>"$tmp/g.rps"
  echo "${rps_of[grpc_direct]}" >>"$tmp/g.rps_direct"
done
read -r m _ _ < <(med_min_max <"$tmp/g.rps")
echo "proxy_grpc_unary_rps $m req/s"
read -r m lo hi < <(med_min_max <"$tmp/g.proxy_direct")
echo "proxy_grpc_unary_vs_direct $m (min $lo, max $hi)"
read -r m _ _ < <(med_min_max <"$tmp/g.rps_direct")
echo "direct_grpc_unary_rps $m req/s"
