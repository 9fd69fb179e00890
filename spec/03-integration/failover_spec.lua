-- failover_spec.lua: clients with several --control URLs, against two real
-- `openmesh control` planes sharing one real redis-server
-- (spec/support/redis_helper.lua). `register` keeps a lease alive through
-- the second plane when the first is killed; a proxy's watch moves to the
-- second plane, resumes there with Last-Event-ID (no snapshot delivered
-- twice) and routes to an instance registered after the kill. Bad --control
-- lists are refused with exit 2 naming the item.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../support/?.lua;" .. package.path

local H = require "control_helper"
local R = require "redis_helper"
local cjson = require "cjson"

local ECHO = here .. "../../tests/fixtures/echo_upstream.py"

local POLICY = [[
return {
  kind = "traffic",
  subset = function(_, peers) return peers end,
  retries = 2,
}
]]

describe("--control with several planes", function()
  if not H.bin or H.bin == "" then
    it("runs against OPENMESH_BIN", function()
      pending("OPENMESH_BIN is not set (make check sets it to build/bin/openmesh)")
    end)
    return
  end

  local dir
  local bin = "timeout 10 " .. H.q(H.bin) -- never left running
  setup(function()
    dir = H.tmpdir()
    H.writefile(dir .. "/traffic.lua", POLICY)
  end)
  teardown(function()
    H.kill_all()
    R.stop_all()
    os.execute("rm -rf " .. H.q(dir))
  end)

  -- Run a command to its end; its exit status and what it printed.
  local function run(args)
    local out, rc = H.sh(bin .. " " .. args .. " 2>&1")
    return rc, out
  end

  describe("bad input", function()
    local reg = " --service web --id w1 --url http://127.0.0.1:9 --ttl 1s"
    local prx = " --service web --listen 127.0.0.1:0 --admin 127.0.0.1:0"
    local cases = {
      { "http://127.0.0.1:1,,http://127.0.0.1:2", "has an empty item" },
      { ",http://127.0.0.1:1", "has an empty item" },
      { "http://127.0.0.1:1,", "has an empty item" },
      { "", "has an empty item" },
      { "http://127.0.0.1:1,ftp://x", "'ftp://x': url must be an absolute http://" },
      { "http://127.0.0.1:1,http://u@h:1", "'http://u@h:1': url must not carry userinfo" },
      { "http://127.0.0.1:1,http://h:1/?q", "'http://h:1/?q': url must not carry a query" },
      { "http://127.0.0.1:1,http://127.0.0.1:1/", "'http://127.0.0.1:1/' is given twice" },
      { "HTTP://LOCALHOST:1,http://localhost:1", "'http://localhost:1' is given twice" },
    }
    for _, cmd in ipairs({ { "register", reg }, { "proxy", prx } }) do
      for _, c in ipairs(cases) do
        it(cmd[1] .. " --control '" .. c[1] .. "': exit 2 naming it", function()
          local rc, out = run(cmd[1] .. " --control " .. H.q(c[1]) .. cmd[2])
          assert.equal(2, rc, out)
          assert.matches("openmesh " .. cmd[1] .. ": --control: ", out, 1, true)
          assert.matches(c[2], out, 1, true)
        end)
      end
      it(cmd[1] .. ": a duplicate across repeated flags is refused too", function()
        local rc, out = run(cmd[1] .. " --control http://127.0.0.1:1,http://127.0.0.1:2" ..
          " --control http://127.0.0.1:2" .. cmd[2])
        assert.equal(2, rc, out)
        assert.matches("'http://127.0.0.1:2' is given twice", out, 1, true)
      end)
    end
    it("register: more than 16 planes is refused", function()
      local urls = {}
      for i = 1, 17 do
        urls[i] = "http://127.0.0.1:" .. (1000 + i)
      end
      local rc, out = run("register --control " .. table.concat(urls, ",") .. reg)
      assert.equal(2, rc, out)
      assert.matches("more than 16 control planes", out, 1, true)
    end)
    it("up: --control with --store, or a bad list, is exit 2", function()
      local rc, out = run("up --control http://127.0.0.1:1 --store memory")
      assert.equal(2, rc, out)
      assert.matches("not with --control", out, 1, true)
      rc, out = run("up --control 'http://127.0.0.1:1,,http://127.0.0.1:2'")
      assert.equal(2, rc, out)
      assert.matches("has an empty item", out, 1, true)
    end)
    it("register --help names the list form", function()
      local rc, out = run("register --help")
      assert.equal(0, rc)
      assert.matches("--control URL[,URL...]", out, 1, true)
    end)
  end)

  describe("two planes on one Redis", function()
    if not R.available then
      it("runs with a real redis-server", function()
        pending("redis-server is not installed (scripts/deps installs it)")
      end)
      return
    end

    local n_prefix = 0
    local function planes(redis)
      n_prefix = n_prefix + 1
      local args = string.format("--store %s --store-prefix fo%d", redis.url, n_prefix)
      return H.start_control(dir, args), H.start_control(dir, args)
    end

    local function ids(plane, service)
      local status, body = H.request(dir, "GET", plane.url .. "/v1/services/" .. service)
      if status ~= 200 then
        return nil, status
      end
      local out = {}
      for _, i in ipairs(H.json(body).instances) do
        out[#out + 1] = i.id
      end
      table.sort(out)
      return table.concat(out, ","), H.json(body).revision
    end

    local function log_lines(p, ...)
      local needles, n = { ... }, 0
      for line in H.readfile(p.out):gmatch("[^\n]+") do
        local all = true
        for _, s in ipairs(needles) do
          all = all and line:find(s, 1, true) ~= nil
        end
        n = n + (all and 1 or 0)
      end
      return n
    end

    it("register keeps the lease alive through B when A is killed", function()
      local redis = R.start()
      finally(function()
        H.kill_all()
        R.stop(redis)
      end)
      local a, b = planes(redis)
      local reg = H.spawn(string.format(
        "%s register --control %s --control %s --service web --id w1 " ..
        "--url http://127.0.0.1:9 --ttl 1s --drain 0",
        H.q(H.bin), H.q(a.url), H.q(b.url)), dir, "reg1")
      assert.truthy(H.wait_for(function() return ids(b, "web") == "w1" end, 5),
        H.readfile(reg.out))
      -- the first plane given is the one used while it works
      assert.equal(0, log_lines(reg, '"event":"control_failover"'))
      H.kill(a.pid, "KILL")
      assert.truthy(H.wait_for(function() return not H.alive(a.pid) end, 5))
      -- three TTLs: without the move the lease would be gone after one
      local t_end, seen, polls = H.now() + 3, 0, 0
      repeat
        polls = polls + 1
        if ids(b, "web") == "w1" then
          seen = seen + 1
        end
        H.sleep(0.1)
      until H.now() > t_end
      assert.equal(polls, seen, H.readfile(reg.out))
      assert.truthy(log_lines(reg, '"event":"control_failover"', '"from":"' .. a.url .. '"',
        '"to":"' .. b.url .. '"') >= 1, H.readfile(reg.out))
      assert.truthy(log_lines(reg, '"event":"registered"', '"control":"' .. b.url .. '"') >= 1,
        H.readfile(reg.out))
      -- SIGTERM removes the lease through B
      assert.equal(0, H.stop(reg))
      assert.equal("", (ids(b, "web")))
    end)

    it("a proxy's watch moves to B, resumes without a duplicate and routes to a newcomer", function()
      if not H.sh("command -v python3 >/dev/null && echo yes"):find("yes", 1, true) then
        pending("python3 is not installed (scripts/deps installs it)")
        return
      end
      local redis = R.start()
      finally(function()
        H.kill_all()
        R.stop(redis)
      end)
      local a, b = planes(redis)
      local function echo(name, who)
        local p = H.spawn(string.format("python3 %s --port 0 --header %s", H.q(ECHO),
          H.q("X-Who: " .. who)), dir, name)
        local port = H.wait_for(function()
          return tonumber(H.readfile(p.out):match("listening (%d+)"))
        end, 10)
        assert(port, name .. " did not start: " .. H.readfile(p.out))
        return "http://127.0.0.1:" .. port
      end
      local old_url, new_url = echo("echo_old", "old"), echo("echo_new", "new")
      H.register(dir, a.url, "web", "old", { url = old_url, ttl_ms = 60000 })
      local proxy = H.start_proxy(dir, "proxy_fo", string.format(
        "--policy %s --control %s --service web", H.q(dir .. "/traffic.lua"),
        H.q(a.url .. "," .. b.url)))
      local function status()
        local st, body = H.request(dir, "GET", proxy.admin .. "/status")
        assert.equal(200, st, body)
        return H.json(body)
      end
      local function who()
        local st, _, headers = H.request(dir, "GET", proxy.url .. "/", { headers = { "Host: web" } })
        return st == 200 and headers["x-who"] or st
      end
      assert.truthy(H.wait_for(function() return who() == "old" end, 5), H.readfile(proxy.out))
      local before = status().watches.web
      assert.equal(a.url, before.control)
      assert.same({ a.url, b.url }, before.control_planes)
      assert.equal(0, before.failovers)
      local applied = log_lines(proxy, '"event":"watch_snapshot"')

      H.kill(a.pid, "KILL")
      assert.truthy(H.wait_for(function()
        local w = status().watches.web
        return w.control == b.url and w.state == "streaming"
      end, 5), H.readfile(proxy.out))
      -- resumed with the revision it holds: B had nothing newer to send
      assert.truthy(log_lines(proxy, '"event":"watch_connected"', '"control":"' .. b.url .. '"',
        '"last_event_id":"' .. H.rev(before.revision) .. '"') >= 1, H.readfile(proxy.out))
      local after = status().watches.web
      assert.equal(before.revision, after.revision)
      assert.equal(before.snapshots, after.snapshots)
      assert.equal(0, after.duplicates)
      assert.equal(applied, log_lines(proxy, '"event":"watch_snapshot"'))
      assert.equal(1, after.failovers)
      assert.truthy(log_lines(proxy, '"event":"watch_failover"', '"from":"' .. a.url .. '"',
        '"to":"' .. b.url .. '"') == 1, H.readfile(proxy.out))
      local _, metrics = H.request(dir, "GET", proxy.admin .. "/metrics")
      assert.matches('openmesh_proxy_watch_failovers_total{service="web"} 1', metrics, 1, true)
      assert.matches('openmesh_proxy_watch_plane{service="web",plane="' .. b.url .. '"} 1',
        metrics, 1, true)
      assert.matches('openmesh_proxy_watch_plane{service="web",plane="' .. a.url .. '"} 0',
        metrics, 1, true)

      -- a change made on B after the kill reaches the proxy, once
      H.register(dir, b.url, "web", "new", { url = new_url, ttl_ms = 60000 })
      assert.equal(200, (H.request(dir, "DELETE", b.url .. "/v1/services/web/instances/old")))
      assert.truthy(H.wait_for(function() return who() == "new" end, 5), H.readfile(proxy.out))
      for _ = 1, 10 do
        assert.equal("new", who())
      end
      local last = status().watches.web
      assert.truthy(last.revision > before.revision)
      assert.equal(0, last.duplicates)
      assert.equal(last.snapshots - before.snapshots,
        log_lines(proxy, '"event":"watch_snapshot"') - applied)
    end)

    it("up --control joins the planes: routes, keeps the lease through B, deletes it on stop", function()
      local redis = R.start()
      finally(function()
        H.kill_all()
        R.stop(redis)
      end)
      local a, b = planes(redis)
      local updir = dir .. "/up" .. n_prefix
      os.execute("mkdir -p " .. H.q(updir))
      local port
      math.randomseed(os.time() + tonumber(tostring({}):match("0x(%x+)"), 16) % 1000)
      local up
      for _ = 1, 4 do
        port = 21000 + math.random(0, 400) * 10
        H.writefile(updir .. "/up.json", cjson.encode({
          control = { host = "127.0.0.1", port = 7600 },
          proxy = { port = 0, admin_port = 0, policy = dir .. "/traffic.lua" },
          services = { { service = "orders", id = "o-1", port = port, behaviour = "fast",
            zone = "z1", metadata = { version = "v1" } } },
        }))
        up = H.start_up(dir, "up_join" .. port, string.format("--control %s --control %s %s",
          H.q(a.url), H.q(b.url), H.q(updir)))
        if up then break end
      end
      assert(up, "openmesh up --control did not start")
      local out = H.readfile(up.out)
      assert.matches("control planes  " .. a.url .. "," .. b.url .. "   (joined)", out, 1, true)
      local pport, aport = out:match("proxy           http://127%.0%.0%.1:(%d+)   %(admin: http://127%.0%.0%.1:(%d+)/status%)")
      assert.truthy(pport, out)
      -- no control plane of its own: the registry is the planes'
      assert.truthy(H.wait_for(function() return ids(b, "orders") == "o-1" end, 5), H.readfile(up.out))
      local _, body = H.request(dir, "GET", b.url .. "/v1/services/orders")
      local inst = H.json(body).instances[1]
      assert.equal("http://127.0.0.1:" .. port, inst.url)
      assert.equal("z1", inst.zone)
      assert.equal("v1", inst.metadata.version)
      local function call()
        return (H.request(dir, "GET", "http://127.0.0.1:" .. pport .. "/", { headers = { "Host: orders" } }))
      end
      assert.truthy(H.wait_for(function() return call() == 200 end, 5), H.readfile(up.out))

      H.kill(a.pid, "KILL")
      local function watch_plane()
        local st, b2 = H.request(dir, "GET", "http://127.0.0.1:" .. aport .. "/status")
        return st == 200 and H.json(b2).watches.orders.control
      end
      assert.truthy(H.wait_for(function() return watch_plane() == b.url end, 5), H.readfile(up.out))
      assert.equal(200, call())
      -- the keeper's next renewal (every ~3.3 s of its 10 s lease) moves to B
      assert.truthy(H.wait_for(function()
        return log_lines(up, '"event":"control_failover"', '"service":"orders"', '"to":"' .. b.url .. '"') >= 1
      end, 8), H.readfile(up.out))
      assert.equal("o-1", (ids(b, "orders")))
      -- SIGTERM: the keeper deletes the lease (through B), then up exits 0
      assert.equal(0, H.stop(up))
      assert.equal("", (ids(b, "orders")))
    end)

  end)
end)
