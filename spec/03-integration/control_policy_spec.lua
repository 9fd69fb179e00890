-- control_policy_spec.lua: traffic policies pushed by a real `openmesh
-- control` to real `openmesh proxy` processes (`--policy control:NAME`),
-- with python echo upstreams (tests/fixtures/echo_upstream.py) that say
-- which peer served. A PUT reaches two proxies within a second; the plane
-- refuses a broken revision (422); a revision the plane accepts but one
-- proxy refuses (it needs a library module only the other proxy has) is
-- reported as refused by that proxy in /v1/config/NAME/status while the
-- other applies it; with the plane down, running proxies keep routing and
-- a new proxy starts from its --policy-cache copy.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../support/?.lua;" .. package.path

local H = require "control_helper"
local cjson = require "cjson"

local ECHO = here .. "../../tests/fixtures/echo_upstream.py"
local LUA_DIR = here .. "../../lua"

-- A policy that routes only to the peer with id `home` (a Lua expression).
local function only(home, prelude)
  return (prelude or "") .. [[
local home = ]] .. home .. [[

return {
  kind = "traffic",
  subset = function(_, peers)
    local out = {}
    for _, p in ipairs(peers) do
      if p.id == home then out[#out + 1] = p end
    end
    return out
  end,
  vary = {},
  examples = {
    { peers = { { id = "a" }, { id = "b" } }, expect = { home } },
  },
}
]]
end

describe("--policy control:NAME", function()
  if not H.bin or H.bin == "" then
    it("runs against OPENMESH_BIN", function()
      pending("OPENMESH_BIN is not set (make check sets it to build/bin/openmesh)")
    end)
    return
  end

  local dir, libdir, plane, pa, pb, static
  local revs = {}

  local function put(body)
    return H.request(dir, "PUT", plane.url .. "/v1/config/traffic",
      { body = body, headers = { "Content-Type: text/x-lua" } })
  end

  -- Which echo answered a call through proxy p ("a", "b", or the status).
  local function served_by(p)
    local st, _, headers = H.request(dir, "GET", p.url .. "/", { headers = { "Host: web" }, max_time = 2 })
    if st ~= 200 then
      return "status " .. st
    end
    return headers["x-who"]
  end

  local function status_of(p)
    local st, body = H.request(dir, "GET", p.admin .. "/status")
    assert.are.equal(200, st)
    return H.json(body)
  end

  local function plane_status()
    local st, body = H.request(dir, "GET", plane.url .. "/v1/config/traffic/status")
    assert.are.equal(200, st, body)
    local by_id = {}
    for _, e in ipairs(H.json(body).proxies) do
      by_id[e.id] = e
    end
    return by_id
  end

  local function echo(name, who)
    local p = H.spawn(string.format("python3 %s --port 0 --header %s", H.q(ECHO),
      H.q("X-Who: " .. who)), dir, name)
    local port = H.wait_for(function()
      return tonumber(H.readfile(p.out):match("listening (%d+)"))
    end, 10)
    assert(port, name .. " did not start: " .. H.readfile(p.out))
    return "http://127.0.0.1:" .. port
  end

  setup(function()
    dir = H.tmpdir()
    -- the library of proxy A and of the plane: the shipped one plus a
    -- module proxy B does not have
    libdir = dir .. "/lib"
    os.execute("cp -r " .. H.q(LUA_DIR) .. " " .. H.q(libdir))
    H.writefile(libdir .. "/openmesh/tenants.lua", 'return { home = "a" }\n')
  end)
  teardown(function()
    H.kill_all()
    os.execute("rm -rf " .. H.q(dir))
  end)

  it("starts from the plane, takes each revision within a second and reports it", function()
    local p = H.spawn(string.format("OPENMESH_LIB_DIR=%s %s control --listen 127.0.0.1:0",
      H.q(libdir), H.q(H.bin)), dir, "plane")
    local port = H.wait_for(function()
      return tonumber(H.readfile(p.out):match('"event":"control_listening","url":"http://127%.0%.0%.1:(%d+)"'))
    end, 5)
    assert(port, "control did not start: " .. H.readfile(p.out))
    plane = { pid = p.pid, url = "http://127.0.0.1:" .. port, out = p.out }

    local a_url, b_url = echo("echo_a", "a"), echo("echo_b", "b")
    H.register(dir, plane.url, "web", "a", { url = a_url, ttl_ms = 600000 })
    H.register(dir, plane.url, "web", "b", { url = b_url, ttl_ms = 600000 })
    static = dir .. "/static.json"
    H.writefile(static, cjson.encode({ services = { web = { revision = 1, instances = {
      { id = "a", url = a_url }, { id = "b", url = b_url } } } } }))

    local st, body = put(only('"a"'))
    assert.are.equal(200, st, body)
    revs[1] = H.json(body).revision

    pa = H.start_proxy(dir, "proxy_a", string.format(
      "--control %s --service web --policy control:traffic --policy-cache %s --id pa",
      plane.url, H.q(dir .. "/cache_a")), { env = "OPENMESH_LIB_DIR=" .. H.q(libdir) .. " " })
    pb = H.start_proxy(dir, "proxy_b", string.format(
      "--control %s --service web --policy control:traffic --policy-cache %s --id pb",
      plane.url, H.q(dir .. "/cache_b")))
    for _, p in ipairs({ pa, pb }) do
      assert.is_truthy(H.wait_for(function() return served_by(p) == "a" end, 5),
        "proxy routes per revision 1: " .. tostring(served_by(p)))
      local s = status_of(p)
      assert.are.equal(H.rev(revs[1]), H.rev(s.policy_source.applied))
      assert.are.equal("control:traffic", s.services.web.policy.source)
      assert.are.equal(H.rev(revs[1]), H.rev(s.services.web.policy.revision))
    end

    -- revision 2 routes to b: both proxies within a second
    st, body = put(only('"b"'))
    assert.are.equal(200, st, body)
    revs[2] = H.json(body).revision
    local t0 = H.now()
    local both = H.wait_for(function()
      return served_by(pa) == "b" and served_by(pb) == "b"
    end, 3, 0.01)
    local took = H.now() - t0
    assert.is_truthy(both, "a: " .. tostring(served_by(pa)) .. ", b: " .. tostring(served_by(pb)))
    assert.is_true(took < 1.0, "took " .. took .. " s, want < 1 s")
    print(string.format("\n  revision 2 reached both proxies in %.3f s", took))

    -- each proxy reported it
    local by_id = H.wait_for(function()
      local t = plane_status()
      return t.pa and t.pb and t.pa.applied == revs[2] and t.pb.applied == revs[2] and t
    end, 3)
    assert.is_truthy(by_id, "plane status: " .. cjson.encode(plane_status()))
    assert.are.equal(pa.url, by_id.pa.address)
    assert.are.equal(cjson.null, by_id.pb.refused)
  end)

  it("leaves a revision the plane refuses (422) out of every proxy", function()
    local st, body = put("return { kind = 'traffic', subset = function( }")
    assert.are.equal(422, st, body)
    assert.are.equal("invalid_policy", H.json(body).error)
    assert.is_truthy(H.json(body).message:find("traffic:1:", 1, true), body)
    -- a budget that trips in an example names the example and the line
    st, body = put(table.concat({
      "return { kind = 'traffic',",
      "  subset = function(req, peers)",
      "    while req.path == '/spin' do end",
      "    return peers",
      "  end,",
      "  examples = { { req = { path = '/spin' }, peers = { { id = 'a' } }, expect = { 'a' } } } }",
    }, "\n"))
    assert.are.equal(422, st, body)
    -- the instruction limit, or on a slow (sanitized, loaded) machine the
    -- wall-clock cap, whichever trips first: either names example and line
    local msg = H.json(body).message
    assert.is_truthy(msg:find("traffic: example 1: budget: instruction limit exceeded at traffic:3", 1, true)
      or msg:find("traffic: example 1: budget: wall-clock limit exceeded at traffic:3", 1, true), body)
    assert.are.equal("b", served_by(pa))
    assert.are.equal("b", served_by(pb))
    -- the status routes: unknown documents and bad reports are refused
    st, body = H.request(dir, "GET", plane.url .. "/v1/config/nope/status")
    assert.are.equal(404, st, body)
    st, body = H.request(dir, "POST", plane.url .. "/v1/config/nope/status",
      { body = '{"id":"x","applied":1}' })
    assert.are.equal(404, st, body)
    for _, c in ipairs({
      { '{"applied":1}', "id" },
      { '{"id":"x","refused":3}', "reason" },
      { '{"id":"x","applied":-1}', "applied" },
      { '{"id":"x","colour":"red"}', "colour" },
    }) do
      st, body = H.request(dir, "POST", plane.url .. "/v1/config/traffic/status", { body = c[1] })
      assert.are.equal(400, st, c[1] .. " " .. body)
      assert.are.equal(c[2], H.json(body).field, body)
    end
  end)

  it("shows a revision one proxy refuses while the other applies it", function()
    -- accepted by the plane (its library has openmesh.tenants), as by A
    local st, body = put(only("require('openmesh.tenants').home"))
    assert.are.equal(200, st, body)
    revs[3] = H.json(body).revision
    assert.is_truthy(H.wait_for(function() return served_by(pa) == "a" end, 3),
      "proxy A applies revision 3: " .. tostring(served_by(pa)))
    local by_id = H.wait_for(function()
      local t = plane_status()
      return t.pa.applied == revs[3] and t.pb.refused == revs[3] and t
    end, 3)
    assert.is_truthy(by_id, "plane status: " .. cjson.encode(plane_status()))
    assert.are.equal(H.rev(revs[2]), H.rev(by_id.pb.applied))
    assert.is_truthy(by_id.pb.reason:find("openmesh.tenants", 1, true), by_id.pb.reason)
    assert.is_number(by_id.pb.refused_at)
    assert.are.equal(cjson.null, by_id.pa.refused)
    -- B keeps routing on revision 2, says so in /status and its metrics
    assert.are.equal("b", served_by(pb))
    local s = status_of(pb)
    assert.are.equal(H.rev(revs[3]), H.rev(s.policy_source.refused))
    assert.are.equal(H.rev(revs[2]), H.rev(s.services.web.policy.revision))
    local _, metrics = H.request(dir, "GET", pb.admin .. "/metrics")
    assert.is_truthy(metrics:find('openmesh_proxy_policy_updates_total{source="control",result="refused"} 1', 1, true),
      metrics:match("[^\n]*policy_updates[^\n]*") or metrics)
    local _, cm = H.request(dir, "GET", plane.url .. "/metrics")
    assert.is_truthy(cm:find('openmesh_control_policy_reports_total{result="refused"} [1-9]'), cm)
  end)

  it("feeds egress's fallback and heuristics policies, and shows a refusal", function()
    local function put_doc(name, file)
      return H.request(dir, "PUT", plane.url .. "/v1/config/" .. name,
        { body = H.readfile(file), headers = { "Content-Type: text/x-lua" } })
    end
    local st, body = put_doc("fallback", here .. "../../policies/fallback.lua")
    assert.are.equal(200, st, body)
    local fb_rev = H.json(body).revision
    st, body = put_doc("heuristics", here .. "../../policies/egress_heuristics.lua")
    assert.are.equal(200, st, body)
    local g = H.start_egress(dir, "egress", string.format(
      "--control %s --fallback control:fallback --heuristics control:heuristics --id gw",
      plane.url))
    local log = H.readfile(g.out)
    assert.is_truthy(log:find('"event":"policy_applied","source":"control:fallback"', 1, true), log)
    assert.is_truthy(log:find('"event":"policy_applied","source":"control:heuristics"', 1, true), log)
    -- a traffic policy is valid for the plane, not as a fallback policy
    st, body = put_doc("fallback", here .. "../../policies/traffic.lua")
    assert.are.equal(200, st, body)
    local bad_rev = H.json(body).revision
    local entry = H.wait_for(function()
      local _, b = H.request(dir, "GET", plane.url .. "/v1/config/fallback/status")
      local e = H.json(b).proxies[1]
      return e and e.refused == bad_rev and e
    end, 3)
    assert.is_truthy(entry, "no refusal reported")
    assert.are.equal("gw", entry.id)
    assert.are.equal(g.url, entry.address)
    assert.are.equal(H.rev(fb_rev), H.rev(entry.applied))
    assert.is_truthy(entry.reason:find("expected 'fallback', got 'traffic'", 1, true), entry.reason)
    st = H.request(dir, "GET", g.url .. "/status")
    assert.are.equal(200, st)
  end)

  it("keeps routing with the plane down, and starts a proxy from its cache", function()
    H.kill(plane.pid, "KILL")
    assert.is_truthy(H.wait_for(function() return not H.alive(plane.pid) end, 5))
    assert.are.equal("a", served_by(pa))
    assert.are.equal("b", served_by(pb))

    -- a new proxy: no plane, A's cache (revision 3), a static topology
    os.execute("cp -r " .. H.q(dir .. "/cache_a") .. " " .. H.q(dir .. "/cache_c"))
    local pc = H.start_proxy(dir, "proxy_c", string.format(
      "--static %s --control %s --policy control:traffic --policy-cache %s --id pc",
      H.q(static), plane.url, H.q(dir .. "/cache_c")), { env = "OPENMESH_LIB_DIR=" .. H.q(libdir) .. " " })
    local log = H.readfile(pc.out)
    assert.is_truthy(log:find('"event":"policy_from_cache"', 1, true), log)
    assert.are.equal("a", served_by(pc))
    local s = status_of(pc)
    assert.is_true(s.policy_source.from_cache)
    assert.are.equal(H.rev(revs[3]), H.rev(s.policy_source.applied))

    -- no plane and no cache: exit 1, naming both
    local out, rc = H.sh(string.format(
      "timeout 20 %s proxy --listen 127.0.0.1:0 --admin 127.0.0.1:0 --static %s --control %s " ..
      "--policy control:traffic --policy-cache %s 2>&1",
      H.q(H.bin), H.q(static), plane.url, H.q(dir .. "/empty_cache")))
    assert.are.equal(1, rc, out)
    assert.is_truthy(out:find("no control plane answered", 1, true) or out:find(plane.url, 1, true), out)
    assert.is_truthy(out:find("no cached copy", 1, true), out)
  end)

  it("refuses flags that do not go together, exit 2", function()
    local cases = {
      { "--static " .. H.q(static) .. " --policy control:traffic", "needs --control URL" },
      { "--static " .. H.q(static) .. " --policy-cache /tmp/x", "goes with --policy control:NAME" },
      { "--static " .. H.q(static) .. " --control http://127.0.0.1:9 --policy control:bad/name",
        "NAME must be" },
      { "--static " .. H.q(static) .. " --id 'has space'", "--id" },
      { "--static " .. H.q(static) .. " --service-policy web=control:traffic", "a service policy is a file" },
    }
    for _, c in ipairs(cases) do
      local out, rc = H.sh("timeout 10 " .. H.q(H.bin) .. " proxy --listen 127.0.0.1:0 --admin 127.0.0.1:0 " ..
        c[1] .. " 2>&1")
      assert.are.equal(2, rc, c[1] .. ": " .. out)
      assert.is_truthy(out:find(c[2], 1, true), c[1] .. ": " .. out)
    end
  end)
end)
