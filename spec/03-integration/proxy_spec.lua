-- proxy_spec.lua: the real `openmesh proxy` binary as a child process, in
-- front of real upstream processes: `openmesh up` runs the example services
-- (fast, slow, flaky; host/cli/om_example_service.h) from a temporary up.json,
-- and the proxy routes to them from a --static topology. Driven with curl
-- over loopback (spec/support/control_helper.lua). The thorough properties
-- (deadlines within 10%, circuits, canary under failure, streams cut after
-- the head, overload) are in tests/test_proxy.c; this is the end-to-end
-- check of the binary: flags, exit codes, routing, retries, errors, admin
-- endpoints, SIGHUP and SIGTERM.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../support/?.lua;" .. package.path

local H = require "control_helper"
local cjson = require "cjson"

local POLICY = [[
return {
  kind = "traffic",
  subset = function(_, peers) return peers end,
  per_try_timeout_ms = 1000,
  retries = 2,
}
]]

-- Only peer fast-b: what the SIGHUP reload switches to.
local POLICY_B = [[
return {
  kind = "traffic",
  subset = function(_, peers)
    local out = {}
    for _, p in ipairs(peers) do
      if p.id ~= "fast-a" then out[#out + 1] = p end
    end
    return out
  end,
}
]]

describe("openmesh proxy, the real binary", function()
  if not H.bin or H.bin == "" then
    it("runs against OPENMESH_BIN", function()
      pending("OPENMESH_BIN is not set (make check sets it to build/bin/openmesh)")
    end)
    return
  end

  local dir, up, proxy, base
  local bin = "timeout 10 " .. H.q(H.bin) -- never left running

  -- `openmesh up DIR` with the example services on ports base+1..; a few
  -- tries with other ports if one is taken.
  local function start_up()
    math.randomseed(os.time() + tonumber(tostring({}):match("0x(%x+)"), 16) % 1000)
    for _ = 1, 4 do
      base = 20000 + math.random(0, 400) * 20
      local conf = {
        control = { host = "127.0.0.1", port = base },
        proxy = { port = base + 10, admin_port = base + 11 },
        services = {
          { service = "orders", id = "fast-a", port = base + 1, behaviour = "fast" },
          { service = "orders", id = "fast-b", port = base + 2, behaviour = "fast" },
          { service = "orders", id = "flaky", port = base + 3, behaviour = "flaky", fail_every = 2 },
          { service = "slow", id = "slow-a", port = base + 4, behaviour = "slow", delay_ms = 400 },
          { service = "broken", id = "down-a", port = base + 5, behaviour = "flaky", fail_every = 1 },
          { service = "broken", id = "down-b", port = base + 6, behaviour = "flaky", fail_every = 1 },
        },
      }
      H.writefile(dir .. "/up.json", cjson.encode(conf))
      local p = H.start_up(dir, "up" .. base, H.q(dir))
      if p then
        return p
      end
    end
    error("openmesh up did not start")
  end

  local function static_doc()
    local function inst(id, port)
      return { id = id, url = "http://127.0.0.1:" .. port }
    end
    return cjson.encode({ services = {
      orders = { revision = 1, instances = {
        inst("fast-a", base + 1), inst("fast-b", base + 2), inst("flaky", base + 3) } },
      stable = { instances = { inst("fast-a", base + 1), inst("fast-b", base + 2) } },
      slow = { instances = { inst("slow-a", base + 4) } },
      broken = { instances = { inst("down-a", base + 5), inst("down-b", base + 6) } },
    } })
  end

  -- Start the proxy on free ports, read back from its start log line.
  local n_proxy = 0
  local function start_proxy(args)
    n_proxy = n_proxy + 1
    return H.start_proxy(dir, "proxy" .. n_proxy, args)
  end

  local function call(method, service, opts)
    opts = opts or {}
    local headers = { "Host: " .. service }
    for _, h in ipairs(opts.headers or {}) do
      headers[#headers + 1] = h
    end
    return H.request(dir, method, proxy.url .. (opts.path or "/"),
      { headers = headers, body = opts.body, max_time = opts.max_time })
  end

  setup(function()
    dir = H.tmpdir()
    up = start_up()
    H.writefile(dir .. "/traffic.lua", POLICY)
    H.writefile(dir .. "/static.json", static_doc())
    proxy = start_proxy("--policy " .. H.q(dir .. "/traffic.lua") ..
      " --static " .. H.q(dir .. "/static.json"))
  end)

  teardown(function()
    H.kill_all()
    if dir then
      os.execute("rm -rf " .. H.q(dir))
    end
  end)

  it("has --help and refuses bad command lines and files with exit 2", function()
    local out, rc = H.sh(bin .. " proxy --help")
    assert.equal(0, rc)
    assert.matches("--static FILE", out, 1, true)
    out, rc = H.sh(bin .. " proxy 2>&1")
    assert.equal(2, rc)
    assert.matches("exactly one of --static FILE or --control URL", out, 1, true)
    out, rc = H.sh(bin .. " proxy --static x.json --listen nowhere 2>&1")
    assert.equal(2, rc)
    assert.matches("--listen", out, 1, true)
    H.writefile(dir .. "/bad.json",
      '{"services": {"orders": {"instances": [{"id": "a", "url": "http://127.0.0.1:1/?q"}]}}}')
    out, rc = H.sh(bin .. " proxy --static " .. H.q(dir .. "/bad.json") .. " 2>&1")
    assert.equal(2, rc)
    assert.matches("services.orders.instances[0].url: must not carry a query", out, 1, true)
    out, rc = H.sh(bin .. " proxy --static " .. H.q(dir .. "/static.json") ..
      " --service-policy nobody=" .. H.q(dir .. "/traffic.lua") .. " 2>&1")
    assert.equal(2, rc)
    assert.matches("no service 'nobody'", out, 1, true)
    H.writefile(dir .. "/broken.lua", "return { kind = 'traffic' }")
    out, rc = H.sh(bin .. " proxy --static " .. H.q(dir .. "/static.json") ..
      " --policy " .. H.q(dir .. "/broken.lua") .. " --listen 127.0.0.1:0 --admin 127.0.0.1:0 2>&1")
    assert.equal(2, rc)
    assert.matches("subset", out, 1, true)
  end)

  it("routes by Host to the service's peers and says which peer answered", function()
    local status, body, headers = call("GET", "orders")
    assert.equal(200, status)
    local doc = H.json(body)
    assert.equal("orders", doc.service)
    assert.equal(doc.id, headers["x-openmesh-peer"])
    status, body = call("GET", "nobody")
    assert.equal(503, status)
    assert.equal("no_peers", H.json(body).reason)
  end)

  it("keeps a key on one peer", function()
    local seen = {}
    for k = 1, 8 do
      local first
      for _ = 1, 4 do
        local status, _, headers = call("GET", "stable", { headers = { "x-openmesh-key: user-" .. k } })
        assert.equal(200, status)
        first = first or headers["x-openmesh-peer"]
        assert.equal(first, headers["x-openmesh-peer"])
      end
      seen[first] = true
    end
    assert.truthy(seen["fast-a"] and seen["fast-b"]) -- keys spread, each sticks
  end)

  it("retries a flaky peer's 503 for GET, never a POST without Idempotency-Key", function()
    for _ = 1, 12 do
      local status = call("GET", "orders")
      assert.equal(200, status) -- the flaky peer's 503s are retried elsewhere
    end
    local status, body, headers = call("POST", "broken", { body = "{}" })
    assert.equal(503, status) -- the upstream's answer, relayed, once
    assert.equal("1", headers["x-openmesh-attempts"])
    assert.equal(503, H.json(body).status)
    status, _, headers = call("POST", "broken", { body = "{}", headers = { "Idempotency-Key: k-1" } })
    assert.equal(503, status)
    assert.equal("2", headers["x-openmesh-attempts"])
  end)

  it("bounds a call by its deadline", function()
    local t0 = H.now()
    local status, body = call("GET", "slow", { headers = { "x-openmesh-deadline-ms: 150" } })
    local dt = H.now() - t0
    assert.equal(504, status)
    assert.equal("deadline_exceeded", H.json(body).reason)
    assert.is_true(dt < 1.0, "took " .. dt .. " s")
  end)

  it("serves /metrics, /status and /healthz on the admin listener", function()
    local status, body = H.request(dir, "GET", proxy.admin .. "/metrics")
    assert.equal(200, status)
    assert.matches('openmesh_proxy_requests_total{service="orders",outcome="ok"}', body, 1, true)
    assert.matches('openmesh_proxy_peer_circuit_state{service="orders",peer="flaky"}', body, 1, true)
    status, body = H.request(dir, "GET", proxy.admin .. "/status")
    assert.equal(200, status)
    local doc = H.json(body)
    assert.equal(1, doc.services.orders.revision)
    assert.equal(1, doc.services.orders.policy.version)
    assert.equal(3, #doc.services.orders.peers)
    status = H.request(dir, "GET", proxy.admin .. "/healthz")
    assert.equal(200, status)
  end)

  it("reloads policies on SIGHUP, keeping the last good one", function()
    H.writefile(dir .. "/traffic.lua", POLICY_B)
    H.kill(proxy.pid, "HUP")
    assert.truthy(H.wait_for(function()
      local _, body = H.request(dir, "GET", proxy.admin .. "/status")
      return H.json(body).services.orders.policy.version == 2
    end, 5))
    for _ = 1, 6 do
      local status, _, headers = call("GET", "orders")
      assert.equal(200, status)
      assert.are_not.equal("fast-a", headers["x-openmesh-peer"])
    end
    H.writefile(dir .. "/traffic.lua", "return { kind = 'traffic', retries = -1 }")
    H.kill(proxy.pid, "HUP")
    assert.truthy(H.wait_for(function()
      local _, body = H.request(dir, "GET", proxy.admin .. "/status")
      return H.json(body).services.orders.policy.reload_failures >= 1
    end, 5))
    local status = call("GET", "orders")
    assert.equal(200, status)
  end)

  it("drains an in-flight call on SIGTERM and exits 0", function()
    local w = H.spawn("curl -s -o " .. H.q(dir .. "/slow.body") .. " -w '%{http_code}' -H 'Host: slow' "
      .. H.q(proxy.url .. "/"), dir, "slowcall")
    H.sleep(0.15) -- the call is at the slow peer (400 ms)
    assert.equal(0, H.stop(proxy))
    assert.equal(0, H.exit_status(w, 5))
    assert.matches("200", H.readfile(w.out), 1, true)
    assert.equal(0, H.stop(up))
  end)
end)
