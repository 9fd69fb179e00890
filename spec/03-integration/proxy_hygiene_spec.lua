-- proxy_hygiene_spec.lua: the real `openmesh proxy` binary, driven with
-- curl, in front of a real upstream that echoes what it received
-- (tests/fixtures/echo_upstream.py) and a peer whose port is closed. The
-- end-to-end checks of retries by send phase and of what the proxy
-- forwards; the thorough cases are in tests/test_proxy.c.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../support/?.lua;" .. package.path

local H = require "control_helper"
local cjson = require "cjson"

local ECHO = here .. "../../tests/fixtures/echo_upstream.py"

local POLICY = [[
return {
  kind = "traffic",
  subset = function(_, peers) return peers end,
  retries = 2,
}
]]

describe("openmesh proxy forwarding and pre-send retries, end to end", function()
  if not H.bin or H.bin == "" then
    it("runs against OPENMESH_BIN", function()
      pending("OPENMESH_BIN is not set (make check sets it to build/bin/openmesh)")
    end)
    return
  end
  if not H.sh("command -v python3 >/dev/null && echo yes"):find("yes", 1, true) then
    it("runs with python3", function()
      pending("python3 is not installed (scripts/deps installs it)")
    end)
    return
  end

  local dir, proxy, echo_port, dead_port

  -- Spawn cmd and wait for the first capture of pattern in its output.
  local function start(cmd, name, pattern)
    local p = H.spawn(cmd, dir, name)
    local v = H.wait_for(function()
      local m = H.readfile(p.out):match(pattern)
      if m then
        return m
      end
      if H.readfile(p.rcfile) ~= "" then
        return false
      end
    end, 10)
    assert(v, name .. " did not start: " .. H.readfile(p.out))
    return p, v
  end

  local function call(method, service, opts)
    opts = opts or {}
    local headers = { "Host: " .. service }
    for _, h in ipairs(opts.headers or {}) do
      headers[#headers + 1] = h
    end
    return H.request(dir, method, proxy.url .. (opts.path or "/"),
      { headers = headers, body = opts.body })
  end

  -- What the upstream received: {name (lower-cased) = {values...}}.
  local function seen(body)
    local out = {}
    for _, kv in ipairs(H.json(body).headers) do
      local k = kv[1]:lower()
      out[k] = out[k] or {}
      table.insert(out[k], kv[2])
    end
    return out
  end

  local function show(h)
    local lines = {}
    for k, vs in pairs(h) do
      lines[#lines + 1] = k .. ": " .. table.concat(vs, " | ")
    end
    table.sort(lines)
    return table.concat(lines, "\n")
  end

  setup(function()
    dir = H.tmpdir()
    local _, port = start("python3 " .. H.q(ECHO) ..
      " --header 'Proxy-Authenticate: Basic realm=\"upstream\"'", "echo", "listening (%d+)")
    echo_port = tonumber(port)
    -- a port nothing listens on: bound by the kernel's choice, then closed
    dead_port = tonumber(H.sh("python3 -c 'import socket; s = socket.socket(); " ..
      "s.bind((\"127.0.0.1\", 0)); print(s.getsockname()[1]); s.close()'"):match("%d+"))
    H.writefile(dir .. "/traffic.lua", POLICY)
    H.writefile(dir .. "/static.json", cjson.encode({ services = {
      orders = { instances = {
        { id = "dead", url = "http://127.0.0.1:" .. dead_port },
        { id = "live", url = "http://127.0.0.1:" .. echo_port } } },
      echo = { instances = { { id = "live", url = "http://127.0.0.1:" .. echo_port } } },
      pair = { instances = {
        { id = "one", url = "http://127.0.0.1:" .. echo_port },
        { id = "two", url = "http://127.0.0.1:" .. echo_port } } },
    } }))
    local p, ports = start(H.q(H.bin) .. " proxy --listen 127.0.0.1:0 --admin 127.0.0.1:0" ..
      " --policy " .. H.q(dir .. "/traffic.lua") .. " --static " .. H.q(dir .. "/static.json"),
      "proxy", '"event":"proxy_listening","url":"(http://127%.0%.0%.1:%d+","admin":"http://127%.0%.0%.1:%d+)"')
    local a, b = ports:match("(http://[%d.:]+)\",\"admin\":\"(http://[%d.:]+)")
    proxy = { pid = p.pid, url = a, admin = b }
  end)

  teardown(function()
    H.kill_all()
    if dir then
      os.execute("rm -rf " .. H.q(dir))
    end
  end)

  it("sends 100 of 100 POSTs without Idempotency-Key past a refused peer", function()
    local ok, live = 0, 0
    for i = 1, 100 do
      local status, body, headers = call("POST", "orders", { body = '{"n":' .. i .. "}" })
      if status == 200 then
        ok = ok + 1
      else
        print("POST " .. i .. ": " .. status .. " " .. body)
      end
      if headers["x-openmesh-peer"] == "live" then
        live = live + 1
      end
    end
    local _, st = H.request(dir, "GET", proxy.admin .. "/status")
    local calls = H.json(st).services.orders.calls
    print(string.format("%d of 100 POSTs succeeded (%d from the live peer); retries: %d pre-send, %d post-send",
      ok, live, calls.retries_by_phase.pre_send, calls.retries_by_phase.post_send))
    assert.equal(100, ok)
    assert.equal(100, live)
    assert.is_true(calls.retries_by_phase.pre_send >= 1, "the dead peer was never tried")
    assert.equal(0, calls.retries_by_phase.post_send)
    local _, metrics = H.request(dir, "GET", proxy.admin .. "/metrics")
    assert.matches(string.format('openmesh_proxy_retries_total{service="orders",phase="pre_send"} %d',
      calls.retries_by_phase.pre_send), metrics, 1, true)
  end)

  it("keeps its own fields whatever the client's Connection names", function()
    local status, body = call("GET", "echo", { headers = {
      "Connection: x-forwarded-for, via, x-request-id, x-openmesh-deadline-ms",
      "X-Forwarded-For: 10.9.9.9", "Via: 1.0 client", "x-request-id: theirs", "x-hop: 1",
      "Connection: x-hop", "Proxy-Authorization: Basic b206cGFzcw==" } })
    assert.equal(200, status)
    local h = seen(body)
    local all = show(h)
    assert.same({ "127.0.0.1" }, h["x-forwarded-for"], all)
    assert.same({ "1.1 openmesh" }, h["via"], all)
    assert.is_truthy(h["x-request-id"] and #h["x-request-id"][1] == 32, all)
    assert.is_truthy(h["x-openmesh-deadline-ms"], all)
    assert.is_nil(h["x-hop"], all)
    assert.is_nil(h["connection"] and h["connection"][1]:find("x%-"), all)
    assert.is_nil(h["proxy-authorization"], all)
    assert.is_truthy(h["traceparent"] and #h["traceparent"][1] == 55, all)
  end)

  it("does not retry a POST whose Idempotency-Key the client's Connection strips", function()
    -- two peers (one process) answering 503: a key-less POST goes once
    local status, body, headers = call("POST", "pair", { path = "/status/503", body = "{}",
      headers = { "Idempotency-Key: k-1", "Connection: idempotency-key" } })
    assert.equal(503, status)
    assert.equal("1", headers["x-openmesh-attempts"])
    assert.is_nil(seen(body)["idempotency-key"], show(seen(body)))
    -- the same key, not named: forwarded, and the POST is retried
    status, body, headers = call("POST", "pair", { path = "/status/503", body = "{}",
      headers = { "Idempotency-Key: k-2" } })
    assert.equal(503, status)
    assert.equal("2", headers["x-openmesh-attempts"])
    assert.same({ "k-2" }, seen(body)["idempotency-key"])
  end)

  it("passes a valid traceparent through and answers without Proxy-Authenticate", function()
    local tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    local status, body, headers = call("GET", "echo", { headers = {
      "traceparent: " .. tp, "tracestate: congo=t61rcWkgMzE" } })
    assert.equal(200, status)
    local h = seen(body)
    assert.same({ tp }, h["traceparent"], show(h))
    assert.same({ "congo=t61rcWkgMzE" }, h["tracestate"], show(h))
    assert.is_nil(headers["proxy-authenticate"])
    assert.equal("application/json", headers["content-type"])
  end)
end)
