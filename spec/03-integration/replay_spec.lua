-- replay_spec.lua: the access log of the real `openmesh proxy` in front of
-- real upstreams (python3 http.server), then `openmesh replay` over it: a
-- replay of the policy in force moves nothing (the replay picks what the
-- proxy picked), a canary edit moves users to the canary with counts, and
-- an edit that makes requests fail exits 1. The sample recorded through
-- the proxy is extended to 10,000 lines in the same format (new users and
-- request ids on recorded lines) for the policy-against-policy replays.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../support/?.lua;" .. package.path

local H = require "control_helper"
local cjson = require "cjson"

local function canary(percent, extra)
  return ([[
local policy = require "openmesh.policy"
local function user(req) return policy.header(req, "x-user") end
return {
  kind = "traffic",
  vary = { "x-user" },
  key = user,
  subset = function(req, peers)
    %s
    return policy.canary(peers, user(req), %d, { version = "v2" })
  end,
}
]]):format(extra or "", percent)
end

describe("openmesh proxy --access-log and openmesh replay", function()
  if not H.bin or H.bin == "" then
    it("runs against OPENMESH_BIN", function()
      pending("OPENMESH_BIN is not set (make check sets it to build/bin/openmesh)")
    end)
    return
  end

  local dir, proxy, logfile
  local bin = "timeout 60 " .. H.q(H.bin)
  local SAMPLE = 300

  local function upstream(name)
    local p = H.spawn("python3 -u -m http.server 0 --bind 127.0.0.1", dir, name)
    local port = H.wait_for(function()
      return tonumber(H.readfile(p.out):match("port (%d+)"))
    end, 10)
    assert(port, "python3 http.server did not start: " .. H.readfile(p.out))
    return "http://127.0.0.1:" .. port
  end

  local function lines(path)
    local out = {}
    for l in H.readfile(path):gmatch("[^\n]+") do
      out[#out + 1] = l
    end
    return out
  end

  setup(function()
    dir = H.tmpdir()
    logfile = dir .. "/access.log"
    local peers = {
      { id = "v1-a", url = upstream("v1a"), weight = 1, ttl_ms = 10000, metadata = { version = "v1" } },
      { id = "v1-b", url = upstream("v1b"), weight = 1, ttl_ms = 10000, metadata = { version = "v1" } },
      { id = "v2-a", url = upstream("v2a"), weight = 1, ttl_ms = 10000, metadata = { version = "v2" } },
    }
    H.writefile(dir .. "/peers.json", cjson.encode({
      service = "orders", revision = 1, instances = peers }))
    for _, p in ipairs(peers) do
      p.ttl_ms = nil -- a discovery answer has it, a --static file not
    end
    H.writefile(dir .. "/static.json", cjson.encode({ services = {
      orders = { revision = 1, instances = peers } } }))
    H.writefile(dir .. "/old.lua", canary(10))
    H.writefile(dir .. "/new.lua", canary(50))
    H.writefile(dir .. "/bad.lua", canary(10,
      'if (user(req) or ""):match("7$") then error("no such user") end'))
    proxy = H.start_proxy(dir, "proxy", "--workers 2 --policy " .. H.q(dir .. "/old.lua") ..
      " --static " .. H.q(dir .. "/static.json") .. " --access-log " .. H.q(logfile))
    -- SAMPLE requests in one curl run: a user each, a secret header that
    -- must not reach the log, and a hostile path
    local cfg = {}
    for i = 1, SAMPLE do
      cfg[#cfg + 1] = ('%surl = "%s/?p=%d&q=%d"\nheader = "Host: orders"\nheader = "x-user: user-%d"\n' ..
        'header = "authorization: Bearer secret-%d"\noutput = "/dev/null"\n'):format(
        i > 1 and "next\n" or "", proxy.url, i, i, i, i)
    end
    H.writefile(dir .. "/curl.cfg", table.concat(cfg))
    H.sh(H.curl(30) .. " -s -K " .. H.q(dir .. "/curl.cfg"))
    assert(H.wait_for(function() return #lines(logfile) >= SAMPLE end, 10),
      "the access log has " .. #lines(logfile) .. " lines, want " .. SAMPLE)
  end)

  teardown(function()
    H.kill_all()
    if dir then
      os.execute("rm -rf " .. H.q(dir))
    end
  end)

  it("logs one line per request with the varied fields and nothing else", function()
    local l = lines(logfile)
    assert.equal(SAMPLE, #l)
    local e = cjson.decode(l[1])
    assert.equal("orders", e.service)
    assert.equal("GET", e.method)
    assert.matches("^/%?p=%d+&q=%d+$", e.path)
    assert.matches("^user%-%d+$", e.fields["x-user"])
    assert.is_nil(e.fields.authorization)
    assert.equal(200, e.status)
    assert.equal("ok", e.outcome)
    assert.equal(1, e.attempts)
    assert.matches("^v[12]%-[ab]$", e.peer.id)
    assert.matches("^http://127%.0%.0%.1:%d+$", e.peer.address)
    assert.equal(32, #e.request_id)
    assert.matches("^%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%d%.%d%d%dZ$", e.time)
    assert.equal(1, e.policy.version)
    assert.not_matches("secret", H.readfile(logfile))
  end)

  it("escapes a hostile field so it cannot forge a line", function()
    local before = #lines(logfile)
    H.request(dir, "GET", proxy.url .. "/x", { headers = { "Host: orders",
      'x-user: a"},"outcome":"forged\\' } })
    assert(H.wait_for(function() return #lines(logfile) == before + 1 end, 5))
    local l = lines(logfile)
    local e = cjson.decode(l[#l])
    assert.equal('a"},"outcome":"forged\\', e.fields["x-user"])
    assert.equal("ok", e.outcome)
    -- keep the sample as it was for the replays below
    H.writefile(logfile, table.concat(l, "\n", 1, before) .. "\n")
  end)

  it("replays the policy in force onto the peers the proxy picked", function()
    local out, rc = H.sh(bin .. " replay --log " .. H.q(logfile) .. " --policy " ..
      H.q(dir .. "/old.lua") .. " --peers " .. H.q(dir .. "/peers.json") .. " --json")
    assert.equal(0, rc, out)
    local r = cjson.decode(out).services.orders
    assert.equal(SAMPLE, r.requests)
    assert.equal(SAMPLE, r.unchanged, out)
  end)

  describe("on 10,000 requests", function()
    local big
    setup(function()
      big = dir .. "/big.log"
      local l, out = lines(logfile), {}
      for i = 1, 10000 do
        local e = cjson.decode(l[(i - 1) % #l + 1])
        e.fields["x-user"] = "user-" .. i
        e.request_id = ("%032x"):format(i)
        out[#out + 1] = cjson.encode(e)
      end
      H.writefile(big, table.concat(out, "\n") .. "\n")
    end)

    it("reports what a canary edit moves, with counts", function()
      local out, rc = H.sh(bin .. " replay --log " .. H.q(big) .. " --policy " ..
        H.q(dir .. "/new.lua") .. " --against " .. H.q(dir .. "/old.lua") ..
        " --peers " .. H.q(dir .. "/peers.json") .. " --json")
      assert.equal(0, rc, out)
      local r = cjson.decode(out).services.orders
      assert.equal(10000, r.requests)
      assert.equal(0, r.now_fail)
      -- 50% of users instead of 10%: about 40% move, all of them to v2-a
      assert(r.moved > 3000 and r.moved < 5000, "moved " .. r.moved .. ", want about 4000")
      local sum = 0
      for _, m in ipairs(r.moves) do
        assert.matches("^v1%-[ab] %-> v2%-a$", m.move)
        assert(#m.examples > 0, "no example for " .. m.move)
        sum = sum + m.count
      end
      assert.equal(r.moved, sum)
      assert.equal(10000, r.unchanged + r.moved)
      local text = H.sh(bin .. " replay --log " .. H.q(big) .. " --policy " ..
        H.q(dir .. "/new.lua") .. " --against " .. H.q(dir .. "/old.lua") ..
        " --peers " .. H.q(dir .. "/peers.json"))
      assert.matches("service orders: 10000 requests", text, 1, true)
      assert.matches("-> v2-a", text, 1, true)
    end)

    it("gives the same report on two cores as on one for a log over 4 MiB", function()
      local huge = dir .. "/huge.log"
      local text = H.readfile(big)
      H.writefile(huge, text .. text) -- 20,000 lines, past the split size
      assert(#text * 2 > 4 * 1024 * 1024, ("the log is %d bytes, not past 4 MiB"):format(#text * 2))
      local function run(threads, log)
        local out, rc = H.sh(bin .. " replay --log " .. H.q(log) .. " --policy " ..
          H.q(dir .. "/new.lua") .. " --against " .. H.q(dir .. "/old.lua") ..
          " --peers " .. H.q(dir .. "/peers.json") .. " --json --threads " .. threads ..
          (log:find("bad") and " 2>&1" or ""))
        return out, rc
      end
      local one, rc1 = run(1, huge)
      local two, rc2 = run(2, huge)
      assert.are.same({ 0, 0 }, { rc1, rc2 }, one .. two)
      local a, b = cjson.decode(one).services.orders, cjson.decode(two).services.orders
      assert.equal(20000, b.requests)
      for _, k in ipairs { "requests", "unchanged", "moved", "now_fail", "now_ok", "still_fail" } do
        assert.are.equal(a[k], b[k], k)
      end
      local function counts(r)
        local m = {}
        for _, x in ipairs(r.moves) do
          m[x.move] = x.count
        end
        return m
      end
      assert.are.same(counts(a), counts(b))
      -- a bad line in the second half is named by its line number
      local bad = dir .. "/huge_bad.log"
      H.writefile(bad, text .. text .. "not json\n")
      for _, threads in ipairs { 1, 2 } do
        local out, rc = run(threads, bad)
        assert.are.equal(2, rc, out)
        assert.matches("huge_bad.log:20001: ", out, 1, true)
      end
    end)

    it("exits 1 when an edit makes requests fail, with their reason", function()
      local out, rc = H.sh(bin .. " replay --log " .. H.q(big) .. " --policy " ..
        H.q(dir .. "/bad.lua") .. " --peers " .. H.q(dir .. "/peers.json") .. " --json")
      assert.equal(1, rc, out)
      local r = cjson.decode(out:match("%b{}")).services.orders
      assert.equal(1000, r.now_fail) -- users ending in 7
      assert.equal("policy_error", r.failures[1].reason)
      assert.equal(1000, r.failures[1].count)
    end)
  end)

  it("has --help and exits 2 naming file:line for a bad log", function()
    local out, rc = H.sh(bin .. " replay --help")
    assert.equal(0, rc)
    assert.matches("--against", out, 1, true)
    H.writefile(dir .. "/broken.log", H.readfile(logfile) .. "{not json\n")
    out, rc = H.sh(bin .. " replay --log " .. H.q(dir .. "/broken.log") .. " --policy " ..
      H.q(dir .. "/old.lua") .. " 2>&1")
    assert.equal(2, rc)
    assert.matches("broken.log:" .. (SAMPLE + 1) .. ":", out, 1, true)
    out, rc = H.sh(bin .. " replay --log " .. H.q(logfile) .. " 2>&1")
    assert.equal(2, rc)
    assert.matches("--policy", out, 1, true)
  end)

  it("follows a rotated log and reopens on SIGUSR1", function()
    -- the writer looks at the path once a second: lines keep coming until
    -- one lands in a new file there
    os.rename(logfile, logfile .. ".1")
    assert(H.wait_for(function()
      H.request(dir, "GET", proxy.url .. "/after-rotate", { headers = { "Host: orders" } })
      return H.readfile(logfile):find("after-rotate", 1, true) ~= nil
    end, 5, 0.2), "no line in the new file after a rotation")
    os.rename(logfile, logfile .. ".2")
    H.kill(proxy.pid, "USR1")
    assert(H.wait_for(function()
      local f = io.open(logfile)
      if f then f:close() end
      return f ~= nil
    end, 5), "SIGUSR1 did not reopen the path")
    H.request(dir, "GET", proxy.url .. "/after-usr1", { headers = { "Host: orders" } })
    assert(H.wait_for(function()
      return H.readfile(logfile):find("after-usr1", 1, true) ~= nil
    end, 5), "no line in the new file after SIGUSR1")
    local m = H.sh(H.curl(5) .. " -s " .. proxy.admin .. "/metrics")
    assert.matches('openmesh_proxy_access_log_lines_total{result="written"}', m, 1, true)
  end)
end)
