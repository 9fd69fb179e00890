-- grpc_spec.lua: gRPC and HTTP/2 upstreams through the real `openmesh
-- proxy`: Python grpcio servers (tests/fixtures/grpc_tool.py, generic
-- handlers over raw bytes) behind a service whose policy says
-- protocol = "h2c", called by grpcio clients through the proxy: unary,
-- server, client and bidirectional streaming, deadline propagation,
-- status-aware retries (gRPC proposal A6) and what is never retried.
-- Then an HTTP/1.1 caller (curl) to an HTTP/2 upstream: a second proxy
-- whose listener speaks h2c, in front of an HTTP/1.1 sink.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../support/?.lua;" .. package.path

local H = require "control_helper"

local GRPC_TOOL = here .. "../../tests/fixtures/grpc_tool.py"
local BODY_TOOL = here .. "../../tests/fixtures/body_tool.py"
local PY = "/usr/bin/python3"

local function policy(deadline_ms)
  return ([[
return {
  kind = "traffic",
  subset = function(_, peers) return peers end,
  -- req.grpc: the call's service and method, from :path
  authorize = function(req)
    if req.grpc and req.grpc.method == "Forbidden" then
      return false, "method " .. req.grpc.service .. "/Forbidden is closed"
    end
    return true
  end,
  deadline_ms = %d,
  retries = 2,
  protocol = "h2c",
}
]]):format(deadline_ms)
end

describe("gRPC through the real openmesh proxy to HTTP/2 upstreams", function()
  if not H.bin or H.bin == "" then
    it("runs against OPENMESH_BIN", function()
      pending("OPENMESH_BIN is not set (make check sets it to build/bin/openmesh)")
    end)
    return
  end
  if os.execute(H.q(PY) .. " -c 'import grpc' 2>/dev/null") ~= true then
    it("runs with Debian's python3-grpcio", function()
      pending("python3-grpcio is not installed")
    end)
    return
  end

  local dir, proxy, ports = nil, nil, {}

  local function serve(name, mode)
    local s = H.spawn(H.q(PY) .. " " .. H.q(GRPC_TOOL) .. " serve " .. name .. " " .. (mode or "ok"),
      dir, "grpc-" .. name)
    local port = H.wait_for(function()
      return tonumber(H.readfile(s.out):match("listening (%d+)"))
    end, 15)
    assert(port, "the gRPC server " .. name .. " did not start: " .. H.readfile(s.out))
    ports[name] = port
  end

  -- one call through the proxy to service svc; the JSON line it prints
  local function call(svc, case, args)
    local out = H.sh("timeout 60 " .. H.q(PY) .. " " .. H.q(GRPC_TOOL) .. " call 127.0.0.1:" ..
      proxy.port .. "@" .. svc .. " " .. case .. " " .. (args or "") .. " 2>&1")
    local line = out:match("{.*}")
    assert(line, "the client printed no result: " .. out)
    return H.json(line), line
  end

  local function metric(pattern)
    local out = H.sh(H.curl(5) .. " -s " .. proxy.admin .. "/metrics")
    return tonumber(out:match(pattern)) or 0
  end

  setup(function()
    dir = H.tmpdir()
    serve("a")
    serve("b")
    serve("down", "unavailable")
    H.writefile(dir .. "/traffic.lua", policy(10000))
    H.writefile(dir .. "/static.json", string.format(
      '{"services": {"echo": {"instances": [{"id": "a", "url": "http://127.0.0.1:%d"}]},' ..
      ' "half": {"instances": [{"id": "a", "url": "http://127.0.0.1:%d"},' ..
      ' {"id": "down", "url": "http://127.0.0.1:%d"}]},' ..
      ' "both": {"instances": [{"id": "a", "url": "http://127.0.0.1:%d"},' ..
      ' {"id": "b", "url": "http://127.0.0.1:%d"}]}, "nobody": {"instances": []}}}',
      ports.a, ports.a, ports.down, ports.a, ports.b))
    proxy = H.start_proxy(dir, "proxy", "--workers 1 --policy " .. H.q(dir .. "/traffic.lua") ..
      " --static " .. H.q(dir .. "/static.json"))
  end)

  teardown(function()
    H.kill_all()
    if dir then
      os.execute("rm -rf " .. H.q(dir))
    end
  end)

  it("carries a unary call and says protocol h2 in /status", function()
    local r, line = call("echo", "unary")
    assert.are.equal("OK", r.code, line)
    assert.truthy(r.reply:match("^a|%-?%d+|hello$"), line)
    local st = H.json(H.sh(H.curl(5) .. " -s " .. proxy.admin .. "/status"))
    assert.are.equal("h2", st.services.echo.protocol)
    -- the HTTP/2 connection stays for the next call, and /status sees it
    assert.are.equal(1, st.services.echo.upstream_pool.idle)
    r, line = call("echo", "unary")
    assert.are.equal("OK", r.code, line)
    st = H.json(H.sh(H.curl(5) .. " -s " .. proxy.admin .. "/status"))
    assert.are.equal(1, st.services.echo.upstream_pool.connections_new)
    assert.are.equal(1, st.services.echo.upstream_pool.connections_reused)
  end)

  it("carries server, client and bidirectional streaming calls", function()
    local r, line = call("echo", "server_stream", "50")
    assert.are.equal("OK", r.code, line)
    assert.are.equal(50, #r.replies, line)
    assert.are.equal("a:49", r.replies[50], line)
    r, line = call("echo", "client_stream", "200 5000")
    assert.are.equal("OK", r.code, line)
    assert.are.equal("a|200|1000000", r.reply, line)
    r, line = call("echo", "bidi", "1000")
    assert.are.equal("OK", r.code, line)
    assert.are.equal(1000, r.count, line)
    assert.are.equal("a:m999", r.last, line)
  end)

  it("propagates the caller's deadline as what is left of it", function()
    -- the caller allows 2.5 s: the upstream's deadline is at most that
    local r, line = call("echo", "unary", "2.5")
    assert.are.equal("OK", r.code, line)
    local ms = tonumber(r.reply:match("^a|(%-?%d+)|"))
    assert.is_true(ms > 0 and ms <= 2600, "the upstream saw " .. tostring(ms) .. " ms left")
  end)

  it("sends no deadline upstream when the caller set none", function()
    -- the proxy's deadline bounds the wait for the head, not the stream:
    -- a caller without grpc-timeout keeps a stream without one
    local r, line = call("echo", "unary", "none")
    assert.are.equal("OK", r.code, line)
    assert.are.equal("a|-1|hello", r.reply, line)
  end)

  it("retries a Trailers-Only UNAVAILABLE on the other peer", function()
    local before = metric('openmesh_proxy_retries_total{service="half",phase="post_send"} (%d+)')
    for i = 1, 20 do
      local r, line = call("half", "unary")
      assert.are.equal("OK", r.code, "call " .. i .. ": " .. line)
      assert.truthy(r.reply:match("^a|"), line)
    end
    local retries = metric('openmesh_proxy_retries_total{service="half",phase="post_send"} (%d+)') - before
    -- power of two choices over two peers sends about half of them to
    -- the one that refuses: each of those was retried once
    assert.is_true(retries >= 1 and retries <= 20, "retries: " .. retries)
  end)

  it("relays UNAVAILABLE when every peer answers it", function()
    local r, line = call("half", "unavailable")
    assert.are.equal("UNAVAILABLE", r.code, line)
    assert.truthy(r.details:match("refuses"), line)
  end)

  it("never retries a call that answered messages before failing", function()
    local before = metric('openmesh_proxy_attempts_total{service="both"} (%d+)')
    local r, line = call("both", "fail_after_one")
    assert.are.equal("UNAVAILABLE", r.code, line)
    assert.are.equal(1, #r.replies, line)
    local attempts = metric('openmesh_proxy_attempts_total{service="both"} (%d+)') - before
    assert.are.equal(1, attempts)
  end)

  it("keeps a bidirectional stream past the proxy's deadline", function()
    -- a service whose deadline is 1 s: the stream lasts 3 s
    H.writefile(dir .. "/short.lua", policy(1000))
    local sp = H.start_proxy(dir, "proxy-short", "--workers 1 --policy " ..
      H.q(dir .. "/short.lua") .. " --static " .. H.q(dir .. "/static.json"))
    local out = H.sh("timeout 60 " .. H.q(PY) .. " " .. H.q(GRPC_TOOL) .. " call 127.0.0.1:" ..
      sp.port .. "@echo slow_bidi 6 0.5 2>&1")
    local r = H.json(out:match("{.*}") or "{}")
    assert.are.equal("OK", r.code, out)
    assert.are.equal(6, r.count, out)
  end)

  it("shows req.grpc to the policy and counts calls per method and status", function()
    local r, line = call("echo", "method", "Forbidden")
    assert.are.equal("PERMISSION_DENIED", r.code, line)
    assert.are.equal("method echo.Echo/Forbidden is closed", r.details, line)
    local m = H.sh(H.curl(5) .. " -s " .. proxy.admin .. "/metrics")
    local function count(svc, method, status)
      return tonumber(m:match('openmesh_proxy_grpc_requests_total{service="' .. svc ..
        '",grpc_method="echo%.Echo/' .. method .. '",grpc_status="' .. status .. '"} (%d+)')) or 0
    end
    assert.are.equal(1, count("echo", "Forbidden", 7))
    -- the four unary calls to echo above: every one OK
    assert.are.equal(4, count("echo", "Unary", 0))
    -- UNAVAILABLE from every peer: what the caller saw
    assert.are.equal(1, count("half", "Unavailable", 14))
    -- answered one message, then failed: the status of its trailers
    assert.are.equal(1, count("both", "FailAfterOne", 14))
    assert.truthy(m:match('openmesh_proxy_grpc_request_duration_seconds_count{service="echo",' ..
      'grpc_method="echo%.Echo/Bidi"} 1'), "no duration for the bidi call")
  end)

  it("refuses an upgrade to an HTTP/2 service with a reason", function()
    local out = H.sh(H.curl(10) .. " -s -H 'Host: echo' -H 'Connection: upgrade' " ..
      "-H 'Upgrade: websocket' -w ' %{http_code}' " .. proxy.url .. "/ws")
    assert.are.equal('{"reason":"upgrade_not_allowed","message":"upgrade to \'websocket\' ' ..
      'cannot reach this service: its peers are spoken to over HTTP/2 (protocol)"}\n 403', out)
  end)

  it("keeps per-method series bounded: past 63 methods they count as other", function()
    -- refusals (no peers) count too: 80 streams of one nghttp connection
    -- (curl 7.88 cannot reuse a prior-knowledge connection: curl#10634)
    local urls = {}
    for i = 1, 80 do
      urls[#urls + 1] = proxy.url .. "/pkg.Svc/M" .. i
    end
    H.sh("timeout 20 nghttp -n -H 'host: nobody' -H 'content-type: application/grpc' " ..
      table.concat(urls, " ") .. " 2>&1")
    local m = H.sh(H.curl(5) .. " -s " .. proxy.admin .. "/metrics")
    local named, other = 0, 0
    for method, n in m:gmatch('openmesh_proxy_grpc_requests_total{service="nobody",' ..
      'grpc_method="([^"]+)",grpc_status="14"} (%d+)') do
      if method == "other" then
        other = tonumber(n)
      else
        named = named + 1
      end
    end
    assert.are.equal(63, named)
    assert.are.equal(17, other)
  end)

  it("carries an HTTP/1.1 caller to an HTTP/2 upstream, bodies both ways", function()
    -- the upstream: a second proxy, whose listener speaks h2c, in front of
    -- an HTTP/1.1 sink
    local sink = H.spawn(H.q(PY) .. " " .. H.q(BODY_TOOL) .. " sink 0", dir, "sink")
    local sport = H.wait_for(function()
      return tonumber(H.readfile(sink.out):match("listening (%d+)"))
    end, 10)
    assert(sport, "the sink did not start")
    H.writefile(dir .. "/inner.json", string.format(
      '{"services": {"up": {"instances": [{"id": "sink", "url": "http://127.0.0.1:%d"}]}}}', sport))
    H.writefile(dir .. "/plain.lua", [[
return { kind = "traffic", subset = function(_, peers) return peers end }
]])
    local inner = H.start_proxy(dir, "inner", "--workers 1 --policy " .. H.q(dir .. "/plain.lua") ..
      " --static " .. H.q(dir .. "/inner.json"))
    H.writefile(dir .. "/outer.json", string.format(
      '{"services": {"up": {"instances": [{"id": "inner", "url": "http://127.0.0.1:%d"}]}}}',
      inner.port))
    local outer = H.start_proxy(dir, "outer", "--workers 1 --policy " ..
      H.q(dir .. "/traffic.lua") .. " --static " .. H.q(dir .. "/outer.json"))
    local out = H.sh(H.curl(20) .. " -s -H 'Host: up' -o /dev/null -w '%{http_version} %{http_code} " ..
      "%{size_download}' " .. outer.url .. "/download/3000000")
    assert.are.equal("1.1 200 3000000", out)
    local file = dir .. "/upload"
    H.sh(H.q(PY) .. " " .. H.q(BODY_TOOL) .. " gen 2000000 " .. H.q(dir .. "/upload.sha") ..
      " > " .. H.q(file))
    local want = H.readfile(dir .. "/upload.sha"):match("%d+ (%x+)")
    out = H.sh(H.curl(20) .. " -s -H 'Host: up' --data-binary @" .. H.q(file) .. " " ..
      outer.url .. "/upload")
    local len, sha = out:match("(%d+) (%x+)")
    assert.are.equal("2000000", len, "sink said: " .. out)
    assert.are.equal(want, sha)
    -- an HTTP/2 caller to the same HTTP/2 upstream: curl, and 20
    -- multiplexed streams of one nghttp connection
    out = H.sh(H.curl(20) .. " -s --http2-prior-knowledge -H 'Host: up' -o /dev/null " ..
      "-w '%{http_version} %{http_code} %{size_download}' " .. outer.url .. "/download/1000000")
    assert.are.equal("2 200 1000000", out)
    local urls = {}
    for i = 1, 20 do
      urls[#urls + 1] = outer.url .. "/download/" .. (1000 * i)
    end
    out = H.sh("timeout 20 nghttp -n -s -H 'host: up' " .. table.concat(urls, " ") .. " 2>&1")
    local ok = select(2, out:gsub("ms%s+200%s+[%d.]+K? /download/", ""))
    -- the inner proxy served all of those as HTTP/2 streams
    local m = H.sh(H.curl(5) .. " -s " .. inner.admin .. "/metrics")
    local streams = tonumber(m:match("\nopenmesh_proxy_h2_streams_total (%d+)")) or 0
    assert.is_true(streams >= 23, "h2 streams at the inner proxy: " .. streams .. "\n" .. out)
    assert.are.equal(20, ok, out)
  end)
end)
