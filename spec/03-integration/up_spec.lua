-- `openmesh up`: the embedded default, as a new user runs it: the control
-- plane, the proxy and the example services come up, calls route through
-- the proxy by Host, a lease is visible in the registry, and Ctrl-C
-- (SIGINT) deregisters everything and exits 0.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../support/?.lua;" .. package.path
local H = require "control_helper"
local cjson = require "cjson"

describe("openmesh up", function()
  if not H.bin or H.bin == "" then
    it("runs against OPENMESH_BIN", function()
      pending("OPENMESH_BIN is not set (make check sets it to build/bin/openmesh)")
    end)
    return
  end

  local dir, up, base

  local function start()
    math.randomseed(os.time() + tonumber(tostring({}):match("0x(%x+)"), 16) % 1000)
    for _ = 1, 4 do
      base = 30000 + math.random(0, 400) * 20
      local conf = {
        control = { host = "127.0.0.1", port = base },
        proxy = { port = base + 1, admin_port = base + 2 },
        services = {
          { service = "orders", id = "a", port = base + 3, behaviour = "fast", metadata = { version = "v1" } },
          { service = "orders", id = "b", port = base + 4, behaviour = "fast", metadata = { version = "v1" } },
          { service = "orders", id = "flaky", port = base + 5, behaviour = "flaky", fail_every = 2 },
        },
      }
      H.writefile(dir .. "/up.json", cjson.encode(conf))
      local p = H.start_up(dir, "up" .. base, H.q(dir))
      if p then return p end
    end
    error("openmesh up did not start")
  end

  local function call(path, headers, service)
    local h = { "Host: " .. (service or "orders") }
    for _, x in ipairs(headers or {}) do h[#h + 1] = x end
    return H.request(dir, "GET", "http://127.0.0.1:" .. (base + 1) .. path, { headers = h })
  end

  setup(function()
    dir = H.tmpdir()
    up = start()
  end)

  teardown(function()
    if up and H.alive(up.pid) then H.kill(up.pid, "KILL") end
    H.kill_all()
  end)

  it("prints the tour with the URLs", function()
    local out = H.readfile(up.out)
    assert.truthy(out:find("control plane   http://127.0.0.1:" .. base, 1, true), out)
    assert.truthy(out:find("proxy           http://127.0.0.1:" .. (base + 1), 1, true), out)
  end)

  it("registers the example services with leases", function()
    local r = H.wait_for(function()
      local status, body = H.request(dir, "GET", "http://127.0.0.1:" .. base .. "/v1/services/orders")
      local doc = status == 200 and H.json(body)
      if doc and #doc.instances == 3 then return doc end
    end, 5)
    assert.truthy(r, "three instances registered")
    for _, inst in ipairs(r.instances) do
      assert.equal(10000, inst.ttl_ms)
    end
  end)

  it("routes calls through the proxy, keyed calls to one peer, and retries the flaky one", function()
    local seen = {}
    for _ = 1, 12 do -- a 503 from the flaky peer is retried on another
      local status, body = call("/")
      assert.equal(200, status, body)
      seen[H.json(body).id] = true
    end
    assert.truthy(next(seen))
    -- a key the rendezvous hash gives to a steady peer stays on it
    local key, first
    for i = 1, 50 do
      local _, body = call("/", { "x-openmesh-key: user-" .. i })
      if H.json(body).id ~= "flaky" then
        key, first = "user-" .. i, H.json(body).id
        break
      end
    end
    assert.truthy(key)
    for _ = 1, 5 do
      local _, again = call("/", { "x-openmesh-key: " .. key })
      assert.equal(first, H.json(again).id)
    end
  end)

  it("answers an unknown service with a stable reason", function()
    local status, body = H.request(dir, "GET", "http://127.0.0.1:" .. (base + 1) .. "/",
      { headers = { "Host: nosuch" } })
    assert.equal(503, status)
    assert.equal("no_peers", H.json(body).reason)
  end)

  it("deregisters everything and exits 0 on SIGINT", function()
    H.kill(up.pid, "INT")
    assert.equal(0, H.exit_status(up, 10))
    local log = H.readfile(up.out)
    assert.truthy(log:find('"change":"deleted"', 1, true) or log:find("deleted", 1, true), log)
    up = nil
  end)
end)
