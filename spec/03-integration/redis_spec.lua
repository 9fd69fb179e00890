-- redis_spec.lua: several real `openmesh control` processes sharing one
-- real redis-server (spec/support/redis_helper.lua): what one control
-- plane accepts, every other serves and streams; leases expire once; a
-- control plane killed with kill -9 loses nothing it did not own; Redis
-- restarts, with and without persistence, never make a watcher go back.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../support/?.lua;" .. package.path

local H = require "control_helper"
local R = require "redis_helper"

local function inst(url, ttl_ms)
  return { url = url, ttl_ms = ttl_ms or 10000 }
end

local function ids_of(snapshot)
  local ids = {}
  for _, i in ipairs(snapshot.instances) do
    ids[#ids + 1] = i.id
  end
  return ids
end

-- Revisions of a watch's events, checked strictly increasing.
local function assert_increasing(evs)
  for i = 2, #evs do
    assert.is_true(tonumber(evs[i].id) > tonumber(evs[i - 1].id),
      "event " .. i .. ": revision " .. evs[i].id .. " after " .. evs[i - 1].id)
  end
end

describe("two control planes on one Redis", function()
  if not H.bin or H.bin == "" or not R.available then
    it("runs against OPENMESH_BIN and a real redis-server", function()
      pending("needs OPENMESH_BIN and redis-server")
    end)
    return
  end

  local dir, n = nil, 0
  setup(function()
    dir = H.tmpdir()
  end)
  teardown(function()
    H.kill_all()
    R.stop_all()
    os.execute("rm -rf " .. H.q(dir))
  end)

  local function plane(redis, prefix, args)
    return H.start_control(dir, string.format("--store %s --store-prefix %s %s",
      redis.url, prefix, args or ""))
  end

  -- the registration log lines of a plane that contain every needle
  local function registration_lines(p, ...)
    local needles, lines = { '"event":"registration"', ... }, {}
    for line in H.readfile(p.out):gmatch("[^\n]+") do
      local all = true
      for _, s in ipairs(needles) do
        all = all and line:find(s, 1, true) ~= nil
      end
      if all then
        lines[#lines + 1] = line
      end
    end
    return lines
  end

  local function get(c, service, query)
    local status, body = H.request(dir, "GET",
      c.url .. "/v1/services/" .. service .. (query or ""))
    return status, status == 200 and H.json(body) or body
  end

  it("registers on A, watches on B, expires once, deletes on B, pages across both", function()
    local redis = R.start()
    finally(function()
      H.kill_all()
      R.stop(redis)
    end)
    n = n + 1
    local a, b = plane(redis, "x" .. n .. ":"), plane(redis, "x" .. n .. ":")
    local w = H.watch(dir, b.url .. "/v1/watch/services/orders", nil, 20)
    local r1 = H.register(dir, a.url, "orders", "keep", inst("http://10.0.0.1:80", 60000))
    local evs = H.wait_events(w, 1)
    assert.equal(H.rev(r1.revision), evs[#evs].id)
    assert.same({ "keep" }, ids_of(H.json(evs[#evs].data)))
    -- each plane logs the change once: B from the store's event, A from
    -- whichever comes first, the write's answer or its own change coming
    -- back through pub/sub, never both, and with the caller's address
    -- either way
    H.sleep(0.3)
    local la, lb = registration_lines(a, '"id":"keep"'), registration_lines(b, '"id":"keep"')
    assert.equal(1, #la, table.concat(la, "\n"))
    assert.equal(1, #lb, table.concat(lb, "\n"))
    assert.matches('"change":"created"', la[1], 1, true)
    assert.matches('"remote":"127.0.0.1"', la[1], 1, true)
    assert.matches('"remote":null', lb[1], 1, true)
    assert.matches('"change":"created"', lb[1], 1, true)
    -- a lease registered on A expires once (one revision), seen by B's watcher
    local r2 = H.register(dir, a.url, "orders", "short", inst("http://10.0.0.2:80", 1000))
    evs = H.wait_events(w, 3, 5)
    assert.equal(3, #evs)
    assert.same({ "keep" }, ids_of(H.json(evs[3].data)))
    assert.is_true(tonumber(evs[3].id) > r2.revision)
    H.sleep(0.6) -- both planes keep sweeping: no second revision for it
    assert.equal(3, #H.events(w))
    local _, sa = get(a, "orders")
    local _, sb = get(b, "orders")
    assert.equal(sa.revision, sb.revision)
    assert.equal(evs[3].id, H.rev(sb.revision))
    -- each plane logs the expiry it observed; the revision was issued once
    assert.matches('"change":"expired","service":"orders","id":"short"', H.readfile(a.out), 1, true)
    assert.matches('"change":"expired","service":"orders","id":"short"', H.readfile(b.out), 1, true)
    -- delete on B, seen on A
    local status = H.request(dir, "DELETE", b.url .. "/v1/services/orders/instances/keep")
    assert.equal(200, status)
    _, sa = get(a, "orders")
    assert.same({}, ids_of(sa))
    -- ... and logged on A as the deletion it was (the message says why)
    H.sleep(0.3)
    assert.matches('"change":"deleted","service":"orders","id":"keep"', H.readfile(a.out), 1, true)
    assert.is_nil(H.readfile(a.out):find('"change":"expired","service":"orders","id":"keep"', 1, true))
    -- page tokens minted on A are valid on B at the same revision
    for i = 1, 7 do
      H.register(dir, (i % 2 == 0) and a.url or b.url, "pages", string.format("p%02d", i),
        inst("http://10.0.1." .. i .. ":80", 60000))
    end
    local seen, token, from = {}, nil, a
    repeat
      local s, page = get(from, "pages", "?page_size=3" .. (token and ("&page_token=" .. token) or ""))
      assert.equal(200, s)
      for _, id in ipairs(ids_of(page)) do
        seen[#seen + 1] = id
      end
      token = page.next_page_token ~= require("cjson").null and page.next_page_token or nil
      from = (from == a) and b or a
    until not token
    assert.same({ "p01", "p02", "p03", "p04", "p05", "p06", "p07" }, seen)
    assert.equal(0, H.stop(a))
    assert.equal(0, H.stop(b))
  end)

  -- The write's answer and the change's pub/sub echo come on two Redis
  -- connections, in either order (on this machine the echo was first for
  -- about one write in ten). Either way the writing plane's one line names
  -- the caller; the other plane's has no caller.
  it("logs each of its own writes once with the caller's address, whichever of answer and echo comes first", function()
    local redis = R.start()
    finally(function()
      H.kill_all()
      R.stop(redis)
    end)
    n = n + 1
    local a, b = plane(redis, "r" .. n .. ":"), plane(redis, "r" .. n .. ":")
    local N = 40
    for i = 1, N do
      H.register(dir, a.url, "audit", "i" .. i, inst("http://10.0.2." .. i .. ":80", 60000))
    end
    for i = 1, 10 do -- updated: another URL
      H.register(dir, a.url, "audit", "i" .. i, inst("http://10.0.3." .. i .. ":80", 60000))
    end
    for i = 11, 20 do
      assert.equal(200, (H.request(dir, "DELETE", a.url .. "/v1/services/audit/instances/i" .. i)))
    end
    local want = N + 20
    local function lines(p)
      return registration_lines(p, '"service":"audit"')
    end
    assert.is_true(H.wait_for(function() return #lines(a) >= want and #lines(b) >= want end, 5))
    H.sleep(0.3) -- nothing logged twice comes late
    local la, lb = lines(a), lines(b)
    assert.equal(want, #la, table.concat(la, "\n"))
    assert.equal(want, #lb, table.concat(lb, "\n"))
    local changes = {}
    for _, line in ipairs(la) do
      assert.matches('"remote":"127.0.0.1"', line, 1, true)
      local change = line:match('"change":"(%a+)"')
      changes[change] = (changes[change] or 0) + 1
    end
    assert.same({ created = N, updated = 10, deleted = 10 }, changes)
    for _, line in ipairs(lb) do
      assert.matches('"remote":null', line, 1, true)
    end
  end)

  it("loses nothing registered through B when A is killed with kill -9 under 1,000 heartbeating instances", function()
    local redis = R.start()
    finally(function()
      H.kill_all()
      R.stop(redis)
    end)
    n = n + 1
    local a, b = plane(redis, "k" .. n .. ":"), plane(redis, "k" .. n .. ":")
    -- 500 instances through each plane, one curl per batch (keep-alive)
    local body = dir .. "/fleet.json"
    H.writefile(body, '{"url":"http://10.9.0.1:80","ttl_ms":2000}')
    local function urls(base, prefix, suffix)
      local t = {}
      for i = 1, 500 do
        t[#t + 1] = H.q(string.format("%s/v1/services/fleet/instances/%s%03d%s", base, prefix, i, suffix))
      end
      return table.concat(t, " ")
    end
    local reg_a, reg_b = urls(a.url, "a", ""), urls(b.url, "b", "")
    H.sh(H.curl(30) .. " -s -o /dev/null -X PUT --data-binary @" .. H.q(body) .. " " .. reg_a)
    H.sh(H.curl(30) .. " -s -o /dev/null -X PUT --data-binary @" .. H.q(body) .. " " .. reg_b)
    local _, snap = get(b, "fleet")
    assert.equal(1000, #snap.instances)
    -- heartbeats every 400 ms through the plane each instance registered on
    local hb = function(u)
      local script = dir .. "/hb" .. u:sub(1, 1) .. ".sh"
      return script
    end
    local sa, sb = hb("a"), hb("b")
    H.writefile(sa, "while :; do " .. H.curl(5) .. " -s -o /dev/null -X POST " ..
      urls(a.url, "a", "/heartbeat") .. "; sleep 0.4; done\n")
    H.writefile(sb, "while :; do " .. H.curl(5) .. " -s -o /dev/null -X POST " ..
      urls(b.url, "b", "/heartbeat") .. "; sleep 0.4; done\n")
    H.spawn("sh " .. H.q(sa), dir, "hb_a")
    H.spawn("sh " .. H.q(sb), dir, "hb_b")
    local w = H.watch(dir, b.url .. "/v1/watch/services/fleet", nil, 30)
    H.wait_events(w, 1)
    H.sleep(2.5) -- longer than the ttl: heartbeats keep all 1,000
    _, snap = get(b, "fleet")
    assert.equal(1000, #snap.instances)
    H.kill(a.pid, "KILL")
    local t0 = H.now()
    -- A's 500 stop being renewed: gone within ttl + 1 s (+ the last renewal)
    local left = H.wait_for(function()
      local s, sn = get(b, "fleet")
      return s == 200 and #sn.instances == 500 and sn
    end, 6, 0.1)
    assert.is_truthy(left, "A's instances did not expire")
    assert.is_true(H.now() - t0 <= 3.5, "expired after " .. (H.now() - t0) .. " s")
    for _, id in ipairs(ids_of(left)) do
      assert.equal("b", id:sub(1, 1))
    end
    H.sleep(1.0)
    _, snap = get(b, "fleet")
    assert.equal(500, #snap.instances) -- nothing registered through B is lost
    local evs = H.events(w)
    assert.is_true(#evs >= 2)
    assert_increasing(evs)
    assert.equal(500, #H.json(evs[#evs].data).instances)
    assert.equal(0, H.stop(b))
  end)

  it("never answers \"not applied\" for a write Redis applied, across a kill -9 of Redis", function()
    local redis = R.start({ persist = true })
    finally(function()
      H.kill_all()
      R.stop(redis)
    end)
    n = n + 1
    local prefix = "o" .. n .. ":"
    local a = plane(redis, prefix)
    -- 600 registrations from 4 threads, each answer as "id status outcome"
    local results = dir .. "/outcomes" .. n
    local script = dir .. "/writer" .. n .. ".py"
    H.writefile(script, [=[
import http.client, json, sys, threading
host, port, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
lock = threading.Lock()
f = open(out, "w")
def run(k):
    c = http.client.HTTPConnection(host, port, timeout=10)
    for i in range(k, 600, 4):
        body = json.dumps({"url": "http://10.1.%d.%d:80" % (i // 250, i % 250), "ttl_ms": 600000})
        try:
            c.request("PUT", "/v1/services/svc/instances/i%d" % i, body, {"Content-Type": "application/json"})
            r = c.getresponse()
            doc = json.loads(r.read() or b"{}")
            status, outcome = r.status, doc.get("outcome", "-")
        except Exception:
            c.close()
            c = http.client.HTTPConnection(host, port, timeout=10)
            status, outcome = 0, "-"
        with lock:
            f.write("i%d %d %s\n" % (i, status, outcome))
            f.flush()
ts = [threading.Thread(target=run, args=(k,)) for k in range(4)]
[t.start() for t in ts]
[t.join() for t in ts]
f.write("done\n")
f.close()
]=])
    local port = a.url:match(":(%d+)$")
    local w = H.spawn("python3 " .. H.q(script) .. " 127.0.0.1 " .. port .. " " .. H.q(results), dir, "writer" .. n)
    local function answered()
      local k = 0
      for _ in H.readfile(results):gmatch("\n") do
        k = k + 1
      end
      return k
    end
    assert.is_truthy(H.wait_for(function() return answered() >= 100 end, 20),
      "the writer got no answers: " .. H.readfile(w.out))
    R.stop(redis) -- mid-stream: some writes are in flight
    H.sleep(0.3)
    R.restart(redis)
    assert.is_truthy(H.wait_for(function() return H.readfile(results):find("done\n", 1, true) end, 60),
      "the writer did not finish: " .. H.readfile(w.out))
    local counts, wrong, stored = {}, {}, {}
    for id in R.cli(redis, "HKEYS " .. prefix .. "i:svc"):gmatch("i%d+") do
      stored[id] = true
    end
    for id, status, outcome in H.readfile(results):gmatch("(i%d+) (%d+) (%S+)") do
      local key = outcome == "-" and status or outcome
      counts[key] = (counts[key] or 0) + 1
      local held = stored[id] and "1" or "0"
      if outcome == "not_applied" and held ~= "0" then
        wrong[#wrong + 1] = id .. " answered not_applied but Redis holds it"
      elseif (status == "200" or status == "201") and held ~= "1" then
        wrong[#wrong + 1] = id .. " answered " .. status .. " but Redis lacks it"
      end
    end
    local shown = {}
    for k, v in pairs(counts) do
      shown[#shown + 1] = k .. "=" .. v
    end
    table.sort(shown)
    print("# answers across the Redis kill: " .. table.concat(shown, " "))
    assert.same({}, wrong)
    assert.is_truthy((counts["201"] or 0) + (counts["200"] or 0) > 0, table.concat(shown, " "))
    assert.equal(0, H.stop(a))
  end)

  for _, persist in ipairs { false, true } do
    it("recovers watchers across a Redis restart " .. (persist and "with" or "without") ..
      " persistence, never going back", function()
      local redis = R.start({ persist = persist })
      finally(function()
        H.kill_all()
        R.stop(redis)
      end)
      n = n + 1
      local a, b = plane(redis, "r" .. n .. ":"), plane(redis, "r" .. n .. ":")
      local r1 = H.register(dir, a.url, "svc", "x", inst("http://10.0.0.1:80", 60000))
      local w = H.watch(dir, b.url .. "/v1/watch/services/svc", nil, 30)
      local wall = H.watch(dir, b.url .. "/v1/watch/services", nil, 30)
      H.wait_events(w, 1)
      H.wait_events(wall, 1)
      R.stop(redis)
      -- stale: reads serve the last good state, writes fail with a reason
      assert.is_truthy(H.wait_for(function()
        local _, body = H.request(dir, "GET", b.url .. "/status")
        return H.json(body).stale == true
      end, 5))
      local s, body = H.request(dir, "GET", b.url .. "/metrics")
      assert.equal(200, s)
      assert.matches("openmesh_control_store_stale 1\n", body, 1, true)
      -- not ready (traffic should go elsewhere), still alive
      s, body = H.request(dir, "GET", b.url .. "/readyz")
      assert.same({ 503, { "store_unreachable" } }, { s, H.json(body).reasons })
      assert.equal(200, (H.request(dir, "GET", b.url .. "/healthz")))
      local snap
      s, snap = get(b, "svc")
      assert.equal(200, s)
      assert.same({ "x" }, ids_of(snap))
      s, body = H.request(dir, "PUT", a.url .. "/v1/services/svc/instances/y",
        { body = '{"url":"http://10.0.0.2:80","ttl_ms":60000}' })
      assert.equal(503, s)
      assert.equal("unavailable", H.json(body).error)
      assert.matches("store is unreachable", H.json(body).message, 1, true)
      R.restart(redis)
      assert.is_truthy(H.wait_for(function()
        local _, st = H.request(dir, "GET", b.url .. "/status")
        return H.json(st).stale == false
      end, 8))
      assert.equal(200, (H.request(dir, "GET", b.url .. "/readyz")))
      local evs
      if persist then
        -- Redis kept everything: the same state, no spurious event
        s, snap = get(b, "svc")
        assert.same({ "x" }, ids_of(snap))
        assert.equal(r1.revision, snap.revision)
      else
        -- Redis lost everything: watchers move to the truth (empty) at a
        -- revision above anything they saw
        evs = H.wait_events(w, 2, 8)
        assert.equal(2, #evs)
        assert.same({}, ids_of(H.json(evs[2].data)))
        assert.matches('"event":"store_data_lost"', H.readfile(b.out), 1, true)
      end
      -- life goes on: a new registration reaches B's watchers above all
      local r2 = H.register(dir, a.url, "svc", "z", inst("http://10.0.0.3:80", 60000))
      evs = H.wait_events(w, persist and 2 or 3, 5)
      assert.equal(H.rev(r2.revision), evs[#evs].id)
      assert_increasing(evs)
      local all = H.wait_events(wall, persist and 2 or 3, 5)
      assert_increasing(all)
      assert.equal(0, H.stop(a))
      assert.equal(0, H.stop(b))
    end)
  end
end)
