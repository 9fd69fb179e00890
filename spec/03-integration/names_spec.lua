-- names_spec.lua: the one URL rule and peers by name, end to end with the
-- real binaries. `openmesh up` runs a control plane and example services
-- (each answers any request); a real `openmesh proxy` watches the control
-- plane or reads a --static file. Checked: a registration with a URL a
-- proxy would refuse gets 400 naming `url` and the service keeps moving;
-- instances registered as http://localhost:PORT answer through the proxy;
-- a name that never resolves (RFC 6761 .invalid) makes only its instance
-- unavailable; a name whose resolution starts failing keeps its last good
-- addresses (OPENMESH_RESOLVE_HOSTS: a hosts-format file the proxy then
-- resolves from, the test hook of docs/PROXY.md "Peers by name").
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../support/?.lua;" .. package.path

local H = require "control_helper"
local cjson = require "cjson"

-- Every peer, or only the one named by x-want (so a call can aim at one).
local POLICY = [[
return {
  kind = "traffic",
  subset = function(req, peers)
    local want = req.headers["x-want"]
    if not want then return peers end
    local out = {}
    for _, p in ipairs(peers) do
      if p.id == want then out[#out + 1] = p end
    end
    return out
  end,
  per_try_timeout_ms = 1000,
  retries = 2,
  resolve_interval_ms = 100,
}
]]

describe("peer URLs: one rule, names resolved by the proxy", function()
  if not H.bin or H.bin == "" then
    it("runs against OPENMESH_BIN", function()
      pending("OPENMESH_BIN is not set (make check sets it to build/bin/openmesh)")
    end)
    return
  end

  local dir, up, base, proxy

  local function start_up()
    math.randomseed(os.time() + tonumber(tostring({}):match("0x(%x+)"), 16) % 1000)
    for _ = 1, 4 do
      base = 24000 + math.random(0, 400) * 20
      local conf = {
        control = { host = "127.0.0.1", port = base },
        proxy = { port = base + 10, admin_port = base + 11 },
        services = {
          { service = "web", id = "web-a", port = base + 1, behaviour = "fast" },
          { service = "web", id = "web-b", port = base + 2, behaviour = "fast" },
          { service = "spare", id = "spare-c", port = base + 3, behaviour = "fast" },
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

  local function control()
    return "http://127.0.0.1:" .. base
  end

  local function put(id, url, ttl)
    return H.request(dir, "PUT", control() .. "/v1/services/web/instances/" .. id,
      { body = cjson.encode({ url = url, ttl_ms = ttl or 60000 }) })
  end

  local function call(p, want)
    local headers = { "Host: web" }
    if want then
      headers[#headers + 1] = "x-want: " .. want
    end
    return H.request(dir, "GET", p.url .. "/hello", { headers = headers, max_time = 5 })
  end

  local function status(p)
    local code, body = H.request(dir, "GET", p.admin .. "/status")
    assert.equal(200, code)
    return H.json(body)
  end

  local function peer_status(p, id)
    local svc = status(p).services.web
    for _, peer in ipairs(svc and svc.peers or {}) do
      if peer.id == id then
        return peer
      end
    end
  end

  -- The peers calls reach, out of n calls.
  local function reached(p, n, want)
    local seen = {}
    for _ = 1, n do
      local code, _, headers = call(p, want)
      if code == 200 then
        seen[headers["x-openmesh-peer"]] = true
      end
    end
    return seen
  end

  setup(function()
    dir = H.tmpdir()
    up = start_up()
    H.writefile(dir .. "/traffic.lua", POLICY)
    proxy = H.start_proxy(dir, "proxy-watch", "--control " .. H.q(control()) ..
      " --service web --policy " .. H.q(dir .. "/traffic.lua"))
    assert(H.wait_for(function()
      local code = call(proxy)
      return code == 200
    end, 10), "the proxy never served web")
  end)

  teardown(function()
    H.kill_all()
    if dir then
      os.execute("rm -rf " .. H.q(dir))
    end
  end)

  it("refuses with 400 naming url what a proxy would refuse; the service keeps moving", function()
    local bad = {
      "http://web-4.internal:8080#frag",
      "http://web-4.internal:8080/?query=1",
      "http://999.1.1.1:8080",
      "ftp://127.0.0.1:8080",
      "http://user@127.0.0.1:8080",
      "http://127.0.0.1:65536",
      "http://my_host:8080",
      "http://[fe80::1%25eth0]:8080",
    }
    for _, url in ipairs(bad) do
      local code, body = put("web-bad", url)
      assert.equal(400, code, url .. ": " .. body)
      local doc = H.json(body)
      assert.same({ "invalid_field", "url" }, { doc.error, doc.field }, url .. ": " .. body)
    end
    -- later registrations reach the proxy: a new instance serves...
    local code, body = put("web-c", "http://127.0.0.1:" .. (base + 3))
    assert.equal(200, code, body)
    assert(H.wait_for(function()
      return reached(proxy, 1, "web-c")["web-c"]
    end, 10), "a registration after the refused ones never reached the proxy")
    -- ...and a deregistration takes one away
    code = H.request(dir, "DELETE", control() .. "/v1/services/web/instances/web-c")
    assert.equal(200, code)
    assert(H.wait_for(function()
      return peer_status(proxy, "web-c") == nil
    end, 10), "a deregistration never reached the proxy")
    local seen = reached(proxy, 6)
    assert.is_nil(seen["web-c"])
    assert.truthy(seen["web-a"] or seen["web-b"])
  end)

  it("serves instances registered as http://localhost:PORT", function()
    local code, body = put("web-local", "http://localhost:" .. (base + 3))
    assert.equal(200, code, body)
    assert(H.wait_for(function()
      local p = peer_status(proxy, "web-local")
      return p and p.available
    end, 10), "localhost never resolved: " .. cjson.encode(peer_status(proxy, "web-local") or {}))
    local p = peer_status(proxy, "web-local")
    assert.equal("resolved", p.resolve)
    assert.truthy(#p.addresses >= 1)
    -- every call aimed at it answers, whichever address localhost gives first
    for _ = 1, 4 do
      local c, b, headers = call(proxy, "web-local")
      assert.equal(200, c, b)
      assert.equal("web-local", headers["x-openmesh-peer"])
    end
    H.request(dir, "DELETE", control() .. "/v1/services/web/instances/web-local")
  end)

  it("a name that never resolves makes that one instance unavailable", function()
    local code, body = put("web-never", "http://nonexistent.invalid:1")
    assert.equal(200, code, body)
    assert(H.wait_for(function()
      local p = peer_status(proxy, "web-never")
      return p and p.resolve == "failed"
    end, 10), "no failed lookup: " .. cjson.encode(peer_status(proxy, "web-never") or {}))
    local p = peer_status(proxy, "web-never")
    assert.is_false(p.available)
    assert.equal("unresolved", p.unavailable_reason)
    assert.not_equal("", p.resolve_error)
    -- the others serve every call; the unresolved one is never picked
    local seen = reached(proxy, 8)
    assert.is_nil(seen["web-never"])
    assert.truthy(seen["web-a"] or seen["web-b"])
    local c, b = call(proxy, "web-never")
    assert.equal(503, c)
    assert.equal("no_peers", H.json(b).reason)
    local _, metrics = H.request(dir, "GET", proxy.admin .. "/metrics")
    assert.truthy(metrics:find('openmesh_proxy_unresolved_peers{service="web"} 1', 1, true), metrics)
    assert.truthy(metrics:match('openmesh_proxy_resolve_failures_total{service="web"} [1-9]'))
    H.request(dir, "DELETE", control() .. "/v1/services/web/instances/web-never")
  end)

  it("keeps the last good addresses of a name whose resolution starts failing", function()
    local hosts = dir .. "/hosts"
    -- multi.test: first an address where nothing listens, then the real one
    H.writefile(hosts, "# test names\n127.0.0.1 web-a.test web-a.other\n" ..
      "127.0.0.2 multi.test\n127.0.0.1 multi.test\n")
    H.writefile(dir .. "/static.json", cjson.encode({ services = { web = { instances = {
      { id = "named", url = "http://web-a.test:" .. (base + 1) },
      { id = "multi", url = "http://multi.test:" .. (base + 2) },
    } } } }))
    local p = H.start_proxy(dir, "proxy-hosts", "--static " .. H.q(dir .. "/static.json") ..
      " --policy " .. H.q(dir .. "/traffic.lua"),
      { env = "OPENMESH_RESOLVE_HOSTS=" .. H.q(hosts) .. " " })
    assert(H.wait_for(function()
      local s = peer_status(p, "named")
      return s and s.resolve == "resolved"
    end, 10), "never resolved from the hosts file")
    assert.same({ "127.0.0.1" }, peer_status(p, "named").addresses)
    local c, b = call(p, "named")
    assert.equal(200, c, b)
    -- several addresses: a refused connect moves the peer to the next one,
    -- within the call (its pre-send retry), and the circuit stays closed
    assert(H.wait_for(function()
      local s = peer_status(p, "multi")
      return s and s.resolve == "resolved"
    end, 10), "multi.test never resolved")
    assert.same({ "127.0.0.2", "127.0.0.1" }, peer_status(p, "multi").addresses)
    for _ = 1, 3 do
      local code, body, headers = call(p, "multi")
      assert.equal(200, code, body)
      assert.equal("multi", headers["x-openmesh-peer"])
    end
    -- the address in use: a re-resolution in between (a new generation)
    -- shows none until the next call picks one, so call and read together
    local m = H.wait_for(function()
      local code = call(p, "multi")
      local st = peer_status(p, "multi")
      return code == 200 and st and st.address == "127.0.0.1" and st
    end, 5)
    assert(m, "multi never settled on 127.0.0.1: " .. cjson.encode(peer_status(p, "multi")))
    assert.equal("closed", m.circuit)
    -- the name leaves the file: lookups fail, the address stays in use
    H.writefile(hosts, "127.0.0.1 someone-else.test\n")
    assert(H.wait_for(function()
      local s = peer_status(p, "named")
      return s and s.resolve == "stale"
    end, 10), "no failed lookup seen")
    local s = peer_status(p, "named")
    assert.truthy(s.resolve_error:find("not found", 1, true), s.resolve_error)
    assert.same({ "127.0.0.1" }, s.addresses)
    assert.is_true(s.available)
    for _ = 1, 3 do
      c, b = call(p, "named")
      assert.equal(200, c, b)
    end
    -- and it comes back
    H.writefile(hosts, "127.0.0.1 web-a.test\n")
    assert(H.wait_for(function()
      local x = peer_status(p, "named")
      return x and x.resolve == "resolved"
    end, 10), "never resolved again")
    H.stop(p)
  end)
end)
