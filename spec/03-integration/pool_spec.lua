-- pool_spec.lua: upstream keep-alive through the real `openmesh proxy`
-- binary. 200 keep-alive callers (wrk -c200) over 2 peers written here
-- (asyncio, HTTP/1.1 keep-alive, each counting the connections it
-- accepted in a file): once the pool is warm, at most 1 in 100 requests
-- opens an upstream connection, read from the proxy's
-- openmesh_proxy_upstream_connections_total, and that metric agrees with
-- the peers' own count. The thorough cases are in
-- tests/test_upstream_pool.c; bench/pool_bench.sh measures the same
-- against nginx peers for longer.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../support/?.lua;" .. package.path

local H = require "control_helper"
local cjson = require "cjson"

local PY = "/usr/bin/python3"

-- A keep-alive peer: answers every request "ok", keeps the connection
-- unless asked to close, and writes the connections it accepted to
-- ACCEPTS_FILE on each accept.
local PEER = [[
import asyncio, os, sys
accepts_file = sys.argv[1]
accepts = 0
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"

async def serve(reader, writer):
    global accepts
    accepts += 1
    with open(accepts_file + ".tmp", "w") as f:
        f.write("%d\n" % accepts)
    os.replace(accepts_file + ".tmp", accepts_file)
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            n = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    n = int(line.split(b":", 1)[1])
            if n:
                await reader.readexactly(n)
            writer.write(OK)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    writer.close()

async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", 0, backlog=1024)
    print("listening %d" % server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()

asyncio.run(main())
]]

local POLICY = [[
return {
  kind = "traffic",
  subset = function(_, peers) return peers end,
}
]]

describe("the upstream pool through the real openmesh proxy", function()
  if not H.bin or H.bin == "" then
    it("runs against OPENMESH_BIN", function()
      pending("OPENMESH_BIN is not set (make check sets it to build/bin/openmesh)")
    end)
    return
  end
  if not io.open(PY, "r") then
    it("runs with Debian's python3", function()
      pending("no " .. PY)
    end)
    return
  end
  if not H.sh("command -v wrk >/dev/null && echo yes"):find("yes", 1, true) then
    it("runs with wrk", function()
      pending("wrk is not installed (scripts/deps-bench installs it)")
    end)
    return
  end

  local dir, proxy
  local peers = {}

  local function accepted()
    local n = 0
    for _, p in ipairs(peers) do
      n = n + (tonumber(H.readfile(p.accepts):match("%d+")) or 0)
    end
    return n
  end

  -- openmesh_proxy_upstream_connections_total for service pool: new, reused
  local function conns()
    local status, text = H.request(dir, "GET", proxy.admin .. "/metrics")
    assert.equal(200, status)
    local function v(reason)
      local n = text:match('openmesh_proxy_upstream_connections_total{service="pool",reason="' ..
        reason .. '"} ([%d.e+]+)')
      assert(n, "no " .. reason .. " series in:\n" .. text:sub(1, 2000))
      return tonumber(n)
    end
    return v("new"), v("reused")
  end

  -- wrk's request count and its non-2xx count
  local function wrk(conns_n, seconds)
    local out = H.sh(string.format("wrk -t2 -c%d -d%ds -H 'Host: pool' %s/ 2>&1", conns_n, seconds,
      proxy.url))
    local n = tonumber(out:match("(%d+) requests in"))
    assert(n, "wrk said: " .. out)
    return n, tonumber(out:match("Non%-2xx or 3xx responses: (%d+)")) or 0, out
  end

  setup(function()
    dir = H.tmpdir()
    H.writefile(dir .. "/peer.py", PEER)
    for i = 1, 2 do
      local acc = dir .. "/accepts" .. i
      local p = H.spawn(H.q(PY) .. " " .. H.q(dir .. "/peer.py") .. " " .. H.q(acc), dir, "peer" .. i)
      p.port = H.wait_for(function()
        return tonumber(H.readfile(p.out):match("listening (%d+)"))
      end, 10)
      assert(p.port, "peer " .. i .. " did not start: " .. H.readfile(p.out))
      p.accepts = acc
      peers[i] = p
    end
    H.writefile(dir .. "/traffic.lua", POLICY)
    H.writefile(dir .. "/static.json", cjson.encode({ services = { pool = { instances = {
      { id = "a", url = "http://127.0.0.1:" .. peers[1].port },
      { id = "b", url = "http://127.0.0.1:" .. peers[2].port } } } } }))
    proxy = H.start_proxy(dir, "proxy", "--policy " .. H.q(dir .. "/traffic.lua") ..
      " --static " .. H.q(dir .. "/static.json"))
  end)

  teardown(function()
    H.kill_all()
    if dir then
      os.execute("rm -rf " .. H.q(dir))
    end
  end)

  it("keeps 200 callers on pooled connections, and counts what it opens", function()
    -- warm: the pool grows to what 200 callers need (a little more when
    -- the balance between the two peers swings past their share)
    local _, bad = wrk(200, 2)
    assert.equal(0, bad)
    local new0, reused0 = conns()
    local n, bad2, out = wrk(200, 3)
    assert.equal(0, bad2)
    local new1, reused1 = conns()
    local attempts = (new1 + reused1) - (new0 + reused0)
    -- every request wrk counted went upstream (and those cut at its end)
    assert.is_true(attempts >= n, ("attempts %d, wrk %d:\n%s"):format(attempts, n, out))
    local per_request = (new1 - new0) / attempts
    assert.is_true(per_request <= 0.01, ("new upstream connections per request %.4f " ..
      "(%d new of %d attempts; bar <= 0.01)"):format(per_request, new1 - new0, attempts))
    -- the metric agrees with the peers' own count of accepted connections
    assert.equal(accepted(), new1)
    -- and /status shows the limit in effect: 256 max_inflight over 2 peers
    -- (summed over the workers, each holding its share)
    local status, body = H.request(dir, "GET", proxy.admin .. "/status")
    assert.equal(200, status)
    local up = H.json(body).services.pool.upstream_pool
    assert.equal(128, up.max_idle_per_peer)
    assert.equal(60000, up.idle_timeout_ms)
    assert.equal(0, up.max_requests_per_connection)
    assert.equal(new1, up.connections_new)
    assert.is_true(up.idle >= 1 and up.idle <= new1, "idle " .. tostring(up.idle))
  end)

  it("applies the policy's pool fields", function()
    H.writefile(dir .. "/limited.lua", [[
return {
  kind = "traffic",
  subset = function(_, peers) return peers end,
  pool = { max_idle_per_peer = 3, idle_timeout_ms = 30000, max_requests_per_connection = 5 },
}
]])
    H.writefile(dir .. "/one.json", cjson.encode({ services = { pool = { instances = {
      { id = "a", url = "http://127.0.0.1:" .. peers[1].port } } } } }))
    local before = accepted()
    -- one worker: which connection a request reuses, and when the fifth
    -- retires it, is one worker's pool's business (each has its own)
    local p = H.start_proxy(dir, "limited", "--workers 1 --policy " .. H.q(dir .. "/limited.lua") ..
      " --static " .. H.q(dir .. "/one.json"))
    -- one at a time: every request after the first could reuse, but a
    -- connection is retired after its fifth
    for _ = 1, 20 do
      assert.equal(200, (H.request(dir, "GET", p.url .. "/", { headers = { "Host: pool" } })))
    end
    local status, body = H.request(dir, "GET", p.admin .. "/status")
    assert.equal(200, status)
    local up = H.json(body).services.pool.upstream_pool
    assert.equal(3, up.max_idle_per_peer)
    assert.equal(30000, up.idle_timeout_ms)
    assert.equal(5, up.max_requests_per_connection)
    assert.equal(4, up.connections_new)
    assert.equal(16, up.connections_reused)
    assert.equal(4, accepted() - before)
    H.stop(p)
  end)
end)
