-- proxy_stream_spec.lua: long streams through the real `openmesh proxy`
-- binary. A Python SSE upstream (tests/fixtures/sse_upstream.py) sends
-- events for longer than the policy's deadline; curl reads them through
-- `openmesh proxy --static`. The deadline ends at the response head, so
-- every event arrives and curl exits 0; a stream that goes silent is cut
-- by the stream idle timeout, never ended cleanly (curl exit 18). Short
-- policy timeouts keep it to a few seconds; the timing bounds themselves
-- are measured in tests/test_proxy.c.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../support/?.lua;" .. package.path

local H = require "control_helper"
local cjson = require "cjson"

local PYTHON = "/usr/bin/python3"
local FIXTURE = here .. "../../tests/fixtures/sse_upstream.py"

-- A deadline far shorter than the streams; an idle timeout longer than the
-- gap between events.
local POLICY = [[
return {
  kind = "traffic",
  subset = function(_, peers) return peers end,
  deadline_ms = 300,
  stream_idle_timeout_ms = 700,
}
]]

local function executable(path)
  local _, rc = H.sh("test -x " .. H.q(path))
  return rc == 0
end

describe("openmesh proxy, long streams", function()
  if not H.bin or H.bin == "" then
    it("runs against OPENMESH_BIN", function()
      pending("OPENMESH_BIN is not set (make check sets it to build/bin/openmesh)")
    end)
    return
  end
  if not executable(PYTHON) then
    it("runs a Python SSE upstream", function()
      pending(PYTHON .. " is missing (scripts/deps installs python3)")
    end)
    return
  end

  local dir, upstream, proxy

  setup(function()
    dir = H.tmpdir()
    upstream = H.spawn(H.q(PYTHON) .. " " .. H.q(FIXTURE) .. " 0", dir, "sse")
    local port = H.wait_for(function()
      return tonumber(H.readfile(upstream.out):match("listening (%d+)"))
    end, 10)
    assert(port, "the SSE upstream did not start: " .. H.readfile(upstream.out))
    H.writefile(dir .. "/traffic.lua", POLICY)
    H.writefile(dir .. "/static.json", cjson.encode({ services = {
      sse = { instances = { { id = "sse-a", url = "http://127.0.0.1:" .. port } } },
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

  -- curl -N through the proxy: its output, exit status and wall time.
  local function stream(query)
    local t0 = H.now()
    local out, rc = H.sh(H.curl(15) .. " -sN -H 'Host: sse' " .. H.q(proxy.url .. "/events?" .. query))
    return out, rc, H.now() - t0
  end

  local function count_events(text)
    local n = 0
    for _ in text:gmatch("data: event %d+\n\n") do
      n = n + 1
    end
    return n
  end

  it("delivers every event of a stream that outlasts the deadline", function()
    -- 15 events 100 ms apart: five times the 300 ms deadline
    local out, rc, dt = stream("every_ms=100&count=15")
    assert.equal(0, rc) -- curl saw a clean end: the last chunk came
    assert.equal(15, count_events(out))
    assert.matches("id: 15\ndata: event 15\n\n", out, 1, true)
    assert.is_true(dt >= 1.4, "took " .. dt .. " s")
  end)

  it("cuts a silent stream after the idle timeout, never as a clean end", function()
    local out, rc, dt = stream("every_ms=50&count=2&hang=1")
    assert.equal(18, rc) -- curl: transfer closed with outstanding read data
    assert.equal(2, count_events(out))
    assert.is_true(dt >= 0.7, "cut after " .. dt .. " s, before the 700 ms idle timeout")
    assert.is_true(dt < 5, "took " .. dt .. " s")
    local status, body = H.request(dir, "GET", proxy.admin .. "/metrics")
    assert.equal(200, status)
    assert.matches('openmesh_proxy_streams_cut_total{service="sse",reason="idle"} 1', body, 1, true)
    status, body = H.request(dir, "GET", proxy.admin .. "/status")
    assert.equal(200, status)
    local t = H.json(body).services.sse.timeouts
    assert.equal(300, t.deadline_ms)
    assert.equal(300, t.max_deadline_ms)
    assert.equal(700, t.stream_idle_timeout_ms)
    assert.equal(cjson.null, t.per_try_timeout_ms) -- what is left of the deadline
    assert.equal(cjson.null, t.max_stream_ms)
  end)

  it("stops on SIGTERM", function()
    assert.equal(0, H.stop(proxy))
  end)
end)
