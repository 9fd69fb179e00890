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
    local last
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
      local p, why = H.start_up(dir, "up" .. base, H.q(dir))
      if p then return p end
      last = why
    end
    error("openmesh up did not start in 4 tries; the last: " .. tostring(last))
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

-- proxy.policy "control:NAME": up seeds the document with the default
-- policy on its own plane and the proxy follows it; a PUT is the edit, a
-- broken one is refused with 422 and routing goes on.
describe("openmesh up with policy control:NAME", function()
  if not H.bin or H.bin == "" then
    it("runs against OPENMESH_BIN", function()
      pending("OPENMESH_BIN is not set (make check sets it to build/bin/openmesh)")
    end)
    return
  end

  local dir, up, urls

  setup(function()
    dir = H.tmpdir()
    H.writefile(dir .. "/up.json", cjson.encode({
      control = { host = "127.0.0.1", port = 0 },
      proxy = { port = 0, admin_port = 0, policy = "control:traffic" },
      services = {
        { service = "orders", id = "v1", port = 0, behaviour = "fast", metadata = { version = "v1" } },
        { service = "orders", id = "v2", port = 0, behaviour = "fast", metadata = { version = "v2" } },
      },
    }))
    up = H.start_up(dir, "up-control", H.q(dir))
    assert(up, "openmesh up did not start: " .. H.readfile(dir .. "/up-control.out"))
    local out = H.readfile(up.out)
    urls = {
      control = out:match("control plane%s+(http://[%d%.]+:%d+)"),
      proxy = out:match("proxy%s+(http://[%d%.]+:%d+)"),
      admin = out:match("%(admin: (http://[%d%.]+:%d+)/status%)"),
    }
  end)

  teardown(function()
    if up and H.alive(up.pid) then H.kill(up.pid, "KILL") end
    H.kill_all()
  end)

  local function served_by()
    local st, body = H.request(dir, "GET", urls.proxy .. "/", { headers = { "Host: orders" } })
    return st == 200 and H.json(body).id or st
  end

  it("seeds the document with the default policy and prints a PUT to change it", function()
    local out = H.readfile(up.out)
    assert.truthy(out:find("traffic policy  control:traffic", 1, true), out)
    assert.truthy(out:find("--data-binary @/tmp/traffic.lua " .. urls.control .. "/v1/config/traffic", 1, true), out)
    local st, body = H.request(dir, "GET", urls.control .. "/v1/config/traffic")
    assert.equal(200, st, body)
    assert.equal(H.readfile(here .. "../../policies/traffic.lua"), body)
    assert.truthy(H.wait_for(function() return served_by() == "v1" or nil end, 5))
  end)

  it("follows a PUT, refuses a broken one with 422 and keeps routing", function()
    local st, body = H.request(dir, "PUT", urls.control .. "/v1/config/traffic", {
      headers = { "Content-Type: text/x-lua" },
      body = "local p = require 'openmesh.policy'\n"
        .. "return { kind = 'traffic', subset = function(_, peers)\n"
        .. "  return p.match_metadata(peers, 'version', 'v2') end }\n",
    })
    assert.equal(200, st, body)
    local rev = H.json(body).revision
    assert.truthy(H.wait_for(function()
      for _ = 1, 4 do if served_by() ~= "v2" then return nil end end
      return true
    end, 5), "every call reaches v2 after the PUT")
    st, body = H.request(dir, "PUT", urls.control .. "/v1/config/traffic", {
      headers = { "Content-Type: text/x-lua" }, body = "return { kind = 'traffic' }" })
    assert.equal(422, st, body)
    assert.equal("v2", served_by())
    st, body = H.request(dir, "GET", urls.admin .. "/status")
    local pol = H.json(body).services.orders.policy
    assert.equal("control:traffic", pol.source)
    assert.equal(H.rev(rev), H.rev(pol.revision))
  end)

  it("stops on SIGTERM and exits 0", function()
    H.kill(up.pid, "TERM")
    assert.equal(0, H.exit_status(up, 10))
    up = nil
  end)
end)
