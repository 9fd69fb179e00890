-- control_warm_spec.lua: a control plane restarted with an empty store
-- (memory) warms up: for --warmup its snapshots carry "warming": true and
-- /readyz is 503, and a real `openmesh proxy` watching it merges those
-- snapshots with the peers it knew instead of replacing its topology, so
-- its peer count never drops while 30 `openmesh register` keepers come
-- back one by one. The same restart with --warmup 0 shows the drop the
-- window prevents. Bad --warmup values are refused with exit 2.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../support/?.lua;" .. package.path

local H = require "control_helper"
local R = require "redis_helper"

local N = 30

describe("control plane warm-up", function()
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
    R.stop_all()
    os.execute("rm -rf " .. H.q(dir))
  end)

  local function run(args)
    local out, rc = H.sh("timeout 10 " .. H.q(H.bin) .. " " .. args .. " 2>&1")
    return rc, out
  end

  describe("--warmup", function()
    local bad = { "abc", "-1s", "1.5s", "3", "10x", "25h", "86400001ms",
      "99999999999999999999999h", "", string.rep("9", 300) .. "s" }
    for _, v in ipairs(bad) do
      it("'" .. v:sub(1, 40) .. "': exit 2 naming the flag", function()
        local rc, out = run("control --listen 127.0.0.1:0 --warmup " .. H.q(v))
        assert.equal(2, rc, out)
        assert.matches("openmesh control: --warmup: ", out, 1, true)
        assert.matches("is not a duration from 0 to 24h", out, 1, true)
      end)
    end
    it("without a value: exit 2", function()
      local rc, out = run("control --listen 127.0.0.1:0 --warmup")
      assert.equal(2, rc, out)
      assert.matches("warmup", out, 1, true)
    end)
    it("--help documents it", function()
      local rc, out = run("control --help")
      assert.equal(0, rc, out)
      assert.matches("--warmup DURATION", out, 1, true)
      assert.matches("0: off", out, 1, true)
    end)
    it("24h is the largest window accepted", function()
      local c = H.start_control(dir, "--warmup 24h")
      local st, body = H.request(dir, "GET", c.url .. "/readyz")
      assert.equal(503, st, body)
      assert.truthy(H.json(body).warming_remaining_ms > 86000000, body)
      H.kill(c.pid, "KILL")
    end)
    it("0: no window, snapshots never carry warming", function()
      local c = H.start_control(dir, "--warmup 0")
      H.register(dir, c.url, "w0", "a", { url = "http://127.0.0.1:9", ttl_ms = 60000 })
      local st, body = H.request(dir, "GET", c.url .. "/readyz")
      assert.same({ 200, true }, { st, H.json(body).ready })
      st, body = H.request(dir, "GET", c.url .. "/v1/services/w0")
      assert.equal(200, st, body)
      assert.is_nil(body:find('"warming"', 1, true), body)
      H.kill(c.pid, "KILL")
    end)
    it("the default window is the longest lease TTL (1 h)", function()
      local p = H.spawn(H.q(H.bin) .. " control --listen 127.0.0.1:0", dir, "default_warm")
      assert.truthy(H.wait_for(function()
        return H.readfile(p.out):find('"event":"control_listening"', 1, true)
      end, 5), H.readfile(p.out))
      assert.matches('"event":"control_warming","store":"memory","window_ms":"3600000"',
        H.readfile(p.out), 1, true)
      H.kill(p.pid, "KILL")
    end)
  end)

  describe("a Redis store", function()
    if not R.available then
      it("runs with a real redis-server", function()
        pending("redis-server is not installed (scripts/deps installs it)")
      end)
      return
    end

    local function ready(c)
      local st, body = H.request(dir, "GET", c.url .. "/readyz")
      return st, H.json(body)
    end

    it("warms up when Redis was empty or came back empty, not when it kept its data",
      function()
        local redis = R.start()
        finally(function()
          H.kill_all()
          R.stop(redis)
        end)
        local args = string.format("--store %s --store-prefix warm: --warmup 2s", redis.url)
        -- an empty Redis at start (the epoch key is created): warming
        local a = H.start_control(dir, args)
        local st, body = ready(a)
        assert.same({ 503, { "warming" } }, { st, body.reasons })
        H.register(dir, a.url, "svc", "x", { url = "http://127.0.0.1:9", ttl_ms = 60000 })
        local s2, snap = H.request(dir, "GET", a.url .. "/v1/services/svc")
        assert.equal(200, s2, snap)
        assert.equal(true, H.json(snap).warming)
        assert.truthy(H.wait_for(function() return (ready(a)) == 200 end, 5))
        -- a second plane on the same, non-empty Redis: warm from the start
        local b = H.start_control(dir, args)
        st, body = ready(b)
        assert.same({ 200, true }, { st, body.ready })
        assert.is_nil(H.readfile(b.out):find('"event":"control_warming"', 1, true),
          H.readfile(b.out))
        local w = H.watch(dir, a.url .. "/v1/watch/services/svc", nil, 20)
        assert.equal(nil, H.json(H.wait_events(w, 1)[1].data).warming)
        -- Redis restarts without persistence: it lost everything, both
        -- planes warm up again, and their snapshots say so
        R.stop(redis)
        R.restart(redis)
        for _, c in ipairs { a, b } do
          assert.truthy(H.wait_for(function()
            local s3, b3 = ready(c)
            return s3 == 503 and b3.reasons[#b3.reasons] == "warming"
          end, 10), H.readfile(c.out))
          assert.matches('"event":"control_warming","store":"redis"', H.readfile(c.out), 1, true)
        end
        local evs = H.wait_for(function()
          local e = H.events(w)
          return #e >= 2 and H.json(e[#e].data).warming == true and e
        end, 5)
        assert.truthy(evs, H.readfile(w.file))
        -- and warm again after the window, with a resend
        assert.truthy(H.wait_for(function() return (ready(a)) == 200 end, 5))
        evs = H.wait_for(function()
          local e = H.events(w)
          return H.json(e[#e].data).warming == nil and e
        end, 5)
        assert.truthy(evs, H.readfile(w.file))
      end)
  end)

  describe("a plane restarted on an empty store", function()
    local function status(proxy)
      local st, body = H.request(dir, "GET", proxy.admin .. "/status")
      assert.equal(200, st, body)
      return H.json(body).watches.web
    end

    local function peers(proxy)
      local st, body = H.request(dir, "GET", proxy.admin .. "/metrics", { max_time = 2 })
      if st ~= 200 then
        return nil
      end
      return tonumber(body:match('openmesh_proxy_peers{service="web"} (%d+)'))
    end

    -- The instance counts the proxy applied (its watch_snapshot lines), from
    -- line `from` on.
    local function applied(proxy, from)
      local out, i = {}, 0
      for line in H.readfile(proxy.out):gmatch("[^\n]+") do
        if line:find('"event":"watch_snapshot"', 1, true) then
          i = i + 1
          if i >= from then
            out[#out + 1] = tonumber(line:match('"instances":"(%d+)"'))
          end
        end
      end
      return out, i
    end

    local function min_of(t)
      local m = math.huge
      for _, v in ipairs(t) do
        m = math.min(m, v)
      end
      return m
    end

    local function count_lines(p, needle)
      local n = 0
      for line in H.readfile(p.out):gmatch("[^\n]+") do
        n = n + (line:find(needle, 1, true) and 1 or 0)
      end
      return n
    end

    -- A plane, N keepers (ttl 6 s), a proxy watching, all warm. Then the
    -- keepers are stopped (SIGSTOP), the plane is killed (-9) and started
    -- again on the same port with --warmup warmup; once the proxy watches
    -- the new plane, the keepers go on (SIGCONT) one every 50 ms, so they
    -- re-register one by one as after a real restart, and the proxy's peer
    -- count is polled until the plane holds the fleet again (and 0.5 s
    -- more). The last keeper stays stopped: an instance that died with the
    -- plane, which the proxy keeps until the window ends.
    local n_run = 0
    local function restart_scenario(warmup)
      n_run = n_run + 1
      local a = H.start_control(dir, "--warmup 1500ms")
      local keepers = {}
      for i = 1, N do
        keepers[i] = H.spawn(string.format(
          "%s register --control %s --service web --id k%02d --url http://127.0.0.1:%d " ..
          "--ttl 6s --drain 0", H.q(H.bin), H.q(a.url), i, 20000 + i), dir,
          "keeper" .. n_run .. "_" .. i)
      end
      local proxy = H.start_proxy(dir, "proxy" .. n_run,
        "--control " .. H.q(a.url) .. " --service web")
      -- warm, and the whole fleet applied
      assert.truthy(H.wait_for(function()
        return status(proxy).warming == false and peers(proxy) == N
      end, 15), H.readfile(proxy.out))
      local _, before = applied(proxy, 1)
      local connected = count_lines(proxy, '"event":"watch_connected"')

      for _, k in ipairs(keepers) do
        H.kill(k.pid, "STOP")
      end
      H.kill(a.pid, "KILL")
      assert.truthy(H.wait_for(function() return not H.alive(a.pid) end, 5))
      local b = H.start_control(dir, string.format("--listen 127.0.0.1:%d --warmup %s",
        a.port, warmup))
      assert.equal(a.port, b.port)
      -- what the plane serves while its keepers come back
      local w = H.watch(dir, b.url .. "/v1/watch/services/web", nil, 30)
      assert.truthy(H.wait_for(function()
        return count_lines(proxy, '"event":"watch_connected"') > connected
      end, 10), H.readfile(proxy.out))
      local m = { min_polled = math.huge, polls = 0, ready = {}, healthz = {} }
      local function sample()
        local p = peers(proxy)
        if p then
          m.polls = m.polls + 1
          m.min_polled = math.min(m.min_polled, p)
        end
        if m.polls % 10 == 1 then
          local st, body = H.request(dir, "GET", b.url .. "/readyz")
          m.ready[#m.ready + 1] = { st, body }
          m.healthz[#m.healthz + 1] = (H.request(dir, "GET", b.url .. "/healthz"))
        end
      end
      local t0 = H.now()
      for i = 1, N - 1 do
        H.kill(keepers[i].pid, "CONT")
        sample()
        H.sleep(0.05)
      end
      local whole
      repeat
        sample()
        local gs, gb = H.request(dir, "GET", b.url .. "/v1/services/web")
        if not whole and gs == 200 and #H.json(gb).instances == N - 1 then
          whole = H.now()
        end
        H.sleep(0.03)
      until (whole and H.now() > whole + 0.5) or H.now() > t0 + 8
      assert.truthy(whole, "the keepers did not all come back within 8 s")
      m.back_s = whole - t0
      m.proxy, m.plane, m.watch, m.before, m.keepers = proxy, b, w, before, keepers
      return m
    end

    it("keeps the proxy's fleet whole while the plane warms up", function()
      -- the window covers the proxy's reconnect (its retry floor is the
      -- plane's 2 s) and the keepers' return, with room for a sanitized build
      local m = restart_scenario("12s")
      local proxy, b = m.proxy, m.plane
      -- the plane did serve a partial fleet, marked warming
      local evs = H.wait_events(m.watch, 1)
      local partial, smallest = 0, math.huge
      for _, ev in ipairs(evs) do
        local snap = H.json(ev.data)
        if snap.warming == true and #snap.instances < N then
          partial = partial + 1
          smallest = math.min(smallest, #snap.instances)
        end
      end
      assert.truthy(partial >= 1, "no partial warming snapshot: " .. H.readfile(m.watch.file))
      -- ... and the proxy never applied fewer peers than it had
      local counts = applied(proxy, m.before + 1)
      assert.truthy(#counts >= 1, H.readfile(proxy.out))
      assert.truthy(min_of(counts) >= N, "applied after the restart: " ..
        table.concat(counts, ",") .. "\n" .. H.readfile(proxy.out))
      assert.truthy(m.polls >= 20, "polls: " .. m.polls)
      assert.truthy(m.min_polled >= N, "lowest openmesh_proxy_peers polled: " .. m.min_polled)
      assert.truthy(H.readfile(proxy.out):find('"event":"watch_warming_merge"', 1, true),
        H.readfile(proxy.out))
      print(string.format("# warm restart: fleet back in %.2f s, plane served %d partial " ..
        "warming snapshots (smallest %d), proxy applied %d (lowest %d), %d polls (lowest %d)",
        m.back_s, partial, smallest, #counts, min_of(counts), m.polls, m.min_polled))
      -- not ready while warming, alive throughout
      local st, body = m.ready[1][1], m.ready[1][2]
      assert.equal(503, st, body)
      assert.same({ "warming" }, H.json(body).reasons)
      for _, s in ipairs(m.healthz) do
        assert.equal(200, s)
      end
      -- the one that never came back is kept while the plane warms
      assert.equal(true, status(proxy).warming)
      assert.equal(1, status(proxy).warming_kept)
      -- still warming: a keeper the plane has seen that leaves is gone from
      -- the proxy (only peers the plane never mentioned are kept)
      assert.equal(503, (H.request(dir, "GET", b.url .. "/readyz")))
      assert.equal(0, H.stop(m.keepers[7]))
      assert.truthy(H.wait_for(function() return peers(proxy) == N - 1 end, 5),
        "peers: " .. tostring(peers(proxy)) .. "\n" .. H.readfile(proxy.out))
      assert.equal(true, status(proxy).warming)
      assert.equal(1, status(proxy).warming_kept)
      -- the window ends: ready, snapshots without warming, pushed to watchers
      assert.truthy(H.wait_for(function()
        return (H.request(dir, "GET", b.url .. "/readyz")) == 200
      end, 15))
      assert.matches('"event":"control_warm"', H.readfile(b.out), 1, true)
      local code, snap = H.request(dir, "GET", b.url .. "/v1/services/web")
      assert.equal(200, code, snap)
      assert.is_nil(snap:find('"warming"', 1, true), snap)
      assert.equal(N - 2, #H.json(snap).instances)
      evs = H.wait_for(function()
        local e = H.events(m.watch)
        return #e > 0 and H.json(e[#e].data).warming == nil and e
      end, 5)
      assert.truthy(evs, H.readfile(m.watch.file))
      assert.equal(N - 2, #H.json(evs[#evs].data).instances)
      -- the proxy took it: warm again, nothing kept, the dead one gone
      assert.truthy(H.wait_for(function()
        local w = status(proxy)
        return w.warming == false and w.warming_kept == 0 and peers(proxy) == N - 2
      end, 5), H.readfile(proxy.out))
      assert.equal(H.rev(H.json(snap).revision), H.rev(status(proxy).revision))
      local _, metrics = H.request(dir, "GET", proxy.admin .. "/metrics")
      assert.matches('openmesh_watch_warming{service="web"} 0', metrics, 1, true)
      assert.truthy(tonumber(metrics:match(
        'openmesh_watch_warming_merges_total{service="web"} (%d+)')) >= 1, metrics)
      local _, pm = H.request(dir, "GET", b.url .. "/metrics")
      assert.matches("openmesh_control_warming 0\n", pm, 1, true)
      assert.matches("openmesh_control_warmups_total 1\n", pm, 1, true)
      H.kill_all()
    end)

    it("without a window the proxy drops to the partial fleet (what the window prevents)",
      function()
        local m = restart_scenario("0")
        local counts = applied(m.proxy, m.before + 1)
        assert.truthy(#counts >= 1, H.readfile(m.proxy.out))
        print(string.format("# no warm-up: proxy applied %d snapshots after the restart, " ..
          "lowest %d peers", #counts, min_of(counts)))
        assert.truthy(min_of(counts) < N, "applied after the restart: " ..
          table.concat(counts, ","))
        assert.is_nil(H.readfile(m.proxy.out):find('"event":"watch_warming_merge"', 1, true))
        H.kill_all()
      end)
  end)
end)
