#!/bin/sh
# examples/ha/run.sh: two control planes on one Redis, a proxy and a
# registrant that both know the two planes; then plane A is killed and the
# lease and the routing carry on through plane B. Loopback only; everything
# it starts is stopped on exit. See README.md.
#
#   OPENMESH=build/bin/openmesh examples/ha/run.sh        # from the repo root
#   examples/ha/run.sh --keep                             # stay up after the tour
#   examples/ha/run.sh --tls                              # HTTPS planes, private CA
set -eu

OPENMESH=${OPENMESH:-openmesh}
HERE=$(cd "$(dirname "$0")" && pwd)
REDIS_PORT=${REDIS_PORT:-6390}
PROXY=http://127.0.0.1:7620
ADMIN=http://127.0.0.1:7621
SERVICE_PORT=9301
KEEP=0
TLS=0
for arg in "$@"; do
  case $arg in
  --keep) KEEP=1 ;;
  --tls) TLS=1 ;;
  *)
    echo "usage: run.sh [--keep] [--tls]" >&2
    exit 2
    ;;
  esac
done

DIR=$(mktemp -d /tmp/openmesh-ha.XXXXXX)
PIDS=""
cleanup() {
  for p in $PIDS; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$DIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start() { # name, command...
  name=$1
  shift
  "$@" >"$DIR/$name.log" 2>&1 &
  PIDS="$PIDS $!"
  eval "PID_$name=$!"
}

wait_for() { # what, command...
  what=$1
  shift
  i=0
  until "$@" >/dev/null 2>&1; do
    i=$((i + 1))
    if [ $i -gt 300 ]; then
      echo "run.sh: $what did not come up; logs in $DIR" >&2
      cat "$DIR"/*.log >&2
      exit 1
    fi
    sleep 0.1
  done
}

# --tls: the planes serve HTTPS with a throwaway CA's certificate; the
# clients trust that CA (--control-ca), curl too
SCHEME=http PLANE_TLS="" CLIENT_TLS="" CURL_TLS=""
if [ $TLS -eq 1 ]; then
  "$HERE/../../tests/fixtures/tls_certs.sh" "$DIR/certs"
  SCHEME=https
  PLANE_TLS="--tls-cert $DIR/certs/server.pem --tls-key $DIR/certs/server.key"
  CLIENT_TLS="--control-ca $DIR/certs/ca.pem"
  CURL_TLS="--cacert $DIR/certs/ca.pem"
fi
A=$SCHEME://127.0.0.1:7610
B=$SCHEME://127.0.0.1:7611

command -v redis-server >/dev/null || { echo "run.sh: needs redis-server" >&2; exit 1; }
command -v python3 >/dev/null || { echo "run.sh: needs python3" >&2; exit 1; }

# 1. one Redis, two control planes on it
start redis redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' \
  --appendonly no --dir "$DIR"
wait_for redis redis-cli -p "$REDIS_PORT" ping
STORE=redis://127.0.0.1:$REDIS_PORT/0
# shellcheck disable=SC2086 # the *_TLS lists split on purpose
start plane_a "$OPENMESH" control --listen 127.0.0.1:7610 --store "$STORE" $PLANE_TLS
# shellcheck disable=SC2086
start plane_b "$OPENMESH" control --listen 127.0.0.1:7611 --store "$STORE" $PLANE_TLS
# shellcheck disable=SC2086
wait_for "plane A" curl -sf $CURL_TLS "$A/healthz"
# shellcheck disable=SC2086
wait_for "plane B" curl -sf $CURL_TLS "$B/healthz"

# 2. a service kept registered through either plane (a 2 s lease)
# shellcheck disable=SC2086
start web "$OPENMESH" register --control "$A,$B" $CLIENT_TLS --service web --id web-1 \
  --url "http://127.0.0.1:$SERVICE_PORT" --ttl 2s --drain 0 -- \
  python3 "$HERE/hello.py" "$SERVICE_PORT" web-1

wait_for "web-1" curl -sf "http://127.0.0.1:$SERVICE_PORT/"

# 3. a proxy watching web on either plane
# shellcheck disable=SC2086
start proxy "$OPENMESH" proxy --control "$A" --control "$B" $CLIENT_TLS --service web \
  --listen 127.0.0.1:7620 --admin 127.0.0.1:7621
wait_for "the route to web" curl -sf -H 'Host: web' "$PROXY/"

watch_of() { # the proxy's view of web's watch
  curl -s "$ADMIN/status" | python3 -c \
    'import json,sys; w=json.load(sys.stdin)["watches"]["web"]; print("watch on", w["control"], "revision", w["revision"], "failovers", w["failovers"])'
}
instances() { # what plane B serves
  # shellcheck disable=SC2086
  curl -s $CURL_TLS "$B/v1/services/web" | python3 -c \
    'import json,sys; print("plane B has", [i["id"] for i in json.load(sys.stdin)["instances"]])'
}

echo "== both planes up"
watch_of
instances
echo "== kill -9 plane A"
kill -9 "$PID_plane_a"
sleep 3 # longer than the 2 s lease
watch_of
instances
printf '== a call through the proxy: %s\n' "$(curl -s -H 'Host: web' "$PROXY/")"
echo "== what the clients logged about it"
grep -h '"event":"control_failover"' "$DIR/web.log" | head -1
grep -h '"event":"watch_failover"' "$DIR/proxy.log" | head -1

if [ $KEEP -eq 1 ]; then
  echo "== still running (Ctrl-C stops everything); logs in $DIR"
  wait
fi
