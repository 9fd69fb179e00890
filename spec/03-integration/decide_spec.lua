-- decide_spec.lua: per-request decisions (a traffic policy's decide(req))
-- through the real `openmesh proxy` binary, driven with curl, in front of
-- a real upstream that echoes what it received and can answer late
-- (tests/fixtures/echo_upstream.py /sleep/MS, /status/NNN). The checks of
-- the answer's shape are in spec/02-policy/decide_spec.lua.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../support/?.lua;" .. package.path

local H = require "control_helper"
local cjson = require "cjson"

local ECHO = here .. "../../tests/fixtures/echo_upstream.py"

-- POST gets 300 ms, GET the service's 5 s (the caller may ask up to the
-- service's max_deadline_ms of 8 s); a payment (X-Payment) is never
-- retried; /long asks for more than max_deadline_ms allows; every call loses its Cookie
-- and gains X-Tenant from the caller's X-Org.
local POLICY = [[
return {
  kind = "traffic",
  deadline_ms = 5000,
  max_deadline_ms = 8000,
  per_try_timeout_ms = 8000,
  retries = 2,
  subset = function(_, peers) return peers end,
  decide = function(req)
    if req.headers["x-bad"] then
      return { retries = -1 }
    end
    local d = { headers = { cookie = false, ["x-tenant"] = req.headers["x-org"] or "none" } }
    if req.method == "POST" then
      d.deadline_ms = 300
    end
    if req.headers["x-payment"] then
      d.retries = 0
    end
    if req.path:find("^/long") then
      d.deadline_ms = 3600000
    end
    return d
  end,
  examples = {
    { req = { method = "POST", path = "/orders" },
      expect_decision = { deadline_ms = 300, headers = { cookie = false, ["x-tenant"] = "none" } } },
    { req = { path = "/pay", headers = { ["x-org"] = "acme", ["x-payment"] = "1" } },
      expect_decision = { retries = 0, headers = { cookie = false, ["x-tenant"] = "acme" } } },
  },
}
]]

describe("openmesh proxy per-request decisions, end to end", function()
  if not H.bin or H.bin == "" then
    it("runs against OPENMESH_BIN", function()
      pending("OPENMESH_BIN is not set (make check sets it to build/bin/openmesh)")
    end)
    return
  end

  local dir, proxy

  local function call(method, path, headers, max_time)
    local hs = { "Host: orders" }
    for _, h in ipairs(headers or {}) do
      hs[#hs + 1] = h
    end
    local t0 = H.now()
    local status, body, rh = H.request(dir, method, proxy.url .. path,
      { headers = hs, body = method == "POST" and "{}" or nil, max_time = max_time })
    return status, body, rh, H.now() - t0
  end

  setup(function()
    dir = H.tmpdir()
    local echo = H.spawn("python3 " .. H.q(ECHO), dir, "echo")
    local port = H.wait_for(function()
      return tonumber(H.readfile(echo.out):match("listening (%d+)"))
    end, 10)
    assert(port, "echo_upstream did not start: " .. H.readfile(echo.out))
    H.writefile(dir .. "/traffic.lua", POLICY)
    H.writefile(dir .. "/static.json", cjson.encode({ services = {
      orders = { instances = {
        { id = "one", url = "http://127.0.0.1:" .. port },
        { id = "two", url = "http://127.0.0.1:" .. port } } },
    } }))
    proxy = H.start_proxy(dir, "proxy", "--policy " .. H.q(dir .. "/traffic.lua") ..
      " --static " .. H.q(dir .. "/static.json"))
  end)

  teardown(function()
    H.kill_all()
    if dir then
      os.execute("rm -rf " .. H.q(dir))
    end
  end)

  it("gives a POST the decision's deadline and a GET the service's", function()
    local status, _, _, took = call("POST", "/sleep/1500")
    assert.are.equal(504, status, "POST past its 300 ms decision")
    assert.is_true(took < 1.2, ("the POST took %.3f s, expected about 0.3 s"):format(took))
    status, _, _, took = call("GET", "/sleep/1500")
    assert.are.equal(200, status, "GET within the service's 5 s deadline")
    assert.is_true(took >= 1.4, ("the GET took %.3f s, expected about 1.5 s"):format(took))
  end)

  it("does not let a caller's deadline header raise the decision's", function()
    local status, _, _, took = call("POST", "/sleep/1500", { "X-Openmesh-Deadline-Ms: 7000" })
    assert.are.equal(504, status, "POST asking 7000 ms over a 300 ms decision")
    assert.is_true(took < 1.2, ("took %.3f s, expected about 0.3 s"):format(took))
    -- a caller may still shorten it
    status, _, _, took = call("GET", "/sleep/1500", { "X-Openmesh-Deadline-Ms: 200" })
    assert.are.equal(504, status, "GET shortened to 200 ms by its caller")
    assert.is_true(took < 1.2, ("took %.3f s, expected about 0.2 s"):format(took))
  end)

  it("caps a decision's deadline at max_deadline_ms", function()
    -- /long asks for an hour; the service's max_deadline_ms is 8 s, so the
    -- upstream sees a deadline of at most 8000 ms
    local status, body = call("GET", "/long")
    assert.are.equal(200, status, body)
    local got
    for _, kv in ipairs(H.json(body).headers) do
      if kv[1]:lower() == "x-openmesh-deadline-ms" then
        got = tonumber(kv[2])
      end
    end
    assert.is_truthy(got, "the upstream got no x-openmesh-deadline-ms: " .. body)
    assert.is_true(got <= 8000 and got > 7000, ("the upstream saw a deadline of %s ms, expected (7000, 8000]"):format(got))
  end)

  it("retries a failing GET by default and never one the decision forbids", function()
    local _, _, rh = call("GET", "/status/503")
    -- a retry goes to a peer not yet tried: two peers, two attempts
    assert.are.equal("2", rh["x-openmesh-attempts"], "a 503 retried on the other peer")
    _, _, rh = call("GET", "/status/503", { "X-Payment: 1" })
    assert.are.equal("1", rh["x-openmesh-attempts"], "a 503 for a payment (retries = 0)")
  end)

  it("answers a bad decision with 500, a request id and the policy_answer outcome", function()
    local status, body, rh = call("GET", "/", { "X-Bad: 1" })
    assert.are.equal(500, status, body)
    assert.is_truthy(body:find("decide returned retries = -1", 1, true), body)
    assert.is_truthy(rh["x-request-id"], "no x-request-id on the 500")
    local _, metrics = H.request(dir, "GET", proxy.admin .. "/metrics")
    assert.is_truthy(metrics:find('outcome="policy_answer"} 1', 1, true),
      "no policy_answer count in:\n" .. (metrics:match("[^\n]*policy_answer[^\n]*") or metrics:sub(1, 400)))
  end)

  it("sets and removes the request headers the decision names", function()
    local status, body = call("GET", "/", { "Cookie: session=secret", "X-Org: acme" })
    assert.are.equal(200, status, body)
    local seen = {}
    for _, kv in ipairs(H.json(body).headers) do
      seen[kv[1]:lower()] = kv[2]
    end
    assert.is_nil(seen.cookie, "the upstream got the Cookie: " .. body)
    assert.are.equal("acme", seen["x-tenant"], body)
  end)
end)
