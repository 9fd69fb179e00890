#!/usr/bin/env bash
# bench/tls_bench.sh OPENMESH_BIN: TLS to upstreams (docs/BENCHMARKS.md "TLS
# to upstreams"). `make bench` runs it after the data-plane benchmark.
#
# One upstream, nginx serving `return 200 "ok"` over TLS (the throwaway
# certificates of tests/fixtures/tls_certs.sh), and two proxies in front of
# it, each taking plain HTTP from the same client (wrk -t1 -c50 on
# loopback) and speaking TLS to the upstream over a keep-alive pool:
#   proxy    `openmesh proxy --static` with one https://127.0.0.1 peer,
#            --upstream-ca the test CA (verified: name and chain);
#   nginx    proxy_pass https:// to an upstream block with keepalive 32
#            (the proxy's default idle pool per peer: with 50 connections
#            from wrk both close and reopen some, resuming sessions),
#            proxy_ssl_session_reuse on, proxy_ssl_verify on against the
#            same CA;
#   nginx_b  a second nginx with nginx's config: the run's A/A control,
#            whose ratio to nginx is the resolution of this run.
# Each contender is one process with one thread (nginx one worker), as the
# proxy has one loop. Rounds interleave the contenders (the order rotates);
# every figure is the median over rounds of the per-round value:
#   proxy_vs_nginx_tls   proxy req/s / nginx req/s (bar >= 1.0)
#   tls_aa_nginx_b       nginx_b req/s / nginx req/s (the noise)
#   tls_proxy_rps, tls_nginx_rps
#   tls_resumed_share    of the proxy's upstream handshakes, the share
#                        that resumed a session
#
# Prints `name value unit` lines; each run's details go to stderr. Exits
# non-zero when a contender fails to start or answers anything but 2xx.
# Loopback only, ports OM_BENCH_TLS_PORT_BASE..+4 (default 19540), a temp dir
# for certificates, configs and logs; the EXIT trap stops everything it
# started (by pid) and removes the temp dir. About 2 minutes.
#
# Environment: OM_BENCH_DURATION seconds per run (default 8),
# OM_BENCH_ROUNDS (3), OM_BENCH_CONNECTIONS (50), OM_BENCH_TLS_PORT_BASE.
set -euo pipefail

bin=${1:-}
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
  echo "usage: bash bench/tls_bench.sh PATH/TO/openmesh" >&2
  exit 2
fi
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

duration=${OM_BENCH_DURATION:-8}
rounds=${OM_BENCH_ROUNDS:-3}
conns=${OM_BENCH_CONNECTIONS:-50}
base=${OM_BENCH_TLS_PORT_BASE:-19540}

up=$base
proxy_port=$((base + 1))
admin_port=$((base + 2))
nginx_port=$((base + 3))
nginx_b_port=$((base + 4))

log() { echo "tls_bench: $*" >&2; }

# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
om_bench_need wrk nginx openssl
om_bench_tmp tls-bench

om_bench_ports_free OM_BENCH_TLS_PORT_BASE $up $proxy_port $admin_port $nginx_port $nginx_b_port

bash "$here/../tests/fixtures/tls_certs.sh" "$tmp/certs"
certs=$tmp/certs

nginx_head() { # NAME
  cat <<EOF
worker_processes 1;
pid $tmp/$1.pid;
error_log $tmp/$1.log warn;
events { worker_connections 4096; }
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
    listen 127.0.0.1:$up ssl;
    ssl_certificate $certs/server.pem;
    ssl_certificate_key $certs/server.key;
    ssl_session_cache shared:up:1m;
    location / { return 200 "ok"; }
  }
}
EOF
} >"$tmp/upstream.conf"

nginx_conf() { # NAME PORT
  nginx_head "$1"
  cat <<EOF
  upstream bench {
    server 127.0.0.1:$up;
    keepalive 32;
    keepalive_requests 1000000000;
    keepalive_timeout 300s;
  }
  server {
    listen 127.0.0.1:$2;
    location / {
      proxy_pass https://bench;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_ssl_session_reuse on;
      proxy_ssl_verify on;
      proxy_ssl_trusted_certificate $certs/ca.pem;
      proxy_ssl_name localhost;
      proxy_ssl_server_name on;
    }
  }
}
EOF
}
nginx_conf nginx "$nginx_port" >"$tmp/nginx.conf"
nginx_conf nginx_b "$nginx_b_port" >"$tmp/nginx_b.conf"

cat >"$tmp/static.json" <<EOF
{"services": {"bench": {"revision": 1, "instances": [
  {"id": "up", "url": "https://127.0.0.1:$up"}]}}}
EOF
cat >"$tmp/policy.lua" <<'EOF'
return { kind = "traffic", subset = function(_, peers) return peers end }
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

start upstream "$up" nginx -p "$tmp" -e "$tmp/upstream.log" \
  -c "$tmp/upstream.conf" -g "daemon off;"
start proxy "$proxy_port" "$bin" proxy --listen "127.0.0.1:$proxy_port" \
  --admin "127.0.0.1:$admin_port" --policy "$tmp/policy.lua" \
  --static "$tmp/static.json" --upstream-ca "$certs/ca.pem" --log-level warn
start nginx "$nginx_port" nginx -p "$tmp" -e "$tmp/nginx.log" \
  -c "$tmp/nginx.conf" -g "daemon off;"
start nginx_b "$nginx_b_port" nginx -p "$tmp" -e "$tmp/nginx_b.log" \
  -c "$tmp/nginx_b.conf" -g "daemon off;"

declare -A port_of=([proxy]=$proxy_port [nginx]=$nginx_port
  [nginx_b]=$nginx_b_port)

for name in proxy nginx nginx_b; do
  if ! curl -sS -D "$tmp/head" -o "$tmp/body" -H "Host: bench" \
    "http://127.0.0.1:${port_of[$name]}/" ||
    ! head -1 "$tmp/head" | grep -q " 200" ||
    [ "$(cat "$tmp/body")" != "ok" ]; then
    log "$name does not answer 200 ok over TLS:"
    cat "$tmp/head" "$tmp/body" "$tmp/$name.out" "$tmp/$name.log" >&2 || true
    exit 1
  fi
done

run() { # NAME SECONDS: sets rps
  local name=$1 secs=$2 out="$tmp/wrk.out" non2xx
  wrk -t1 -c"$conns" -d"${secs}s" -H "Host: bench" \
    "http://127.0.0.1:${port_of[$name]}/" >"$out" 2>&1 || {
    log "wrk against $name failed:"
    cat "$out" >&2
    exit 1
  }
  non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $NF}' "$out")
  if [ -n "$non2xx" ]; then
    log "$name answered $non2xx non-2xx responses:"
    cat "$out" >&2
    exit 1
  fi
  rps=$(awk '/^Requests\/sec:/ {print $2}' "$out")
  log "$(printf '%-8s c=%-3s %10s req/s' "$name" "$conns" "$rps")"
}

median() {
  printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END {
    if (NR == 0) { print "nan"; exit }
    if (NR % 2) printf "%.4f", v[(NR + 1) / 2];
    else printf "%.4f", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.4f", a / b }'; }

# warm-up: pools filled, sessions cached, caches hot
for name in proxy nginx nginx_b; do run "$name" 1; done

orders=("proxy nginx nginx_b" "nginx nginx_b proxy" "nginx_b proxy nginx")
r_px=() r_aa=() px=() ng=()
for ((i = 0; i < rounds; i++)); do
  declare -A got=()
  for name in ${orders[$((i % 3))]}; do
    run "$name" "$duration"
    got[$name]=$rps
  done
  px+=("${got[proxy]}")
  ng+=("${got[nginx]}")
  r_px+=("$(ratio "${got[proxy]}" "${got[nginx]}")")
  r_aa+=("$(ratio "${got[nginx_b]}" "${got[nginx]}")")
  log "round $((i + 1)): proxy/nginx ${r_px[-1]}, nginx_b/nginx ${r_aa[-1]}"
done

metric() { # RESULT
  curl -sS "http://127.0.0.1:$admin_port/metrics" |
    awk -v r="$1" '$1 == "openmesh_proxy_tls_handshakes_total{service=\"bench\",result=\"" r "\"}" { print $2 }'
}
ok=$(metric ok)
resumed=$(metric resumed)
share=$(awk -v o="${ok:-0}" -v r="${resumed:-0}" \
  'BEGIN { t = o + r; printf "%.4f", (t > 0 ? r / t : 0) }')
log "proxy upstream handshakes: ${ok:-0} full, ${resumed:-0} resumed"

printf '%s %s %s\n' proxy_vs_nginx_tls "$(median "${r_px[@]}")" ratio
printf '%s %s %s\n' tls_aa_nginx_b "$(median "${r_aa[@]}")" ratio
printf '%s %s %s\n' tls_proxy_rps "$(median "${px[@]}")" req/s
printf '%s %s %s\n' tls_nginx_rps "$(median "${ng[@]}")" req/s
printf '%s %s %s\n' tls_resumed_share "$share" ratio
