#!/bin/sh
# The policy author's loop on loopback, end to end, with the real binaries:
# check -> test -> record traffic -> replay an edit -> push it through the
# control plane -> see every proxy's verdict. See README.md beside it.
#
#   examples/workflow/run.sh [OPENMESH]     (default: build/bin/openmesh)
#
# Needs python3 (the upstreams) and curl. Exit 0 when every step behaved
# as README.md says, 1 otherwise.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
om=${1:-$here/../../build/bin/openmesh}
work=$(mktemp -d)
pids=""
cleanup() {
  for p in $pids; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

say() { printf '\n== %s\n' "$*"; }
fail() { echo "run.sh: $*" >&2; exit 1; }

# wait_for FILE PATTERN: up to 10 s for a line matching PATTERN (grep -E)
wait_for() {
  i=0
  until grep -Eq "$2" "$1" 2>/dev/null; do
    i=$((i + 1))
    [ $i -le 100 ] || fail "no '$2' in $1: $(cat "$1")"
    sleep 0.1
  done
}

say "1. check: the validator runs every example"
"$om" check "$here/checkout.lua" "$here/checkout_v2.lua"

say "2. test: the author's spec, in the embedded runtime"
"$om" test "$here"

say "3. a control plane, two stable peers and a canary peer"
"$om" control --listen 127.0.0.1:0 > "$work/control.log" 2>&1 &
pids="$pids $!"
wait_for "$work/control.log" '"event":"control_listening"'
control=$(sed -n 's/.*"event":"control_listening","url":"\(http:[^"]*\)".*/\1/p' "$work/control.log" | head -1)
for name in v1-a v1-b v2-a; do
  mkdir -p "$work/$name" && echo "$name" > "$work/$name/index.html"
  (cd "$work/$name" && exec python3 -u -m http.server 0 --bind 127.0.0.1) > "$work/$name.log" 2>&1 &
  pids="$pids $!"
  wait_for "$work/$name.log" 'port [0-9]+'
  port=$(sed -n 's/.*port \([0-9]*\).*/\1/p' "$work/$name.log" | head -1)
  version=v1; [ "$name" = v2-a ] && version=v2
  curl -sf -X PUT "$control/v1/services/checkout/instances/$name" \
    -d "{\"url\":\"http://127.0.0.1:$port\",\"ttl_ms\":600000,\"metadata\":{\"version\":\"$version\"}}" > /dev/null
done
curl -sf "$control/v1/services/checkout" > "$work/peers.json"

say "4. push checkout.lua; a proxy takes it from the plane and logs each request"
curl -sf -X PUT -H 'Content-Type: text/x-lua' --data-binary "@$here/checkout.lua" \
  "$control/v1/config/checkout" > /dev/null
"$om" proxy --listen 127.0.0.1:0 --admin 127.0.0.1:0 --control "$control" \
  --service checkout --policy control:checkout --id proxy-1 \
  --access-log "$work/access.log" > "$work/proxy.log" 2>&1 &
pids="$pids $!"
wait_for "$work/proxy.log" '"event":"proxy_listening"'
proxy=$(sed -n 's/.*"event":"proxy_listening","url":"\(http:[^"]*\)".*/\1/p' "$work/proxy.log" | head -1)
i=0
until [ "$(curl -s -o /dev/null -w '%{http_code}' -H 'Host: checkout' "$proxy/")" = 200 ]; do
  i=$((i + 1)); [ $i -le 100 ] || fail "the proxy never served checkout: $(cat "$work/proxy.log")"
  sleep 0.1
done
n=1
while [ $n -le 300 ]; do
  if [ $((n % 10)) = 0 ]; then # every tenth a payment
    curl -s -o /dev/null -X POST -d '{}' -H 'Host: checkout' -H "x-user: u-$n" "$proxy/payments/$n"
  else
    curl -s -o /dev/null -H 'Host: checkout' -H "x-user: u-$n" "$proxy/"
  fi
  n=$((n + 1))
done
wait_for "$work/access.log" '"x-user":"u-300"'
echo "$(wc -l < "$work/access.log") requests logged"

say "5. replay the 30% edit over the recorded traffic"
"$om" replay --log "$work/access.log" --policy "$here/checkout_v2.lua" \
  --peers "$work/peers.json" || fail "the 30% edit fails requests"

say "5b. replay a deadline edit against the policy in force: decisions move"
sed 's/deadline_ms = 2000, retries = 0/deadline_ms = 1000, retries = 0/g' "$here/checkout.lua" > "$work/checkout_fast.lua"
"$om" replay --log "$work/access.log" --policy "$work/checkout_fast.lua" \
  --against "$here/checkout.lua" --peers "$work/peers.json" | tee "$work/decisions.txt"
grep -q "30 requests would get another decision" "$work/decisions.txt" ||
  fail "replay did not report the 30 payments' new deadline"

say "6. replay a bad edit: it would fail requests, and replay exits 1"
if "$om" replay --log "$work/access.log" --policy "$here/checkout_broken.lua" \
  --peers "$work/peers.json"; then
  fail "replay passed an edit that fails requests"
fi

say "7. ship the 30% edit and read every proxy's verdict"
rev=$(curl -sf -X PUT -H 'Content-Type: text/x-lua' --data-binary "@$here/checkout_v2.lua" \
  "$control/v1/config/checkout" | sed -n 's/.*"revision":\([0-9]*\).*/\1/p')
i=0
until curl -sf "$control/v1/config/checkout/status" | grep -Eq "\"applied\": ?$rev[,}]"; do
  i=$((i + 1)); [ $i -le 100 ] || fail "proxy-1 never applied revision $rev: $(curl -s "$control/v1/config/checkout/status")"
  sleep 0.1
done
curl -sf "$control/v1/config/checkout/status"
echo
say "done: revision $rev runs on every proxy"
