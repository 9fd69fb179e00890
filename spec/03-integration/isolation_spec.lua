-- isolation_spec.lua: the real `openmesh proxy` binary keeps trouble where
-- it belongs. Out of file descriptors (ulimit -n 64 in its shell, more
-- idle clients than descriptors), calls fail with local_resources, at the
-- upstream connect or at accept, no peer's circuit opens, and the first
-- call after the pressure succeeds. A policy that overruns its budget is
-- shed after five overruns while another service keeps answering.
-- Upstream: python3 -m http.server; clients: curl and
-- tests/fixtures/fd_pressure.py.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../support/?.lua;" .. package.path

local H = require "control_helper"
local cjson = require "cjson"

local FIXTURES = here .. "../../tests/fixtures/"

local CALM = [[
return {
  kind = "traffic",
  subset = function(_, peers) return peers end,
  retries = 2,
}
]]

describe("openmesh proxy isolation, the real binary", function()
  if not H.bin or H.bin == "" then
    it("runs against OPENMESH_BIN", function()
      pending("OPENMESH_BIN is not set (make check sets it to build/bin/openmesh)")
    end)
    return
  end

  local dir, upstream_port

  -- python3 -m http.server on a free port, serving an empty directory.
  local function start_upstream()
    math.randomseed(os.time() + tonumber(tostring({}):match("0x(%x+)"), 16) % 1000)
    for _ = 1, 4 do
      local port = 30000 + math.random(0, 4000)
      os.execute("mkdir -p " .. H.q(dir .. "/www"))
      local p = H.spawn("python3 -m http.server " .. port .. " --bind 127.0.0.1 -d " ..
        H.q(dir .. "/www"), dir, "upstream" .. port)
      local up = H.wait_for(function()
        if H.readfile(p.rcfile) ~= "" then
          return "exited"
        end
        local status = H.request(dir, "GET", "http://127.0.0.1:" .. port .. "/", { max_time = 1 })
        if status == 200 then
          return "up"
        end
      end, 10)
      if up == "up" then
        return port
      end
      H.kill(p.pid, "KILL")
    end
    error("python3 -m http.server did not start")
  end

  local n_proxy = 0
  local function start_proxy(args, nofile)
    n_proxy = n_proxy + 1
    return H.start_proxy(dir, "proxy" .. n_proxy, args, { wrap = nofile and function(cmd)
      return "(ulimit -n " .. nofile .. " && exec " .. cmd .. ")"
    end })
  end

  local function call(proxy, service, headers, max_time)
    local hs = { "Host: " .. service }
    for _, h in ipairs(headers or {}) do
      hs[#hs + 1] = h
    end
    return H.request(dir, "GET", proxy.url .. "/", { headers = hs, max_time = max_time })
  end

  local function status_of(proxy)
    local status, body = H.request(dir, "GET", proxy.admin .. "/status")
    assert.equal(200, status)
    return H.json(body)
  end

  setup(function()
    dir = H.tmpdir()
    upstream_port = start_upstream()
    H.writefile(dir .. "/calm.lua", CALM)
    local inst = { { id = "py", url = "http://127.0.0.1:" .. upstream_port } }
    H.writefile(dir .. "/static.json", cjson.encode({ services = {
      svc = { instances = inst },
      hostile = { instances = inst },
    } }))
  end)

  teardown(function()
    H.kill_all()
    if dir then
      os.execute("rm -rf " .. H.q(dir))
    end
  end)

  it("out of descriptors: local_resources, circuits stay closed, then at once 200", function()
    -- one worker: descriptors are the process's, so with two a slot that
    -- one worker's accept shed frees for an instant can go to the other's
    -- upstream connect, and that call rightly succeeds; one loop makes
    -- the pressure the same for every call
    local proxy = start_proxy("--workers 1 --policy " .. H.q(dir .. "/calm.lua") ..
      " --static " .. H.q(dir .. "/static.json") .. " --circuit-failures 3", 64)
    local out = dir .. "/pressure.json"
    local _, rc = H.sh("timeout 60 python3 " .. H.q(FIXTURES .. "fd_pressure.py") .. " " ..
      proxy.port .. " 100 8 " .. H.q(out))
    assert.equal(0, rc)
    local res = H.json(H.readfile(out))
    -- the proxy answered an idle client 503 at accept: it was out of fds
    assert.is_true(res.marker)
    assert.equal(8, #res.calls)
    for i, c in ipairs(res.calls) do
      assert.equal(503, c[1], "call " .. i .. ": " .. c[2])
      assert.equal("local_resources", H.json(c[2]).reason, "call " .. i)
    end
    -- the pressure is over: no circuit opened, the next call goes through
    local status, body = call(proxy, "svc")
    assert.equal(200, status, body)
    local st = status_of(proxy)
    for _, peer in ipairs(st.services.svc.peers) do
      assert.equal("closed", peer.circuit)
      assert.equal(0, peer.failures)
    end
    assert.is_true(st.local_errors >= 8)
    local _, metrics = H.request(dir, "GET", proxy.admin .. "/metrics")
    assert.matches('openmesh_proxy_local_errors_total{errno="EMFILE"}', metrics, 1, true)
    assert.is_nil(metrics:find('openmesh_proxy_accept_shed_total{listener="proxy"} 0', 1, true))
    assert.matches('openmesh_proxy_requests_total{service="svc",outcome="local_resources"} 8',
      metrics, 1, true)
    -- logged, but at most once a second: 8 calls made 16 attempts
    local lines = select(2, H.readfile(proxy.out):gsub('"event":"proxy_local_resources"', ""))
    assert.is_true(lines >= 1 and lines < 8, "log lines: " .. lines)
  end)

  it("sheds a policy that keeps overrunning its budget, the other service answers", function()
    -- one worker: the shed is the state of one worker's policy VM, and
    -- this counts the rounds one VM takes to shed
    local proxy = start_proxy("--workers 1 --policy " .. H.q(dir .. "/calm.lua") ..
      " --service-policy hostile=" .. H.q(FIXTURES .. "hostile_policy.lua") ..
      " --static " .. H.q(dir .. "/static.json"))
    local tags = "x-tags: " .. string.rep("abcdefghijklmnopqrstuvwxyz", 315) -- 8 KiB
    for i = 1, 5 do
      local status, body = call(proxy, "hostile", { tags })
      assert.equal(500, status, body)
      local doc = H.json(body)
      assert.equal("policy_error", doc.reason)
      assert.matches("budget: ", doc.message, 1, true)
      assert.equal(200, (call(proxy, "svc")), "calm service, round " .. i)
    end
    -- shed: refused without running the policy, even a cheap request
    local status, body = call(proxy, "hostile")
    assert.equal(500, status)
    assert.matches("is shed for", H.json(body).message, 1, true)
    assert.equal(200, (call(proxy, "svc")))
    local pol = status_of(proxy).services.hostile.policy
    assert.is_true(pol.shed)
    assert.equal(5, pol.budget_trips)
    assert.equal(1, pol.sheds)
    assert.is_true(pol.shed_until_ms > 5000 and pol.shed_until_ms <= 10000)
    assert.equal(1, pol.budget_ms)
    assert.is_false(status_of(proxy).services.svc.policy.shed)
    local _, metrics = H.request(dir, "GET", proxy.admin .. "/metrics")
    assert.matches('openmesh_proxy_policy_sheds_total{service="hostile"} 1', metrics, 1, true)
    assert.matches('openmesh_proxy_policy_budget_trips_total{service="hostile"} 5', metrics, 1, true)
  end)
end)
