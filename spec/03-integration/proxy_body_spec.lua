-- proxy_body_spec.lua: request bodies through the real `openmesh proxy`
-- binary, with real upstreams (tests/fixtures/body_tool.py sink: reads
-- every body, answers its length and sha256) and real clients (curl -T
-- from a generator pipe, Python's http.client, raw sockets). The proxy's
-- memory is its VmHWM (/proc/PID/status: the peak resident set). A
-- sanitized binary (CI) carries AddressSanitizer's shadow and allocator
-- metadata, a fixed cost of a few hundred MB: there the bar applies to the
-- growth of the peak over the proxy's size once it listens, with the
-- quarantine off so freed blocks are reused as in a release build.
-- The thorough cases are in tests/test_proxy.c and
-- tests/test_http_server_stream.c; this is the end-to-end check.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../support/?.lua;" .. package.path

local H = require "control_helper"
local cjson = require "cjson"

local TOOL = here .. "../../tests/fixtures/body_tool.py"
local PY = "/usr/bin/python3"

local POLICY = [[
return {
  kind = "traffic",
  subset = function(_, peers) return peers end,
  deadline_ms = 60000,
  per_try_timeout_ms = 30000,
  body_idle_timeout_ms = 500,
  retry_non_idempotent = true,
}
]]

describe("request bodies through the real openmesh proxy", function()
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

  local dir, sinks, proxies = nil, {}, {}
  local asan = (H.sh("ldd " .. H.q(H.bin) .. " 2>/dev/null | grep -c libasan")) ~= "0\n"

  local function start_sink(name, mode)
    local p = H.spawn(H.q(PY) .. " " .. H.q(TOOL) .. " sink 0 " .. (mode or ""), dir, name)
    local port = H.wait_for(function()
      return tonumber(H.readfile(p.out):match("listening (%d+)"))
    end, 10)
    assert(port, "the sink did not start: " .. H.readfile(p.out))
    p.port = port
    return p
  end

  local n_proxy = 0
  local function start_proxy(static, args)
    n_proxy = n_proxy + 1
    H.writefile(dir .. "/static" .. n_proxy .. ".json", cjson.encode(static))
    local env = asan and "ASAN_OPTIONS=detect_leaks=0:quarantine_size_mb=0:" ..
      "thread_local_quarantine_size_kb=0 " or ""
    local p = H.start_proxy(dir, "proxy" .. n_proxy, "--policy " .. H.q(dir .. "/traffic.lua") ..
      " --static " .. H.q(dir .. "/static" .. n_proxy .. ".json") .. " " .. (args or ""),
      { env = env })
    p.start_kib = asan and tonumber(H.readfile("/proc/" .. p.pid .. "/status")
      :match("VmRSS:%s+(%d+) kB")) or 0
    return p
  end

  -- The proxy's peak resident set in KiB; under ASan, its growth since the
  -- proxy listened (see the top).
  local function vmhwm_kib(p)
    local kb = H.readfile("/proc/" .. p.pid .. "/status"):match("VmHWM:%s+(%d+) kB")
    return assert(tonumber(kb), "no VmHWM for pid " .. p.pid) - p.start_kib
  end

  local function one(id, port)
    return { instances = { { id = id, url = "http://127.0.0.1:" .. port } } }
  end

  setup(function()
    dir = H.tmpdir()
    H.writefile(dir .. "/traffic.lua", POLICY)
    sinks.ok = start_sink("sink-ok")
    sinks.fail = start_sink("sink-fail", "fail")
    proxies.open = start_proxy({ services = {
      up = one("ok", sinks.ok.port),
      pair = { instances = {
        { id = "fail", url = "http://127.0.0.1:" .. sinks.fail.port },
        { id = "ok", url = "http://127.0.0.1:" .. sinks.ok.port } } },
    } })
    proxies.capped = start_proxy({ services = { up = one("ok", sinks.ok.port) } },
      "--max-body-bytes 8MiB")
  end)

  teardown(function()
    H.kill_all()
    if dir then
      os.execute("rm -rf " .. H.q(dir))
    end
  end)

  it("forwards a 200 MB upload whole with the proxy's peak memory under 64 MB", function()
    local size = 200 * 1000 * 1000
    local hashfile = dir .. "/gen.sha"
    local out, rc = H.sh(string.format("%s %s gen %d %s | %s -sS -T - -H 'Host: up' %s/upload",
      H.q(PY), H.q(TOOL), size, H.q(hashfile), H.curl(120), proxies.open.url))
    assert.equal(0, rc, out)
    assert.equal((H.readfile(hashfile):gsub("%s+$", "")), out)
    local kib = vmhwm_kib(proxies.open)
    print(("# 200 MB upload: proxy VmHWM %d KiB"):format(kib))
    assert.is_true(kib < 64 * 1024, "VmHWM " .. kib .. " KiB")
  end)

  it("relays a 1 GB download whole with the proxy's peak memory under 64 MB", function()
    local size = 1000 * 1000 * 1000
    local hashfile = dir .. "/gen1g.sha"
    -- what the sink sends: the generator's bytes, hashed here once
    local _, grc = H.sh(string.format("%s %s gen %d %s >/dev/null", H.q(PY), H.q(TOOL),
      size, H.q(hashfile)))
    assert.equal(0, grc)
    local out, rc = H.sh(string.format("%s -sS -H 'Host: up' %s/download/%d | sha256sum",
      H.curl(120), proxies.open.url, size))
    assert.equal(0, rc, out)
    local want = H.readfile(hashfile):match("%d+ (%x+)")
    assert.equal(want, out:match("^(%x+)"))
    local kib = vmhwm_kib(proxies.open)
    print(("# 1 GB download: proxy VmHWM %d KiB"):format(kib))
    assert.is_true(kib < 64 * 1024, "VmHWM " .. kib .. " KiB")
  end)

  it("cuts 100 stalled 8 MiB uploads with 408 and stays under 64 MB", function()
    local t0 = H.now()
    local out, rc = H.sh(string.format("timeout 60 %s %s stall 127.0.0.1 %d 100 %d up",
      H.q(PY), H.q(TOOL), proxies.open.port, 8 * 1024 * 1024))
    assert.equal(0, rc, out)
    local n = 0
    for status, secs in out:gmatch("(%S+) ([%d.]+)") do
      n = n + 1
      assert.equal("408", status)
      assert.is_true(tonumber(secs) >= 0.45, "cut after " .. secs .. " s")
    end
    assert.equal(100, n)
    assert.is_true(H.now() - t0 < 20)
    local kib = vmhwm_kib(proxies.open)
    print(("# 100 stalled uploads: proxy VmHWM %d KiB"):format(kib))
    assert.is_true(kib < 64 * 1024, "VmHWM " .. kib .. " KiB")
  end)

  it("answers 100 stalled uploads to an unknown Host at once, under 64 MB", function()
    local out, rc = H.sh(string.format("timeout 60 %s %s stall 127.0.0.1 %d 100 %d nope",
      H.q(PY), H.q(TOOL), proxies.open.port, 8 * 1024 * 1024))
    assert.equal(0, rc, out)
    local n = 0
    for status, secs in out:gmatch("(%S+) ([%d.]+)") do
      n = n + 1
      assert.equal("503", status) -- no_peers, without waiting for the body
      assert.is_true(tonumber(secs) < 5, "answered after " .. secs .. " s")
    end
    assert.equal(100, n)
    local kib = vmhwm_kib(proxies.open)
    assert.is_true(kib < 64 * 1024, "VmHWM " .. kib .. " KiB")
  end)

  it("answers a 9 MiB PUT without Expect with a readable 413, 10 of 10", function()
    local out, rc = H.sh(string.format("timeout 60 %s %s put 127.0.0.1 %d %d 10 up",
      H.q(PY), H.q(TOOL), proxies.capped.port, 9 * 1024 * 1024))
    assert.equal(0, rc, out)
    local statuses = {}
    for line in out:gmatch("[^\n]+") do
      statuses[#statuses + 1] = line
    end
    assert.same({ "413", "413", "413", "413", "413", "413", "413", "413", "413", "413" },
      statuses)
    -- under the cap, the same PUT goes through
    out, rc = H.sh(string.format("timeout 60 %s %s put 127.0.0.1 %d %d 1 up",
      H.q(PY), H.q(TOOL), proxies.capped.port, 7 * 1024 * 1024))
    assert.equal(0, rc, out)
    assert.equal("200", (out:gsub("%s+$", "")))
  end)

  it("replays a small POST body whole to the second peer on a retry", function()
    local out, rc = H.sh(string.format("timeout 60 %s %s post 127.0.0.1 %d 20000 10 pair",
      H.q(PY), H.q(TOOL), proxies.open.port))
    assert.equal(0, rc, out)
    local want = out:match("^([^\n]+)")
    local n, retried = 0, 0
    for status, attempts, body in out:gmatch("\n(%d+) (%S+) ([^\n]+)") do
      n = n + 1
      assert.equal("200", status)
      assert.equal(want, body)
      if attempts == "2" then
        retried = retried + 1
      end
    end
    assert.equal(10, n)
    assert.is_true(retried > 0, "no call met the failing peer first")
  end)
end)
