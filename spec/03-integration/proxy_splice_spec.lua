-- proxy_splice_spec.lua: large response bodies relayed socket to socket
-- with splice(2) by the real `openmesh proxy` binary (docs/PROXY.md
-- "Large bodies"), from a real upstream (tests/fixtures/body_tool.py sink:
-- GET /download/SIZE, with ?cut=N to close after N bytes and ?stall=N to
-- go silent after N) to curl. What is checked: the bytes arrive whole and
-- in order (sha256 against the generator's), the splice really ran
-- (openmesh_proxy_spliced_bytes_total), the upstream connection is pooled
-- after a spliced body, a failure or a stall mid-body reaches the caller
-- as a short body, never a clean end, and the proxy goes on serving.
-- The splice module itself is tested in tests/test_splice.c.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../support/?.lua;" .. package.path

local H = require "control_helper"
local cjson = require "cjson"

local TOOL = here .. "../../tests/fixtures/body_tool.py"
local PY = "/usr/bin/python3"
local MiB = 1048576

local POLICY = [[
return {
  kind = "traffic",
  subset = function(_, peers) return peers end,
  deadline_ms = 5000,
  stream_idle_timeout_ms = 500,
  body_idle_timeout_ms = 500,
}
]]

describe("large response bodies spliced by the real openmesh proxy", function()
  if not H.bin or H.bin == "" then
    it("runs against OPENMESH_BIN", function()
      pending("OPENMESH_BIN is not set")
    end)
    return
  end
  if not H.sh("test -x " .. PY) then
    it("runs with Debian's python3", function()
      pending("no " .. PY)
    end)
    return
  end

  local dir, sink, spliced, copied

  local function start_proxy(name, args)
    H.writefile(dir .. "/static.json", cjson.encode({ services = { up = { instances = {
      { id = "sink", url = "http://127.0.0.1:" .. sink.port } } } } }))
    return H.start_proxy(dir, name, "--workers 1 --policy " .. H.q(dir .. "/traffic.lua") ..
      " --static " .. H.q(dir .. "/static.json") .. " " .. (args or ""))
  end

  -- A counter of the proxy's /metrics (0 when the series is absent).
  local function metric(p, series)
    local status, body = H.request(dir, "GET", p.admin .. "/metrics")
    assert.equal(200, status)
    local v = body:match(series:gsub("[%p]", "%%%0") .. " (%S+)")
    return tonumber(v) or 0
  end

  -- The sha256 of what the sink sends for /download/SIZE.
  local function want_sha(size)
    local hashfile = dir .. "/gen" .. size .. ".sha"
    local _, rc = H.sh(string.format("%s %s gen %d %s >/dev/null", H.q(PY), H.q(TOOL), size,
      H.q(hashfile)))
    assert.equal(0, rc)
    return H.readfile(hashfile):match("%d+ (%x+)")
  end

  -- GET path through p with curl: its exit code, "STATUS SIZE" and seconds.
  local function get(p, path)
    local t0 = H.now()
    local out, rc = H.sh(string.format("%s -sS -o /dev/null -H 'Host: up' " ..
      "-w '%%{http_code} %%{size_download}' %s%s 2>/dev/null", H.curl(60), p.url, path))
    return rc, out, H.now() - t0
  end

  local function sha_of(p, path)
    local out, rc = H.sh(string.format("%s -sS -H 'Host: up' %s%s | sha256sum", H.curl(60),
      p.url, path))
    assert.equal(0, rc, out)
    return out:match("^(%x+)")
  end

  setup(function()
    dir = H.tmpdir()
    H.writefile(dir .. "/traffic.lua", POLICY)
    sink = H.spawn(H.q(PY) .. " " .. H.q(TOOL) .. " sink 0", dir, "sink")
    sink.port = H.wait_for(function()
      return tonumber(H.readfile(sink.out):match("listening (%d+)"))
    end, 10)
    assert(sink.port, "the sink did not start: " .. H.readfile(sink.out))
    spliced = start_proxy("spliced")
    copied = start_proxy("copied", "--splice-min off")
  end)

  teardown(function()
    H.kill_all()
    if dir then
      os.execute("rm -rf " .. H.q(dir))
    end
  end)

  local SPLICED = 'openmesh_proxy_spliced_bytes_total{service="up"}'

  it("relays a 64 MiB body byte for byte and pools the upstream connection after it", function()
    local size = 64 * MiB
    local want = want_sha(size)
    assert.equal(want, sha_of(spliced, "/download/" .. size))
    assert.equal(want, sha_of(spliced, "/download/" .. size))
    -- all but what the first read held went socket to socket
    local moved = metric(spliced, SPLICED)
    assert.is_true(moved >= 2 * (size - MiB), "spliced " .. moved .. " bytes of " .. 2 * size)
    assert.is_true(moved <= 2 * size, "spliced " .. moved .. " bytes of " .. 2 * size)
    assert.equal(1, metric(spliced, 'openmesh_proxy_upstream_connections_total{service="up",reason="new"}'))
    assert.equal(1, metric(spliced, 'openmesh_proxy_upstream_connections_total{service="up",reason="reused"}'))
  end)

  it("copies a body below --splice-min, and every body with --splice-min off", function()
    local before = metric(spliced, SPLICED)
    local want = want_sha(512 * 1024)
    assert.equal(want, sha_of(spliced, "/download/" .. 512 * 1024))
    assert.equal(before, metric(spliced, SPLICED))
    want = want_sha(8 * MiB)
    assert.equal(want, sha_of(copied, "/download/" .. 8 * MiB))
    assert.equal(0, metric(copied, SPLICED))
  end)

  it("ends the caller's body short when the upstream closes mid-body", function()
    local rc, out = get(spliced, "/download/" .. 64 * MiB .. "?cut=" .. 8 * MiB)
    assert.equal(18, rc) -- curl: transfer closed with outstanding read data
    assert.equal("200 " .. 8 * MiB, out)
    assert.is_truthy(H.wait_for(function()
      return H.readfile(spliced.out):find('"event":"proxy_stream_aborted"', 1, true)
    end, 5), H.readfile(spliced.out))
    local want = want_sha(4 * MiB)
    assert.equal(want, sha_of(spliced, "/download/" .. 4 * MiB))
  end)

  it("cuts a body that stalls mid-splice after stream_idle_timeout_ms", function()
    local before = metric(spliced, 'openmesh_proxy_streams_cut_total{service="up",reason="idle"}')
    local rc, out, dt = get(spliced, "/download/" .. 64 * MiB .. "?stall=" .. 8 * MiB)
    assert.equal(18, rc)
    assert.equal("200 " .. 8 * MiB, out)
    assert.is_true(dt >= 0.5, "cut after " .. dt .. " s, before the 500 ms idle timeout")
    assert.is_true(dt < 5, "took " .. dt .. " s")
    assert.equal(before + 1,
      metric(spliced, 'openmesh_proxy_streams_cut_total{service="up",reason="idle"}'))
  end)

  it("goes on serving after a caller leaves mid-splice", function()
    local out, rc = H.sh(string.format("%s -sS -H 'Host: up' %s/download/%d 2>/dev/null " ..
      "| head -c %d | wc -c", H.curl(60), spliced.url, 256 * MiB, 4 * MiB))
    assert.equal(0, rc)
    assert.equal(tostring(4 * MiB), (out:gsub("%s+", "")))
    local want = want_sha(16 * MiB)
    assert.equal(want, sha_of(spliced, "/download/" .. 16 * MiB))
    assert.is_true(H.alive(spliced.pid))
  end)

  -- An upload of SIZE pattern bytes through p (curl -T from the generator,
  -- with its Content-Length, so the body can be spliced); curl's exit code
  -- and what the sink answered ("LEN SHA256"), or the status.
  local function upload(p, size, path, stall)
    local hashfile = dir .. "/up" .. size .. ".sha"
    -- (a client that stops sending leaves the generator a broken pipe)
    local src = string.format("%s %s gen %d %s 2>/dev/null", H.q(PY), H.q(TOOL), size,
      H.q(hashfile))
    if stall then -- the first STALL bytes, then silence with the pipe open
      src = string.format("{ %s | head -c %d; sleep 3; }", src, stall)
    end
    local out, rc = H.sh(string.format("%s | %s -sS -T - -H 'Host: up' " ..
      "-H 'Transfer-Encoding:' -H 'Content-Length: %d' -w ' %%{http_code}' %s%s 2>&1", src, H.curl(60), size,
      p.url, path or "/upload"))
    return rc, out, hashfile
  end

  it("forwards a 64 MiB upload byte for byte, spliced past the replay limit", function()
    local size = 64 * MiB
    local before = metric(spliced, SPLICED)
    local rc, out, hashfile = upload(spliced, size)
    assert.equal(0, rc, out)
    assert.equal((H.readfile(hashfile):gsub("%s+$", "")) .. " 200", out)
    -- the first MiB is held for a replay, then the rest is spliced
    local moved = metric(spliced, SPLICED) - before
    assert.is_true(moved >= size - 3 * MiB, "spliced " .. moved .. " bytes of " .. size)
    assert.is_true(moved <= size, "spliced " .. moved .. " bytes of " .. size)
    assert.equal(0, metric(copied, SPLICED))
    rc, out = upload(copied, 8 * MiB)
    assert.equal(0, rc, out)
    assert.equal(0, metric(copied, SPLICED))
  end)

  it("answers 502 when the upstream resets in the middle of a spliced upload", function()
    local before = metric(spliced, SPLICED)
    local rc, out = upload(spliced, 64 * MiB, "/upload?cut=" .. 16 * MiB)
    assert.matches(" 502$", out)
    assert.is_true(metric(spliced, SPLICED) - before >= 8 * MiB, "the upload was not spliced")
    assert.is_truthy(rc == 0 or rc == 55, "curl exit " .. tostring(rc) .. ": " .. out)
    -- and the next one goes through
    local hashfile
    rc, out, hashfile = upload(spliced, 4 * MiB)
    assert.equal(0, rc, out)
    assert.equal((H.readfile(hashfile):gsub("%s+$", "")) .. " 200", out)
  end)

  it("answers 408 when the client stalls in the middle of a spliced upload", function()
    local before = metric(spliced, SPLICED)
    local t0 = H.now()
    local rc, out = upload(spliced, 64 * MiB, nil, 16 * MiB)
    local dt = H.now() - t0
    assert.matches(" 408$", out)
    assert.is_true(metric(spliced, SPLICED) - before >= 8 * MiB, "the upload was not spliced")
    assert.is_truthy(rc == 0 or rc == 55, "curl exit " .. tostring(rc) .. ": " .. out)
    assert.is_true(dt >= 0.5, "answered after " .. dt .. " s, before the 500 ms body idle timeout")
    assert.is_true(H.alive(spliced.pid))
  end)
end)
