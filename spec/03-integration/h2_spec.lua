-- h2_spec.lua: HTTP/2 on the real `openmesh proxy` listener (prior
-- knowledge, h2c) in front of an HTTP/1.1 upstream
-- (tests/fixtures/body_tool.py sink), driven by real clients: curl
-- --http2-prior-knowledge, nghttp (nghttp2-client), Python's grpcio, and
-- raw frames from tests/fixtures/h2_tool.py for the rapid-reset flood.
-- The frame-level cases are in tests/test_http2_server.c.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../support/?.lua;" .. package.path

local H = require "control_helper"

local BODY_TOOL = here .. "../../tests/fixtures/body_tool.py"
local H2_TOOL = here .. "../../tests/fixtures/h2_tool.py"
local PY = "/usr/bin/python3"

local POLICY = [[
return {
  kind = "traffic",
  subset = function(_, peers) return peers end,
  deadline_ms = 10000,
}
]]

local function have(cmd)
  return os.execute("command -v " .. cmd .. " >/dev/null 2>&1") == true
end

describe("HTTP/2 through the real openmesh proxy", function()
  if not H.bin or H.bin == "" then
    it("runs against OPENMESH_BIN", function()
      pending("OPENMESH_BIN is not set (make check sets it to build/bin/openmesh)")
    end)
    return
  end
  if not io.open(PY, "r") or not have("nghttp") then
    it("runs with Debian's python3 and nghttp", function()
      pending("no " .. PY .. " or no nghttp (nghttp2-client)")
    end)
    return
  end

  local dir, sink, proxy

  local function metric(name)
    local out = H.sh(H.curl(5) .. " -s " .. proxy.admin .. "/metrics")
    return tonumber(out:match("\n" .. name .. " (%d+)")) or 0
  end

  setup(function()
    dir = H.tmpdir()
    H.writefile(dir .. "/traffic.lua", POLICY)
    sink = H.spawn(H.q(PY) .. " " .. H.q(BODY_TOOL) .. " sink 0", dir, "sink")
    sink.port = H.wait_for(function()
      return tonumber(H.readfile(sink.out):match("listening (%d+)"))
    end, 10)
    assert(sink.port, "the sink did not start: " .. H.readfile(sink.out))
    -- by hand: cjson would encode the empty instances as an object
    H.writefile(dir .. "/static.json", string.format(
      '{"services": {"up": {"instances": [{"id": "sink", "url": "http://127.0.0.1:%d"}]},' ..
      ' "nobody": {"instances": []}}}', sink.port))
    -- one worker: the admin's counters are the listener's
    proxy = H.start_proxy(dir, "proxy", "--workers 1 --policy " .. H.q(dir .. "/traffic.lua") ..
      " --static " .. H.q(dir .. "/static.json"))
  end)

  teardown(function()
    H.kill_all()
    if dir then
      os.execute("rm -rf " .. H.q(dir))
    end
  end)

  it("answers curl --http2-prior-knowledge from an HTTP/1.1 upstream", function()
    local out = H.sh(H.curl(10) .. " -s --http2-prior-knowledge -H 'Host: up' -o " ..
      H.q(dir .. "/dl") .. " -w '%{http_version} %{http_code} %{size_download}' " ..
      proxy.url .. "/download/300000")
    assert.are.equal("2 200 300000", out)
    -- the same listener still speaks HTTP/1.1
    out = H.sh(H.curl(10) .. " -s -H 'Host: up' -o /dev/null -w '%{http_version} %{http_code}' " ..
      proxy.url .. "/download/10")
    assert.are.equal("1.1 200", out)
  end)

  it("streams a request body to the upstream whole", function()
    local file = dir .. "/upload"
    H.sh(H.q(PY) .. " " .. H.q(BODY_TOOL) .. " gen 1000000 " .. H.q(dir .. "/upload.sha") ..
      " > " .. H.q(file))
    local want = H.readfile(dir .. "/upload.sha"):match("%d+ (%x+)")
    local out = H.sh(H.curl(20) .. " -s --http2-prior-knowledge -H 'Host: up' --data-binary @" ..
      H.q(file) .. " " .. proxy.url .. "/upload")
    local len, sha = out:match("(%d+) (%x+)")
    assert.are.equal("1000000", len, "sink said: " .. out)
    assert.are.equal(want, sha)
  end)

  it("serves 20 multiplexed streams of one nghttp connection", function()
    local urls = {}
    for i = 1, 20 do
      urls[#urls + 1] = proxy.url .. "/download/" .. (1000 * i)
    end
    local out = H.sh("timeout 20 nghttp -nv -H 'host: up' " .. table.concat(urls, " ") .. " 2>&1")
    local ok = select(2, out:gsub(":status: 200", ""))
    assert.are.equal(20, ok, out:sub(1, 2000))
    local conns = select(2, out:gsub("send SETTINGS frame <length=%d+, flags=0x00", ""))
    assert.are.equal(1, conns)
  end)

  it("answers a header list over the limit 431 on the stream", function()
    local big = string.rep("a", 20000)
    local out = H.sh(H.curl(10) .. " -s --http2-prior-knowledge -H 'Host: up' -H 'x-big: " .. big ..
      "' -o /dev/null -w '%{http_code}' " .. proxy.url .. "/download/10")
    assert.are.equal("431", out)
  end)

  it("sends GOAWAY ENHANCE_YOUR_CALM to a rapid-reset flood and stays up", function()
    local before = metric("openmesh_proxy_h2_rapid_reset_total")
    local out = H.sh(H.q(PY) .. " " .. H.q(H2_TOOL) .. " flood 127.0.0.1 " .. proxy.port ..
      " 2000 up")
    assert.are.equal("goaway 11", out:match("[^\n]+"))
    assert.are.equal(before + 1, metric("openmesh_proxy_h2_rapid_reset_total"))
    assert.is_true(H.alive(proxy.pid))
    out = H.sh(H.curl(10) .. " -s --http2-prior-knowledge -H 'Host: up' -o /dev/null " ..
      "-w '%{http_code}' " .. proxy.url .. "/download/100")
    assert.are.equal("200", out)
  end)

  it("serves h2 over TLS when ALPN selects it, HTTP/1.1 otherwise", function()
    local certs = dir .. "/certs"
    assert.is_true(os.execute("bash " .. H.q(here .. "../../tests/fixtures/tls_certs.sh") ..
      " " .. H.q(certs)) == true)
    -- H.start_proxy waits for an http:// url: this one says https://
    local tp = H.spawn(H.q(H.bin) .. " proxy --listen 127.0.0.1:0 --admin 127.0.0.1:0 " ..
      "--workers 1 --policy " .. H.q(dir .. "/traffic.lua") .. " --static " ..
      H.q(dir .. "/static.json") .. " --tls-cert " .. H.q(certs .. "/server.pem") ..
      " --tls-key " .. H.q(certs .. "/server.key"), dir, "proxy-tls")
    local port = H.wait_for(function()
      return tonumber(H.readfile(tp.out):match('"url":"https://127%.0%.0%.1:(%d+)"'))
    end, 10)
    assert(port, "the TLS proxy did not start: " .. H.readfile(tp.out))
    local url = "https://127.0.0.1:" .. port .. "/download/200000"
    local out = H.sh(H.curl(10) .. " -s --cacert " .. H.q(certs .. "/ca.pem") ..
      " --http2 -H 'Host: up' -o /dev/null -w '%{http_version} %{http_code} %{size_download}' " .. url)
    assert.are.equal("2 200 200000", out)
    out = H.sh(H.curl(10) .. " -s --cacert " .. H.q(certs .. "/ca.pem") ..
      " --http1.1 -H 'Host: up' -o /dev/null -w '%{http_version} %{http_code}' " .. url)
    assert.are.equal("1.1 200", out)
  end)

  it("refuses a gRPC call to a service without peers with UNAVAILABLE", function()
    if os.execute(H.q(PY) .. " -c 'import grpc' 2>/dev/null") ~= true then
      pending("python3-grpcio is not installed")
      return
    end
    local out = H.sh(H.q(PY) .. " " .. H.q(H2_TOOL) .. " grpc 127.0.0.1 " .. proxy.port ..
      " nobody 2>/dev/null")
    assert.are.equal("UNAVAILABLE the service has no peers", out:match("[^\n]+"))
    -- Trailers-Only: status 200, grpc-status in the only HEADERS
    local head = H.sh(H.curl(10) .. " -s --http2-prior-knowledge -H 'Host: nobody' " ..
      "-H 'content-type: application/grpc' -D - -o /dev/null " .. proxy.url .. "/pkg.Svc/Call")
    assert.truthy(head:match("^HTTP/2 200"), head)
    assert.truthy(head:match("grpc%-status: 14"), head)
    assert.truthy(head:match("grpc%-message: the service has no peers"), head)
  end)
end)
