-- workers_spec.lua: `openmesh proxy --workers N`, the real binary: N event
-- loops accepting on one shared socket beside a control loop that watches
-- the control plane and fans snapshots, reloads and the drain out to them
-- (host/proxy/om_proxy_workers.c, docs/ARCHITECTURE.md "Workers"). The
-- upstream is a real `openmesh control` (it answers GET /v1/services/S),
-- driven with curl over loopback.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../support/?.lua;" .. package.path

local H = require "control_helper"

local function policy(max_inflight)
  return string.format([[
return {
  kind = "traffic",
  subset = function(_, peers) return peers end,
  max_inflight = %d,
  max_queue = 3,
  retries = 0,
}
]], max_inflight)
end

describe("openmesh proxy --workers", function()
  if not H.bin or H.bin == "" then
    it("runs against OPENMESH_BIN", function()
      pending("OPENMESH_BIN is not set (make check sets it to build/bin/openmesh)")
    end)
    return
  end

  local dir, control, proxy
  local bin = "timeout 10 " .. H.q(H.bin)

  local function status()
    local code, body = H.request(dir, "GET", proxy.admin .. "/status")
    assert.equal(200, code)
    return H.json(body)
  end

  -- n calls, each on a new connection (Connection: close), in one curl;
  -- the status codes, in order.
  local function calls(n)
    local urls = {}
    for i = 1, n do
      urls[i] = H.q(proxy.url .. "/v1/services/orders")
    end
    local out = H.sh(H.curl(30) .. " -s -w '%{http_code}\\n'" ..
      " -H 'Host: orders' -H 'Connection: close' -o /dev/null " ..
      table.concat(urls, " -o /dev/null "))
    local codes = {}
    for c in out:gmatch("%d+") do
      codes[#codes + 1] = tonumber(c)
    end
    return codes
  end

  setup(function()
    dir = H.tmpdir()
    control = H.start_control(dir)
    -- a peer nobody listens on: the proxy's own error until it is replaced
    H.register(dir, control.url, "orders", "dead", { url = "http://127.0.0.1:1", ttl_ms = 60000 })
    H.writefile(dir .. "/traffic.lua", policy(5))
    proxy = H.start_proxy(dir, "proxy", "--workers 2 --policy " ..
      H.q(dir .. "/traffic.lua") .. " --control " .. H.q(control.url) ..
      " --service orders")
  end)

  teardown(function()
    H.kill_all()
    if dir then
      os.execute("rm -rf " .. H.q(dir))
    end
  end)

  it("refuses a worker count that is not in [1, 64] with exit 2", function()
    for _, bad in ipairs({ "0", "-1", "65", "two", "2x" }) do
      local out, rc = H.sh(bin .. " proxy --static x.json --workers " .. bad .. " 2>&1")
      assert.equal(2, rc, bad)
      assert.matches("--workers: '" .. bad .. "' is not a number in [1, 64]", out, 1, true)
    end
    local out = H.sh(bin .. " proxy --help")
    assert.matches("--workers N", out, 1, true)
  end)

  it("says how many workers it runs, and splits admission limits exactly", function()
    local st = status()
    assert.equal(2, st.workers)
    assert.equal(2, #st.worker_connections_accepted)
    assert.truthy(H.wait_for(function()
      local s = status().services.orders
      return s and s.pool.limit == 5 and s.pool.max_queue == 3
    end, 5), "the shares of max_inflight 5 do not sum up, or max_queue 3 is not each worker's")
  end)

  it("applies a control-plane change on every worker", function()
    H.register(dir, control.url, "orders", "live", { url = control.url, ttl_ms = 60000 })
    local code = H.request(dir, "DELETE", control.url .. "/v1/services/orders/instances/dead")
    assert.equal(200, code)
    -- every worker must drop the dead peer: then every new connection,
    -- whichever worker takes it, reaches the control plane
    local ok = H.wait_for(function()
      local codes = calls(40)
      for _, c in ipairs(codes) do
        if c ~= 200 then
          return false
        end
      end
      return #codes == 40
    end, 10, 0.2)
    assert.truthy(ok, "some connection still saw the old peer set")
  end)

  it("spreads new connections over both workers", function()
    local codes = calls(200)
    assert.equal(200, #codes)
    local st = status()
    local a, b = st.worker_connections_accepted[1], st.worker_connections_accepted[2]
    assert.truthy(a > 0 and b > 0, "accepted per worker: " .. a .. ", " .. b)
    assert.truthy(a + b >= 200)
    local _, metrics = H.request(dir, "GET", proxy.admin .. "/metrics")
    assert.matches("openmesh_proxy_workers 2\n", metrics, 1, true)
    assert.matches('openmesh_proxy_worker_connections_accepted_total{worker="1"}', metrics, 1, true)
    -- one registry: one series per name and labels, summed over workers
    local n = 0
    for _ in metrics:gmatch('\nopenmesh_proxy_requests_total{service="orders",outcome="ok"} ') do
      n = n + 1
    end
    assert.equal(1, n)
    local ok = tonumber(metrics:match(
      '\nopenmesh_proxy_requests_total{service="orders",outcome="ok"} (%d+)'))
    assert.truthy(ok and ok >= 200, "requests ok: " .. tostring(ok))
  end)

  it("levels a burst of connections opened at once over both workers", function()
    -- a client opening its pool: 32 connections, every one open before
    -- the first request; the worker awake first used to take nearly all.
    -- Each gets an answer (some 503 overloaded: max_inflight is 5).
    local before = status().worker_connections_accepted
    local script = dir .. "/burst.py"
    H.writefile(script, [[
import socket, sys
socks = []
for i in range(32):
    s = socket.socket()
    s.setblocking(False)
    try:
        s.connect(("127.0.0.1", int(sys.argv[1])))
    except BlockingIOError:
        pass
    socks.append(s)
answered = 0
for s in socks:
    s.setblocking(True)
    s.settimeout(10)
    s.sendall(b"GET /v1/services/orders HTTP/1.1\r\nHost: orders\r\nConnection: close\r\n\r\n")
for s in socks:
    data = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        data += b
    answered += data.startswith(b"HTTP/1.1 ")
    s.close()
print("answered", answered)
]])
    local out = H.sh("timeout 30 python3 " .. H.q(script) .. " " .. proxy.port .. " 2>&1")
    assert.matches("answered 32", out, 1, true)
    local after = status().worker_connections_accepted
    local a, b = after[1] - before[1], after[2] - before[2]
    assert.equal(32, a + b)
    assert.truthy(math.abs(a - b) <= 4,
      "connections per worker: " .. a .. " and " .. b .. " (at most 4 apart)")
  end)

  it("reloads the policy on every worker on SIGHUP", function()
    H.writefile(dir .. "/traffic.lua", policy(9))
    H.kill(proxy.pid, "HUP")
    -- 9 is 5 + 4: only both workers' shares add up to it
    assert.truthy(H.wait_for(function()
      return status().services.orders.pool.limit == 9
    end, 5), "limit after SIGHUP: " .. tostring(status().services.orders.pool.limit))
  end)

  it("refuses a port another proxy listens on: exit 1, address already in use", function()
    H.writefile(dir .. "/one.json",
      '{"services": {"orders": {"instances": [{"id": "a", "url": "http://127.0.0.1:1"}]}}}')
    local out, rc = H.sh(bin .. " proxy --workers 2 --policy " .. H.q(dir .. "/traffic.lua") ..
      " --static " .. H.q(dir .. "/one.json") .. " --listen 127.0.0.1:" ..
      proxy.port .. " --admin 127.0.0.1:0 2>&1")
    assert.equal(1, rc)
    assert.matches("cannot listen on 127.0.0.1:" .. proxy.port .. ": address already in use",
      out, 1, true)
  end)

  -- Sequential calls to a peer that refuses connections, each on a new
  -- connection (so either worker may take it): how many failed attempts
  -- it had when its circuit opened. (One peer: P2C cannot steer around
  -- it, every call is an attempt on it until the circuit opens.)
  local function failures_to_eject(workers)
    H.writefile(dir .. "/dead.json",
      '{"services": {"orders": {"instances": [{"id": "dead", "url": "http://127.0.0.1:1"}]}}}')
    local p = H.start_proxy(dir, "circuit" .. workers, "--workers " .. workers ..
      " --circuit-failures 3 --policy " .. H.q(dir .. "/traffic.lua") ..
      " --static " .. H.q(dir .. "/dead.json"))
    local saved = proxy
    proxy = p
    local failures
    for _ = 1, 60 do
      calls(1)
      local dead = status().services.orders.peers[1]
      if dead.circuit == "open" then
        failures = dead.failures
        break
      end
    end
    proxy = saved
    assert.equal(0, H.stop(p))
    return failures
  end

  it("ejects a failing peer after as many failures with 2 workers as with 1", function()
    local one = failures_to_eject(1)
    local two = failures_to_eject(2)
    assert.equal(3, one)
    assert.equal(one, two)
  end)

  it("drains every worker on SIGTERM and exits 0", function()
    assert.equal(0, H.stop(proxy))
  end)
end)
