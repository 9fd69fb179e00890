#!/usr/bin/env bash
# bench/stream_bench.sh OPENMESH_BIN: big transfers through the proxy, each
# against the same transfer done direct (docs/BENCHMARKS.md "Streams").
# `make bench` runs it after proxy_bench.sh (WebSocket round trips are
# bench/ws_echo_bench.py's).
#
# One nginx upstream on loopback serves a 1 GiB file (a sparse file in the
# temp dir: the page cache serves zeros, so the disk is not measured), and
# bench/upload_sink (built beside the benches) takes uploads: it reads the
# whole body before it answers, where nginx's `return 200` answers at once
# and lets curl stop sending. `openmesh proxy --static` sits in front of
# both with the default traffic policy (policies/traffic.lua), which bounds
# the wait for the head, not the length of a stream. curl moves the bytes:
#   download  curl -o /dev/null, the 1 GiB file, direct then proxied;
#   upload    curl -T from the same file (Content-Length 1 GiB), direct
#             then proxied, so the proxy streams the request body.
# nginx proxy_pass (one worker, proxy_buffering and proxy_request_buffering
# off, keep-alive upstreams) moves the same bytes as the reference proxy: on
# loopback a proxy's copies (read from one socket, write to the other) cost
# as much as the transfer itself, so its ratio says what any copying proxy
# gets here; openmesh splices bodies this large (docs/PROXY.md "Large
# bodies").
# The order of direct, proxy and nginx rotates per round; each figure is the median over its rounds, and each ratio the
# median of per-round ratios, runs next to each other. The proxy's peak RSS
# (VmHWM) over the whole run is printed too: the streamed paths hold a fixed
# buffer per request, not the transfer.
#
# Prints `name value unit` lines as the other benches do; details to stderr.
# Loopback only, ports OM_BENCH_STREAM_PORT (default 19500) ..+4; a temp
# dir for every file; the EXIT trap stops what it started. About a minute.
#
# Environment: OM_BENCH_STREAM_ROUNDS (5), OM_BENCH_STREAM_BYTES (1 GiB),
# OM_BENCH_STREAM_PORT (19500).
set -euo pipefail

bin=${1:-}
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
  echo "usage: bash bench/stream_bench.sh PATH/TO/openmesh" >&2
  exit 2
fi
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
rounds=${OM_BENCH_STREAM_ROUNDS:-5}
bytes=${OM_BENCH_STREAM_BYTES:-1073741824}
base=${OM_BENCH_STREAM_PORT:-19500}
up_port=$base
proxy_port=$((base + 1))
admin_port=$((base + 2))
sink_port=$((base + 3))
nginx_port=$((base + 4))
sink_bin=$(dirname "$bin")/../bench/upload_sink

log() { echo "stream_bench: $*" >&2; }

# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
om_bench_need nginx curl
om_bench_tmp stream-bench
if [ ! -x "$sink_bin" ]; then
  log "$sink_bin not found (build the bench targets)"
  exit 2
fi
om_bench_ports_free OM_BENCH_STREAM_PORT $up_port $proxy_port $admin_port $sink_port $nginx_port

chmod 755 "$tmp" # nginx workers run as an unprivileged user
truncate -s "$bytes" "$tmp/big"
cat "$tmp/big" >/dev/null # into the page cache once, before any round

cat >"$tmp/nginx.conf" <<EOF
worker_processes 1;
pid $tmp/nginx.pid;
error_log $tmp/nginx.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  sendfile on;
  client_max_body_size 0;
  $(om_nginx_temp_paths "$tmp/")
  server {
    listen 127.0.0.1:$up_port;
    root $tmp;
  }
}
EOF
nginx -c "$tmp/nginx.conf" -g 'daemon off;' >"$tmp/nginx.out" 2>&1 &
pids+=($!)
wait_port "$up_port" $! nginx
"$sink_bin" "$sink_port" >"$tmp/sink.out" 2>&1 &
pids+=($!)
wait_port "$sink_port" $! sink

# the reference proxy: nginx proxy_pass streaming both ways (no response
# buffering to temp files, no request buffering), one worker
cat >"$tmp/nginx_proxy.conf" <<EOF
worker_processes 1;
pid $tmp/nginx_proxy.pid;
error_log $tmp/nginx_proxy.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  client_max_body_size 0;
  $(om_nginx_temp_paths "$tmp/p-")
  upstream files { server 127.0.0.1:$up_port; keepalive 8; }
  upstream sink { server 127.0.0.1:$sink_port; keepalive 8; }
  server {
    listen 127.0.0.1:$nginx_port;
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_buffering off;
    proxy_request_buffering off;
    location / { proxy_pass http://\$http_host; }
  }
}
EOF
nginx -c "$tmp/nginx_proxy.conf" -g 'daemon off;' >"$tmp/nginx_proxy.out" 2>&1 &
pids+=($!)
wait_port "$nginx_port" $! nginx_proxy

cat >"$tmp/static.json" <<EOF
{"services": {
  "files": {"revision": 1, "instances": [
    {"id": "nginx", "url": "http://127.0.0.1:$up_port"}]},
  "sink": {"revision": 1, "instances": [
    {"id": "sink", "url": "http://127.0.0.1:$sink_port"}]}}}
EOF
"$bin" proxy --static "$tmp/static.json" --listen "127.0.0.1:$proxy_port" \
  --admin "127.0.0.1:$admin_port" --log-level warn >"$tmp/proxy.out" 2>&1 &
proxy_pid=$!
pids+=($proxy_pid)
wait_port "$proxy_port" $proxy_pid proxy

# curl_rate DIRECTION URL HOST: bytes per second curl measured, or fail
curl_rate() {
  local out code rate
  if [ "$1" = down ]; then
    out=$(curl -sS -o /dev/null -H "Host: $3" \
      -w '%{http_code} %{speed_download} %{size_download}' "$2")
  else
    out=$(curl -sS -o /dev/null -H "Host: $3" -T "$tmp/big" \
      -w '%{http_code} %{speed_upload} %{size_upload}' "$2")
  fi
  read -r code rate size <<<"$out"
  if [ "$code" != 200 ] || [ "$size" != "$bytes" ]; then
    log "$1 $2: status $code, $size of $bytes bytes"
    exit 1
  fi
  echo "$rate"
}

median() { sort -g | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }

proxy_url=http://127.0.0.1:$proxy_port
nginx_url=http://127.0.0.1:$nginx_port
for dir in down up; do
  path=/big direct=http://127.0.0.1:$up_port service=files
  if [ "$dir" = up ]; then
    path=/upload direct=http://127.0.0.1:$sink_port service=sink
  fi
  for who in direct proxy nginx ratio nginx_ratio; do : >"$tmp/$dir.$who"; done
  for r in $(seq "$rounds"); do
    # the order rotates: direct proxy nginx, proxy nginx direct, ...
    order=(direct proxy nginx)
    for _ in $(seq $(((r - 1) % 3))); do order=("${order[@]:1}" "${order[0]}"); done
    for who in "${order[@]}"; do
      case $who in
      direct) d=$(curl_rate "$dir" "$direct$path" "$service") ;;
      proxy) x=$(curl_rate "$dir" "$proxy_url$path" "$service") ;;
      nginx) g=$(curl_rate "$dir" "$nginx_url$path" "$service") ;;
      esac
    done
    log "$dir round $r (${order[*]}): direct $d B/s, proxy $x B/s, nginx $g B/s"
    echo "$d" >>"$tmp/$dir.direct"
    echo "$x" >>"$tmp/$dir.proxy"
    echo "$g" >>"$tmp/$dir.nginx"
    awk -v a="$x" -v b="$d" 'BEGIN {print a / b}' >>"$tmp/$dir.ratio"
    awk -v a="$g" -v b="$d" 'BEGIN {print a / b}' >>"$tmp/$dir.nginx_ratio"
  done
done

mbps() { median <"$1" | awk '{printf "%.0f", $1 / 1048576}'; }
ratio() { median <"$1" | awk '{printf "%.2f", $1}'; }
for dir in down up; do
  name=download
  [ "$dir" = up ] && name=upload
  echo "direct_${name}_MBps $(mbps "$tmp/$dir.direct") MB/s"
  echo "proxy_${name}_MBps $(mbps "$tmp/$dir.proxy") MB/s"
  echo "nginx_${name}_MBps $(mbps "$tmp/$dir.nginx") MB/s"
  echo "proxy_${name}_ratio $(ratio "$tmp/$dir.ratio") x"
  echo "nginx_${name}_ratio $(ratio "$tmp/$dir.nginx_ratio") x"
done

hwm=$(awk '/^VmHWM/ {print int($2 / 1024)}' "/proc/$proxy_pid/status")
echo "proxy_stream_peak_rss_MB $hwm MB"
