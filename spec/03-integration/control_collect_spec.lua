-- control_collect_spec.lua: `openmesh control --empty-service-ttl`: a
-- service with no instance and no watcher of its own for the ttl leaves
-- the list (docs/CONTROL.md "Empty services"), one that is watched or has
-- an instance stays, and one that comes back gets a higher revision. The
-- 50,000-service case is tests/test_store_memory.c.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../support/?.lua;" .. package.path

local H = require "control_helper"

-- The services a plane lists, sorted, joined with commas.
local function list_names(dir, c)
  local status, body = H.request(dir, "GET", c.url .. "/v1/services")
  assert.equal(200, status, body)
  local out = {}
  for _, s in ipairs(H.json(body).services) do
    out[#out + 1] = s.service
  end
  table.sort(out)
  return table.concat(out, ",")
end

-- PUT (an instance) or DELETE; the answer's revision.
local function write(dir, c, method, svc, id)
  local status, body = H.request(dir, method, c.url .. "/v1/services/" .. svc .. "/instances/" .. id,
    { body = method == "PUT" and '{"url":"http://127.0.0.1:9","ttl_ms":60000}' or nil })
  assert.equal(200, status, body)
  return H.json(body).revision
end

describe("openmesh control --empty-service-ttl", function()
  if not H.bin or H.bin == "" then
    it("runs against OPENMESH_BIN", function()
      pending("OPENMESH_BIN is not set (make check sets it to build/bin/openmesh)")
    end)
    return
  end
  local dir
  setup(function()
    dir = H.tmpdir()
  end)
  teardown(function()
    H.kill_all()
    if dir then os.execute("rm -rf " .. H.q(dir)) end
  end)

  local function names(c) return list_names(dir, c) end
  local function put(c, svc, id) return write(dir, c, "PUT", svc, id) end
  local function delete(c, svc, id) return write(dir, c, "DELETE", svc, id) end

  it("removes what is empty and unwatched, keeps the rest, and a comeback moves forward", function()
    local c = H.start_control(dir, "--empty-service-ttl 1s --ping-interval 200ms")
    for _, s in ipairs({ "gone-a", "gone-b", "watched", "busy" }) do put(c, s, "i1") end
    local last_rev
    for _, s in ipairs({ "gone-a", "gone-b", "watched" }) do last_rev = delete(c, s, "i1") end
    -- a watcher of its own keeps "watched"
    local w = H.spawn(string.format("curl -sN %s/v1/watch/services/watched", H.q(c.url)), dir, "watcher")
    assert.truthy(H.wait_for(function()
      return H.readfile(w.out):find("event: snapshot", 1, true)
    end, 5), "the watch did not start")
    assert.equal("busy,gone-a,gone-b,watched", names(c))
    local listed = H.wait_for(function()
      local n = names(c)
      return n == "busy,watched" and n
    end, 5)
    assert.equal("busy,watched", listed)
    local _, metrics = H.request(dir, "GET", c.url .. "/metrics")
    assert.matches("openmesh_control_services_collected_total 2", metrics, 1, true)
    -- the two may be swept in one pass or in two (their deletes can
    -- straddle a sweep): the log lines' counts add up to two
    local logged = 0
    for n in H.readfile(c.out):gmatch('"event":"control_services_collected","count":"(%d+)"') do
      logged = logged + tonumber(n)
    end
    assert.equal(2, logged)
    local status = H.request(dir, "GET", c.url .. "/v1/services/gone-a")
    assert.equal(404, status)
    -- it comes back above every revision it had
    local rev = put(c, "gone-a", "i2")
    assert.is_true(rev > last_rev, ("comeback revision %s, last before %s"):format(rev, last_rev))
    -- the watcher goes: now "watched" is collected too
    H.kill(w.pid, "TERM")
    assert.equal("busy,gone-a", H.wait_for(function()
      local n = names(c)
      return n == "busy,gone-a" and n
    end, 5))
    assert.equal(0, H.stop(c))
  end)

  it("0 keeps every service; a bad value is a usage error naming the flag", function()
    local c = H.start_control(dir, "--empty-service-ttl 0 --ping-interval 100ms")
    put(c, "kept", "i1")
    delete(c, "kept", "i1")
    H.sleep(0.5)
    assert.equal("kept", names(c))
    assert.equal(0, H.stop(c))
    for _, bad in ipairs({ "ten", "-1s", "31d", "", "1s5" }) do
      local out, rc = H.sh(H.q(H.bin) .. " control --empty-service-ttl " .. H.q(bad) .. " 2>&1")
      assert.equal(2, rc, bad .. ": " .. out)
      assert.matches("--empty-service-ttl: '" .. bad .. "'", out, 1, true)
    end
  end)
end)

describe("openmesh control --empty-service-ttl on Redis", function()
  local R = require "redis_helper"
  if not H.bin or H.bin == "" or not R.available then
    it("runs against OPENMESH_BIN and a real redis-server", function()
      pending("needs OPENMESH_BIN and redis-server")
    end)
    return
  end
  local dir
  setup(function()
    dir = H.tmpdir()
  end)
  teardown(function()
    H.kill_all()
    R.stop_all()
    if dir then os.execute("rm -rf " .. H.q(dir)) end
  end)

  local function names(c) return list_names(dir, c) end

  -- until both planes list want (the last lists seen otherwise)
  local function both_list(a, b, want)
    local la, lb
    H.wait_for(function()
      la, lb = names(a), names(b)
      return la == want and lb == want
    end, 8)
    assert.equal(want, la, "plane A lists " .. la)
    assert.equal(want, lb, "plane B lists " .. lb)
  end

  it("collects once for every plane, keeps what a watcher on either plane holds, and a comeback moves forward", function()
    local redis = R.start()
    finally(function()
      H.kill_all()
      R.stop(redis)
    end)
    local args = string.format("--store %s --store-prefix gc: --empty-service-ttl 1s --ping-interval 200ms",
      redis.url)
    local a, b = H.start_control(dir, args), H.start_control(dir, args)
    for _, s in ipairs({ "gone-a", "gone-b", "watched", "busy" }) do write(dir, a, "PUT", s, "i1") end
    local last_rev
    for _, s in ipairs({ "gone-a", "gone-b", "watched" }) do last_rev = write(dir, b, "DELETE", s, "i1") end
    -- a watcher on B holds "watched": A must not collect it either
    local w = H.spawn(string.format("curl -sN %s/v1/watch/services/watched", H.q(b.url)), dir, "watcher")
    assert.truthy(H.wait_for(function()
      return H.readfile(w.out):find("event: snapshot", 1, true)
    end, 5), "the watch did not start")
    both_list(a, b, "busy,watched")
    -- gone from Redis itself, held in P watched
    local out = R.cli(redis, "HEXISTS gc:services gone-a")
    assert.equal("0", out:match("%d+"), "HEXISTS gc:services gone-a: " .. out)
    out = R.cli(redis, "ZSCORE gc:watched watched")
    assert.truthy(out:match("%d+"), "ZSCORE gc:watched watched: " .. out)
    for _, p in ipairs({ a, b }) do
      -- a plane's replica names what Redis collected at its next sweep
      local n
      H.wait_for(function()
        local _, metrics = H.request(dir, "GET", p.url .. "/metrics")
        n = tonumber(metrics:match("openmesh_control_services_collected_total (%d+)"))
        return n == 2
      end, 5)
      assert.equal(2, n, "services_collected_total " .. tostring(n))
      assert.is_nil(H.readfile(p.out):find("control_collect_unsupported", 1, true))
      assert.equal(404, (H.request(dir, "GET", p.url .. "/v1/services/gone-b")))
    end
    -- it comes back above every revision it had, on both planes
    local rev = write(dir, a, "PUT", "gone-a", "i2")
    assert.is_true(rev > last_rev, ("comeback revision %s, last before %s"):format(rev, last_rev))
    both_list(a, b, "busy,gone-a,watched")
    local status, body = H.request(dir, "GET", b.url .. "/v1/services/gone-a")
    assert.equal(200, status, body)
    assert.equal(rev, H.json(body).revision)
    -- the watcher goes: its hold runs out and "watched" is collected too
    H.kill(w.pid, "TERM")
    both_list(a, b, "busy,gone-a")
    assert.equal(0, H.stop(a))
    assert.equal(0, H.stop(b))
  end)
end)
