-- control_watch_spec.lua: watch coalescing (?min_interval_ms and the
-- plane's --watch-min-interval-ms floor) and liveness under a connection
-- flood, against the real `openmesh control` binary on loopback.
--
-- The clients are python3 scripts (written to the spec's temp dir): raw
-- sockets reading SSE streams and timing every event, a keep-alive
-- http.client sending the changes, and a flood of idle TCP connections.
-- Each script runs under timeout(1) and prints one JSON line of figures,
-- which the spec checks (every assertion names both values).
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../support/?.lua;" .. package.path

local H = require "control_helper"

-- Readers and writer. argv: port service n_changes spread_s query readers
--                            [path]
-- Opens `readers` SSE streams on /v1/watch/services/SERVICE?QUERY (or
-- PATH), waits for each one's first event, then sends n_changes PUTs of
-- instance `i` (a changing metadata value) spread evenly over spread_s
-- seconds, and waits (5 s at most) until every reader holds the last
-- revision. Prints per reader: events after the first, the last id, the
-- smallest gap between two events after the first (ms).
local COALESCE_PY = [=[
import http.client, json, selectors, socket, sys, time
port, svc, n, spread, query, nread = (int(sys.argv[1]), sys.argv[2],
    int(sys.argv[3]), float(sys.argv[4]), sys.argv[5], int(sys.argv[6]))
path = sys.argv[7] if len(sys.argv) > 7 else "/v1/watch/services/" + svc
if query:
    path += "?" + query
sel = selectors.DefaultSelector()
rd = []
for k in range(nread):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(("GET %s HTTP/1.1\r\nHost: t\r\n\r\n" % path).encode())
    s.setblocking(False)
    r = {"s": s, "buf": b"", "ids": [], "times": []}
    rd.append(r)
    sel.register(s, selectors.EVENT_READ, r)

def pump(t):
    for key, _ in sel.select(t):
        r = key.data
        try:
            b = r["s"].recv(1 << 20)
        except BlockingIOError:
            continue
        if not b:
            sel.unregister(r["s"])
            r["eof"] = True
            continue
        r["buf"] += b
        while True:
            i = r["buf"].find(b"\nid: ")
            if i < 0:
                break
            j = r["buf"].find(b"\n", i + 5)
            if j < 0:
                break
            r["ids"].append(int(r["buf"][i + 5:j]))
            r["times"].append(time.monotonic())
            r["buf"] = r["buf"][j:]
        if len(r["buf"]) > 4096:
            r["buf"] = r["buf"][-4096:]

deadline = time.monotonic() + 5
while any(not r["ids"] for r in rd) and time.monotonic() < deadline:
    pump(0.05)
if any(not r["ids"] for r in rd):
    print(json.dumps({"error": "no first event"}))
    sys.exit(1)
for r in rd:
    r["first"] = len(r["ids"])
c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
t0 = time.monotonic()
last = 0
for i in range(n):
    body = json.dumps({"url": "http://10.0.0.1:80", "ttl_ms": 60000,
                       "metadata": {"n": str(i)}})
    c.request("PUT", "/v1/services/%s/instances/i" % svc, body)
    a = json.loads(c.getresponse().read())
    last = a["revision"]
    due = t0 + spread * (i + 1) / n
    while time.monotonic() < due:
        pump(max(0, due - time.monotonic()))
    pump(0)
t_end = time.monotonic()
deadline = t_end + 5
while any(r["ids"][-1] < last for r in rd) and time.monotonic() < deadline:
    pump(0.02)
out = {"last": last, "send_s": t_end - t0, "readers": []}
for r in rd:
    ts = r["times"][r["first"] - 1:]
    gaps = [(b - a) * 1000 for a, b in zip(ts, ts[1:])]
    out["readers"].append({"events": len(r["ids"]) - r["first"],
                           "last_id": r["ids"][-1],
                           "min_gap_ms": min(gaps) if gaps else None,
                           "eof": r.get("eof", False)})
print(json.dumps(out))
]=]

-- A flood of idle connections, then /healthz probes. argv: port n_flood
-- n_probes. Opens n_flood TCP connections that never send a byte, then
-- one GET /v1/services and one GET /metrics while flooded, then every
-- 100 ms one probe (a new connection, GET /healthz or /readyz, 1 s
-- timeout). Prints how many
-- flood connections were accepted, each probe's status and time, and the
-- answer to the ordinary request.
local FLOOD_PY = [=[
import json, os, resource, socket, sys, time
port, n, probes, pid = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if soft < n + 100:
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 200), hard))

def plane_fds():
    return len(os.listdir("/proc/%d/fd" % pid))

def ask(path, timeout):
    t = time.monotonic()
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        s.sendall(("GET %s HTTP/1.1\r\nHost: t\r\n\r\n" % path).encode())
        data = b""
        while b"\r\n\r\n" not in data:
            b = s.recv(4096)
            if not b:
                break
            data += b
        s.close()
        status = int(data.split(b" ")[1]) if data.startswith(b"HTTP/1.1 ") else 0
    except Exception as e:
        status = str(e)
    return status, (time.monotonic() - t) * 1000

# The flood goes in batches smaller than the listen backlog, each one
# taken in by the plane (its descriptor count says so) before the next:
# a connect dropped from a full backlog would retry its SYN seconds later
# and leave an ordinary slot free for the probes that follow.
flood = []
base = plane_fds()
t0 = time.monotonic()
while len(flood) < n:
    for i in range(min(256, n - len(flood))):
        try:
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            flood.append(s)
        except OSError as e:
            print(json.dumps({"error": "flood: %s after %d" % (e, len(flood))}))
            sys.exit(1)
    while plane_fds() < base + len(flood):
        if time.monotonic() - t0 > 20:
            print(json.dumps({"error": "plane took %d of %d" % (plane_fds() - base, len(flood))}))
            sys.exit(1)
        time.sleep(0.005)
flood_s = time.monotonic() - t0
out = {"flood": len(flood), "flood_s": flood_s, "probes": []}
# the ordinary requests first: the flood's oldest connections are cut by
# the header timeout (10 s after their accept), and a slow machine would
# otherwise free slots before these are asked
out["other"] = ask("/v1/services", 1.0)[0]
st, _ = ask("/metrics", 1.0)
out["metrics_status"] = st
for i in range(probes):
    path = "/healthz" if i % 2 == 0 else "/readyz"
    st, ms = ask(path, 1.0)
    out["probes"].append({"path": path, "status": st, "ms": ms})
    time.sleep(0.1)
for s in flood:
    s.close()
print(json.dumps(out))
]=]

describe("openmesh control watches and health, the real binary", function()
  if not H.bin or H.bin == "" then
    it("runs against OPENMESH_BIN", function()
      pending("OPENMESH_BIN is not set (make check sets it to build/bin/openmesh)")
    end)
    return
  end

  local dir
  setup(function()
    dir = H.tmpdir()
    H.writefile(dir .. "/coalesce.py", COALESCE_PY)
    H.writefile(dir .. "/flood.py", FLOOD_PY)
  end)
  teardown(function()
    H.kill_all()
    if dir then
      os.execute("rm -rf " .. H.q(dir))
    end
  end)

  -- Run coalesce.py; its decoded figures.
  local function coalesce(port, svc, n, spread, query, readers, path)
    local out, rc = H.sh(string.format("timeout -k 1 30 python3 %s %d %s %d %s %s %d %s 2>&1",
      H.q(dir .. "/coalesce.py"), port, svc, n, spread, H.q(query or ""), readers or 1,
      path and H.q(path) or ""))
    assert(rc == 0, "coalesce.py exited " .. tostring(rc) .. ": " .. out)
    return H.json(out)
  end

  local function register(c, svc, id)
    return H.register(dir, c.url, svc, id, { url = "http://10.0.0.9:80", ttl_ms = 60000 })
  end

  it("sends a watcher at most one snapshot per min_interval_ms, the last change always", function()
    finally(H.kill_all)
    local c = H.start_control(dir)
    register(c, "co", "i")
    local r = coalesce(c.port, "co", 100, 1.0, "min_interval_ms=200", 3)
    for k, w in ipairs(r.readers) do
      assert(w.events >= 3 and w.events <= 7,
        "reader " .. k .. ": " .. w.events .. " events for 100 changes in 1 s at 200 ms, want 3..7")
      assert(w.last_id == r.last,
        "reader " .. k .. ": last event id " .. H.rev(w.last_id) .. ", final revision " .. H.rev(r.last))
      assert(w.min_gap_ms >= 150,
        "reader " .. k .. ": two events " .. w.min_gap_ms .. " ms apart, interval 200 ms")
      assert.is_false(w.eof)
    end
    -- coalesced states are counted
    local _, body = H.request(dir, "GET", c.url .. "/metrics")
    local n = tonumber(body:match("openmesh_control_watch_events_coalesced_total (%d+)"))
    assert(n and n >= 3 * 80, "coalesced_total " .. tostring(n) .. ", want >= 240")
    -- without the parameter every change goes out (the reader keeps up)
    local d = coalesce(c.port, "co", 100, 1.0, "", 1)
    assert(d.readers[1].events >= 50,
      "no interval: " .. d.readers[1].events .. " events for 100 changes, want >= 50")
    assert.equal(H.rev(d.last), H.rev(d.readers[1].last_id))
    -- min_interval_ms=0 is the default, said out loud
    d = coalesce(c.port, "co", 40, 0.4, "min_interval_ms=0", 1)
    assert(d.readers[1].events >= 20,
      "min_interval_ms=0: " .. d.readers[1].events .. " events for 40 changes, want >= 20")
    assert.equal(0, H.stop(c))
  end)

  it("coalesces config and all-services watches, never losing a service's last change", function()
    finally(H.kill_all)
    local c = H.start_control(dir)
    register(c, "a1", "i")
    register(c, "a2", "i")
    -- the all-services stream: changes of "a2" interleaved by the writer
    -- with nothing else; its last revision must arrive
    local r = coalesce(c.port, "a2", 60, 0.6, "min_interval_ms=250", 2, "/v1/watch/services")
    for k, w in ipairs(r.readers) do
      -- the burst is two events (a1, a2); then about 0.6 s / 250 ms + 1
      assert(w.events <= 5, "all-services reader " .. k .. ": " .. w.events .. " events, want <= 5")
      assert(w.last_id == r.last,
        "all-services reader " .. k .. ": last id " .. H.rev(w.last_id) .. ", final " .. H.rev(r.last))
    end
    -- a config document
    local status = H.request(dir, "PUT", c.url .. "/v1/config/doc", { body = '{"n":0}' })
    assert.equal(200, status)
    local out, rc = H.sh(string.format([[timeout -k 1 20 python3 -c %s %d]], H.q([=[
import http.client, json, socket, sys, time
port = int(sys.argv[1])
s = socket.create_connection(("127.0.0.1", port))
s.sendall(b"GET /v1/watch/config/doc?min_interval_ms=300 HTTP/1.1\r\nHost: t\r\n\r\n")
s.settimeout(0.05)
buf = b""
def pump(until):
    global buf
    while time.monotonic() < until:
        try:
            b = s.recv(65536)
        except socket.timeout:
            continue
        if not b:
            break
        buf += b
pump(time.monotonic() + 0.3)
c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
last = 0
t0 = time.monotonic()
for i in range(1, 31):
    c.request("PUT", "/v1/config/doc", json.dumps({"n": i}))
    last = json.loads(c.getresponse().read())["revision"]
    pump(time.monotonic() + 0.02)
send_s = time.monotonic() - t0
pump(time.monotonic() + 0.8)
ids = [int(l[4:]) for l in buf.decode().split("\n") if l.startswith("id: ")]
print(json.dumps({"events": len(ids) - 1, "last_id": ids[-1], "last": last,
                  "send_s": send_s,
                  "tail": buf.decode()[-200:]}))
]=]), c.port))
    assert(rc == 0, "config watcher: " .. out)
    local cw = H.json(out)
    -- one per 300 ms window while the changes came, and the trailing one
    local most = math.floor(cw.send_s * 1000 / 300) + 2
    assert(cw.events >= 1 and cw.events <= most,
      "config watch: " .. cw.events .. " events for 30 changes in " .. cw.send_s
      .. " s at 300 ms, want 1.." .. most)
    assert(cw.last_id == cw.last, "config watch: last id " .. H.rev(cw.last_id) .. ", final " .. H.rev(cw.last))
    assert.matches('{"n": 30}', cw.tail, 1, true)
    assert.equal(0, H.stop(c))
  end)

  it("raises every watcher to --watch-min-interval-ms; a larger min_interval_ms wins", function()
    finally(H.kill_all)
    local c = H.start_control(dir, "--watch-min-interval-ms 300")
    register(c, "fl", "i")
    local r = coalesce(c.port, "fl", 50, 1.0, "min_interval_ms=0", 1)
    local w = r.readers[1]
    assert(w.events >= 2 and w.events <= 5,
      "floor 300 ms: " .. w.events .. " events for 50 changes in 1 s, want 2..5")
    assert(w.min_gap_ms >= 225, "floor 300 ms: two events " .. w.min_gap_ms .. " ms apart")
    assert.equal(H.rev(r.last), H.rev(w.last_id))
    r = coalesce(c.port, "fl", 50, 1.0, "min_interval_ms=600", 1)
    w = r.readers[1]
    assert(w.events >= 1 and w.events <= 3,
      "client 600 ms over floor 300: " .. w.events .. " events in 1 s, want 1..3")
    assert(w.min_gap_ms == nil or w.min_gap_ms >= 450,
      "client 600 ms: two events " .. tostring(w.min_gap_ms) .. " ms apart")
    assert.equal(H.rev(r.last), H.rev(w.last_id))
    assert.equal(0, H.stop(c))
  end)

  it("refuses a malformed min_interval_ms with 400 naming it, and a bad floor with exit 2", function()
    finally(H.kill_all)
    local c = H.start_control(dir)
    register(c, "bad", "i")
    for _, v in ipairs { "-1", "60001", "abc", "", "1e3", "1.5", "0x10", "+5",
      "99999999999999999999999", string.rep("9", 5000), "200&min_interval_ms=300" } do
      local status, body = H.request(dir, "GET",
        c.url .. "/v1/watch/services/bad?min_interval_ms=" .. v, { max_time = 2 })
      assert(status == 400, "min_interval_ms=" .. v:sub(1, 40) .. ": status " .. status .. ", want 400")
      local e = H.json(body)
      assert.same({ "invalid_field", "min_interval_ms" }, { e.error, e.field })
      assert.matches("[0, 60000]", e.message, 1, true)
    end
    for _, path in ipairs { "/v1/watch/services?min_interval_ms=x", "/v1/watch/config/d?min_interval_ms=-2" } do
      local status, body = H.request(dir, "GET", c.url .. path, { max_time = 2 })
      assert(status == 400, path .. ": status " .. status)
      assert.equal("min_interval_ms", H.json(body).field)
    end
    -- the bounds themselves are good
    for _, v in ipairs { "0", "60000" } do
      local status = H.request(dir, "GET", c.url .. "/v1/watch/services/bad?min_interval_ms=" .. v,
        { max_time = 1 })
      assert(status == 200, "min_interval_ms=" .. v .. ": status " .. status .. ", want 200 (cut by max-time)")
    end
    assert.equal(0, H.stop(c))
    local bin = "timeout 5 " .. H.q(H.bin)
    for _, v in ipairs { "-1", "60001", "x", "", "1.5", "100000000000", "10ms" } do
      local out, rc = H.sh(bin .. " control --listen 127.0.0.1:0 --watch-min-interval-ms " .. H.q(v) .. " 2>&1")
      assert(rc == 2, "--watch-min-interval-ms " .. v .. ": exit " .. tostring(rc) .. ", want 2: " .. out)
      assert.matches("--watch-min-interval-ms", out, 1, true)
    end
    local out = H.sh(bin .. " control --help")
    assert.matches("--watch-min-interval-ms", out, 1, true)
  end)

  it("answers /healthz and /readyz within 1 s under a flood of 10,000 idle connections", function()
    finally(H.kill_all)
    local c = H.start_control(dir)
    local out, rc = H.sh(string.format("ulimit -n 20000 2>/dev/null; timeout -k 1 60 python3 %s %d %d %d %d 2>&1",
      H.q(dir .. "/flood.py"), c.port, 10000, 20, c.pid))
    assert(rc == 0, "flood.py exited " .. tostring(rc) .. ": " .. out)
    local r = H.json(out)
    assert.equal(10000, r.flood)
    for k, p in ipairs(r.probes) do
      assert(p.status == 200, "probe " .. k .. " " .. p.path .. ": status " .. tostring(p.status) .. ", want 200")
      assert(p.ms < 1000, "probe " .. k .. " " .. p.path .. ": " .. p.ms .. " ms, want < 1000")
    end
    -- the reserve is for health paths only: anything else is refused as
    -- over capacity while the flood holds every ordinary slot
    assert(r.other == 503, "GET /v1/services under the flood: " .. tostring(r.other) .. ", want 503")
    assert(r.metrics_status == 503, "GET /metrics under the flood: " .. tostring(r.metrics_status))
    -- and counted, once the flood is gone
    local _, body = H.request(dir, "GET", c.url .. "/metrics")
    local n = tonumber(body:match("openmesh_http_connections_reserved_total (%d+)"))
    assert(n and n >= 22, "connections_reserved_total " .. tostring(n) .. ", want >= 22")
    assert.equal(0, H.stop(c))
  end)
end)
