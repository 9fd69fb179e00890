-- websocket_spec.lua: a real WebSocket client and server (Debian's
-- python3-websockets, tests/fixtures/ws_echo.py and ws_client.py) through
-- the real `openmesh proxy --static` binary: 1,000 messages echoed, a
-- pause longer than the policy's deadline_ms in the middle (a tunnel is a
-- committed stream, bounded by the idle timeout, not by the deadline),
-- and a clean close that both ends see as 1000. The finer properties
-- (half-close, idle cut, refusals, h2c, non-101 answers) are in
-- tests/test_proxy.c.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../support/?.lua;" .. package.path

local H = require "control_helper"
local cjson = require "cjson"

local PYTHON = "/usr/bin/python3" -- Debian's, with python3-websockets
local FIXTURES = here .. "../../tests/fixtures/"

-- A deadline far shorter than the exchange, an idle timeout longer than
-- the pause: only the idle timeout may bound the tunnel.
local POLICY = [[
return {
  kind = "traffic",
  subset = function(_, peers) return peers end,
  deadline_ms = 300,
  stream_idle_timeout_ms = 3000,
}
]]

local function has_websockets()
  local _, rc = H.sh(PYTHON .. " -c 'import websockets' 2>/dev/null")
  return rc == 0
end

describe("WebSocket through openmesh proxy", function()
  if not H.bin or H.bin == "" then
    it("runs against OPENMESH_BIN", function()
      pending("OPENMESH_BIN is not set (make check sets it to build/bin/openmesh)")
    end)
    return
  end
  if not has_websockets() then
    it("runs with python3-websockets", function()
      pending("python3-websockets is not installed (scripts/deps installs it)")
    end)
    return
  end

  local dir, echo, echo_port, proxy, proxy_port, admin_port

  setup(function()
    dir = H.tmpdir()
    echo = H.spawn(PYTHON .. " " .. H.q(FIXTURES .. "ws_echo.py"), dir, "ws_echo")
    echo_port = H.wait_for(function()
      return tonumber(H.readfile(echo.out):match("listening (%d+)"))
    end, 10)
    assert(echo_port, "ws_echo.py did not start: " .. H.readfile(echo.out))
    H.writefile(dir .. "/traffic.lua", POLICY)
    H.writefile(dir .. "/static.json", cjson.encode({ services = {
      ws = { instances = { { id = "echo", url = "http://127.0.0.1:" .. echo_port } } },
    } }))
    proxy = H.start_proxy(dir, "proxy", "--policy " .. H.q(dir .. "/traffic.lua") ..
      " --static " .. H.q(dir .. "/static.json"))
    proxy_port, admin_port = proxy.port, proxy.admin_port
  end)

  teardown(function()
    H.kill_all()
    if dir then
      os.execute("rm -rf " .. H.q(dir))
    end
  end)

  it("exchanges 1,000 messages past the deadline and closes with 1000", function()
    local out, rc = H.sh("timeout 120 " .. PYTHON .. " " .. H.q(FIXTURES .. "ws_client.py") ..
      " " .. proxy_port .. " ws 1000 600 2>&1")
    local res = out:match("(%b{})")
    assert(res, "no result from ws_client.py: " .. out)
    res = cjson.decode(res)
    assert.equal(1000, res.sent)
    assert.equal(1000, res.received)
    assert.equal(0, res.mismatches)
    assert.equal(1000, res.close_code) -- the client saw the server's 1000
    assert.equal(0, rc)
    assert.is_true(res.elapsed_ms > 600, "the exchange outlived the 300 ms deadline")
    -- the server saw the client's 1000
    assert.truthy(H.wait_for(function()
      return H.readfile(echo.out):match("closed 1000")
    end, 5), H.readfile(echo.out))
    -- counted: one switched upgrade, no tunnel left open, the call ok
    local metrics = H.wait_for(function()
      local body = H.sh(H.curl(5) .. " -s http://127.0.0.1:" .. admin_port .. "/metrics")
      if body:find('openmesh_proxy_tunnels_active{service="ws"} 0', 1, true) then
        return body
      end
    end, 5)
    assert.truthy(metrics, "a tunnel is still open")
    assert.matches('openmesh_proxy_upgrades_total{service="ws",outcome="switched"} 1', metrics, 1, true)
    assert.matches('openmesh_proxy_requests_total{service="ws",outcome="ok"} 1', metrics, 1, true)
  end)

  -- An https:// peer: the 101 arrives over TLS and the tunnel carries the
  -- frames through the connection's TLS engine, both ways.
  describe("to an https:// peer", function()
    local tdir, techo, tproxy
    setup(function()
      tdir = H.tmpdir()
      local _, crc = H.sh("bash " .. H.q(FIXTURES .. "tls_certs.sh") .. " " .. H.q(tdir .. "/certs") .. " 2>&1")
      assert.equal(0, crc)
      techo = H.spawn(PYTHON .. " " .. H.q(FIXTURES .. "ws_echo.py") .. " 0 " ..
        H.q(tdir .. "/certs/server.pem") .. " " .. H.q(tdir .. "/certs/server.key"), tdir, "wss_echo")
      local port = H.wait_for(function()
        return tonumber(H.readfile(techo.out):match("listening (%d+)"))
      end, 10)
      assert(port, "ws_echo.py over TLS did not start: " .. H.readfile(techo.out))
      H.writefile(tdir .. "/traffic.lua", POLICY)
      H.writefile(tdir .. "/static.json", cjson.encode({ services = {
        ws = { instances = { { id = "echo", url = "https://localhost:" .. port } } },
      } }))
      tproxy = H.start_proxy(tdir, "proxy_tls", "--policy " .. H.q(tdir .. "/traffic.lua") ..
        " --static " .. H.q(tdir .. "/static.json") ..
        " --upstream-ca " .. H.q(tdir .. "/certs/ca.pem"))
    end)
    teardown(function()
      if tdir then
        os.execute("rm -rf " .. H.q(tdir))
      end
    end)

    it("exchanges 200 messages over TLS and closes with 1000", function()
      local out, rc = H.sh("timeout 120 " .. PYTHON .. " " .. H.q(FIXTURES .. "ws_client.py") ..
        " " .. tproxy.port .. " ws 200 0 2>&1")
      local res = out:match("(%b{})")
      assert(res, "no result from ws_client.py: " .. out)
      res = cjson.decode(res)
      assert.equal(200, res.sent)
      assert.equal(200, res.received)
      assert.equal(0, res.mismatches)
      assert.equal(1000, res.close_code)
      assert.equal(0, rc)
      assert.truthy(H.wait_for(function()
        return H.readfile(techo.out):match("closed 1000")
      end, 5), H.readfile(techo.out))
      local metrics = H.sh(H.curl(5) .. " -s http://127.0.0.1:" .. tproxy.admin_port .. "/metrics")
      assert.matches('openmesh_proxy_upgrades_total{service="ws",outcome="switched"} 1', metrics, 1, true)
      assert.matches('openmesh_proxy_tls_handshakes_total{service="ws",result="ok"} 1', metrics, 1, true)
    end)
  end)
end)
