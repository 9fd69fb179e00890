-- control_tls_spec.lua: the clients of an HTTPS control plane, with the
-- real binaries. `openmesh register` trusts the plane's private CA through
-- --control-ca and keeps its lease (without it: a logged verification
-- error, retried); register and a proxy's watch authenticated by a client
-- certificate alone (--control-cert/--control-key, a `san:` line in the
-- plane's --tokens); failover between two HTTPS planes on one real
-- redis-server; bad --control-* files refused at start with exit 2 naming
-- the flag. Certificates are made for the run by tests/fixtures/tls_certs.sh.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../support/?.lua;" .. package.path

local H = require "control_helper"
local R = require "redis_helper"
local cjson = require "cjson"

local q = H.q
local ECHO = here .. "../../tests/fixtures/echo_upstream.py"

describe("clients of an HTTPS control plane", function()
  if not H.bin or H.bin == "" then
    it("runs against OPENMESH_BIN", function()
      pending("OPENMESH_BIN is not set (make check sets it to build/bin/openmesh)")
    end)
    return
  end

  local dir, certs
  local bin = "timeout 10 " .. q(H.bin) -- usage checks: never left running
  local n = 0

  setup(function()
    dir = H.tmpdir()
    certs = dir .. "/certs"
    local out, rc = H.sh("tests/fixtures/tls_certs.sh " .. q(certs) .. " 2>&1")
    assert(rc == 0, "tls_certs.sh: " .. out)
    H.writefile(dir .. "/traffic.lua", [[
return {
  kind = "traffic",
  subset = function(_, peers) return peers end,
  retries = 2,
}
]])
  end)

  teardown(function()
    H.kill_all()
    R.stop_all()
    if dir then
      os.execute("rm -rf " .. q(dir))
    end
  end)

  local function cert(name)
    return q(certs .. "/" .. name)
  end

  -- `openmesh control` over HTTPS on a free port; p.url is its https URL.
  local function start_control(args)
    n = n + 1
    local p = H.spawn(q(H.bin) .. " control --listen 127.0.0.1:0 --tls-cert " .. cert("server.pem") ..
      " --tls-key " .. cert("server.key") .. " " .. (args or ""), dir, "control" .. n)
    local port = H.wait_for(function()
      local port = H.readfile(p.out):match('"event":"control_listening","url":"https://127%.0%.0%.1:(%d+)"')
      if port then
        return tonumber(port)
      end
      if H.readfile(p.rcfile) ~= "" then
        return -1
      end
    end, 10)
    assert(port and port > 0, "control did not start: " .. H.readfile(p.out))
    p.port = port
    p.url = "https://127.0.0.1:" .. port
    return p
  end

  -- curl over TLS trusting the test CA: status (0: no answer) and body.
  -- opts: method, body, cert (a client certificate's base name), token.
  local function https(url, opts)
    opts = opts or {}
    n = n + 1
    local bodyfile = dir .. "/body" .. n
    local args = { H.curl(5), "-s", "-o", q(bodyfile), "-w", "'%{http_code}'",
      "--cacert " .. cert("ca.pem") }
    if opts.cert then
      args[#args + 1] = "--cert " .. cert(opts.cert .. ".pem") .. " --key " .. cert(opts.cert .. ".key")
    end
    if opts.token then
      args[#args + 1] = "-H " .. q("Authorization: Bearer " .. opts.token)
    end
    if opts.method then
      args[#args + 1] = "-X " .. opts.method
    end
    if opts.body then
      H.writefile(dir .. "/req" .. n, opts.body)
      args[#args + 1] = "--data-binary @" .. q(dir .. "/req" .. n)
    end
    args[#args + 1] = q(url)
    local out = H.sh(table.concat(args, " "))
    local body = H.readfile(bodyfile)
    os.remove(bodyfile)
    return tonumber(out) or 0, body
  end

  -- The instance ids of service at a plane ("" when none), read as the
  -- reader token.
  local function ids(plane, service, opts)
    local status, body = https(plane.url .. "/v1/services/" .. service, opts)
    if status ~= 200 then
      return nil, status
    end
    local out = {}
    for _, i in ipairs(H.json(body).instances) do
      out[#out + 1] = i.id
    end
    table.sort(out)
    return table.concat(out, ",")
  end

  local function count(p, ...)
    local needles, c = { ... }, 0
    for line in H.readfile(p.out):gmatch("[^\n]+") do
      local all = true
      for _, s in ipairs(needles) do
        all = all and line:find(s, 1, true) ~= nil
      end
      c = c + (all and 1 or 0)
    end
    return c
  end

  local function register(planes, id, args)
    n = n + 1
    local ctl = {}
    for _, p in ipairs(planes) do
      ctl[#ctl + 1] = "--control " .. q(p.url)
    end
    return H.spawn(string.format("%s register %s --service web --id %s --url http://127.0.0.1:9 " ..
      "--ttl 1s --drain 0 %s", q(H.bin), table.concat(ctl, " "), id, args or ""), dir, "reg" .. n)
  end

  local function echo(who)
    n = n + 1
    local p = H.spawn(string.format("python3 %s --port 0 --header %s", q(ECHO),
      q("X-Who: " .. who)), dir, "echo" .. n)
    local port = H.wait_for(function()
      return tonumber(H.readfile(p.out):match("listening (%d+)"))
    end, 10)
    assert(port, "echo did not start: " .. H.readfile(p.out))
    return "http://127.0.0.1:" .. port
  end

  describe("bad flags and files", function()
    local reg = " --control https://127.0.0.1:1 --service web --id w1 --url http://127.0.0.1:9 --ttl 1s"
    local cmds = {
      { "register", reg },
      { "proxy", " --control https://127.0.0.1:1 --service web --listen 127.0.0.1:0 --admin 127.0.0.1:0" },
      { "up", " --control https://127.0.0.1:1" },
    }

    it("a certificate without its key, or the reverse, is exit 2 on every client", function()
      for _, c in ipairs(cmds) do
        local out, rc = H.sh(bin .. " " .. c[1] .. c[2] .. " --control-cert " .. cert("client-a.pem") .. " 2>&1")
        assert.equal(2, rc, c[1] .. ": " .. out)
        assert.matches("openmesh " .. c[1] .. ": --control-cert " .. certs .. "/client-a.pem needs --control-key",
          out, 1, true)
        out, rc = H.sh(bin .. " " .. c[1] .. c[2] .. " --control-key k.pem 2>&1")
        assert.equal(2, rc, c[1] .. ": " .. out)
        assert.matches("--control-key k.pem needs --control-cert", out, 1, true)
      end
    end)

    it("names the flag, the file and the problem, and exits 2 before any request", function()
      local cases = {
        { "--control-ca " .. cert("garbage.pem"), "--control-ca " .. certs .. "/garbage.pem:" },
        { "--control-ca " .. q(dir .. "/missing.pem"), "--control-ca " .. dir .. "/missing.pem: cannot read" },
        { "--control-cert " .. cert("garbage.pem") .. " --control-key " .. cert("client-a.key"),
          "--control-cert " .. certs .. "/garbage.pem: not a PEM certificate" },
        { "--control-cert " .. cert("client-a.pem") .. " --control-key " .. cert("client-b.key"),
          "--control-key " .. certs .. "/client-b.key: the key does not match the certificate" },
        { "--control-cert " .. cert("client-a.pem") .. " --control-key " .. cert("garbage.pem"),
          "--control-key " .. certs .. "/garbage.pem: not a PEM private key" },
      }
      for _, c in ipairs(cmds) do
        for _, k in ipairs(cases) do
          local out, rc = H.sh(bin .. " " .. c[1] .. c[2] .. " " .. k[1] .. " 2>&1")
          assert.equal(2, rc, c[1] .. " " .. k[1] .. ": " .. out)
          assert.matches("openmesh " .. c[1] .. ": " .. k[2], out, 1, true)
          assert.not_matches("register_failed", out, 1, true)
          assert.not_matches("watch_started", out, 1, true)
        end
      end
    end)

    it("the --control-* flags without --control are exit 2 (proxy, up)", function()
      local out, rc = H.sh(bin .. " proxy --static x.json --control-ca " .. cert("ca.pem") .. " 2>&1")
      assert.equal(2, rc, out)
      assert.matches("--control-ca: the --control-* TLS flags go with --control", out, 1, true)
      out, rc = H.sh(bin .. " up --control-ca " .. cert("ca.pem") .. " 2>&1")
      assert.equal(2, rc, out)
      assert.matches("--control-ca: the --control-* TLS flags go with --control", out, 1, true)
    end)

    it("the help of every client names the flags", function()
      for _, c in ipairs { "register", "proxy", "up" } do
        local out, rc = H.sh(bin .. " " .. c .. " --help 2>&1")
        assert.equal(0, rc, out)
        assert.matches("--control-ca FILE", out, 1, true)
        assert.matches("--control-cert FILE", out, 1, true)
        assert.matches("--control-key FILE", out, 1, true)
      end
    end)
  end)

  describe("register", function()
    it("keeps its lease on a plane with a private CA given by --control-ca", function()
      local c = start_control()
      finally(function() H.kill_all() end)
      local reg = register({ c }, "w1", "--control-ca " .. cert("ca.pem"))
      assert.truthy(H.wait_for(function() return ids(c, "web") == "w1" end, 5), H.readfile(reg.out))
      -- three TTLs of 1 s: renewed all along
      local t_end, polls, seen = H.now() + 3, 0, 0
      repeat
        polls = polls + 1
        seen = seen + (ids(c, "web") == "w1" and 1 or 0)
        H.sleep(0.2)
      until H.now() > t_end
      assert.equal(polls, seen, H.readfile(reg.out))
      assert.equal(0, count(reg, '"event":"register_failed"'), H.readfile(reg.out))
      -- the DELETE on exit goes over TLS too
      assert.equal(0, H.stop(reg))
      assert.equal("", (ids(c, "web")))
    end)

    it("without --control-ca it logs the verification failure and keeps retrying", function()
      local c = start_control()
      finally(function() H.kill_all() end)
      local reg = register({ c }, "w2")
      assert.truthy(H.wait_for(function()
        return count(reg, '"event":"register_failed"', "TLS verification of the server failed") >= 3
      end, 8), H.readfile(reg.out))
      assert.truthy(H.alive(reg.pid))
      -- nothing ever reached the plane: the service does not exist
      local got, status = ids(c, "web")
      assert.equal(nil, got)
      assert.equal(404, status)
      assert.equal(0, count(reg, '"event":"registered"'))
      assert.equal(0, H.stop(reg))
    end)
  end)

  describe("up --control https://", function()
    it("passes the flags to its keepers and its proxy's watches", function()
      local c = start_control()
      finally(function() H.kill_all() end)
      local updir = dir .. "/up"
      os.execute("mkdir -p " .. q(updir))
      math.randomseed(os.time() + tonumber(tostring({}):match("0x(%x+)"), 16) % 1000)
      local up, port
      for _ = 1, 4 do
        port = 22000 + math.random(0, 400) * 10
        H.writefile(updir .. "/up.json", cjson.encode({
          control = { host = "127.0.0.1", port = 7600 },
          proxy = { port = 0, admin_port = 0, policy = dir .. "/traffic.lua" },
          services = { { service = "orders", id = "o-1", port = port, behaviour = "fast" } },
        }))
        n = n + 1
        up = H.start_up(dir, "up" .. n, string.format("--control %s --control-ca %s %s",
          q(c.url), cert("ca.pem"), q(updir)))
        if up then break end
      end
      assert(up, "openmesh up --control did not start")
      local pport, aport = H.readfile(up.out):match(
        "proxy           http://127%.0%.0%.1:(%d+)   %(admin: http://127%.0%.0%.1:(%d+)/status%)")
      assert.truthy(pport, H.readfile(up.out))
      assert.truthy(H.wait_for(function() return ids(c, "orders") == "o-1" end, 5), H.readfile(up.out))
      assert.truthy(H.wait_for(function()
        return (H.request(dir, "GET", "http://127.0.0.1:" .. pport .. "/", { headers = { "Host: orders" } })) == 200
      end, 5), H.readfile(up.out))
      local st, body = H.request(dir, "GET", "http://127.0.0.1:" .. aport .. "/status")
      assert.equal(200, st)
      assert.equal(c.url, H.json(body).watches.orders.control)
      assert.equal(0, count(up, '"event":"register_failed"'), H.readfile(up.out))
      assert.equal(0, H.stop(up))
      assert.equal("", (ids(c, "orders")))
    end)
  end)

  describe("certificate authentication", function()
    it("register and a proxy's watch work with a client certificate and no token", function()
      if not H.sh("command -v python3 >/dev/null && echo yes"):find("yes", 1, true) then
        pending("python3 is not installed (scripts/deps installs it)")
        return
      end
      H.writefile(dir .. "/tokens", "reader-token read\n" ..
        "san:spiffe://mesh/ns/a/sa/x register\n" ..
        "san:spiffe://mesh/ns/b/sa/y read\n")
      local c = start_control("--tokens " .. q(dir .. "/tokens") .. " --tls-client-ca " .. cert("ca.pem"))
      finally(function() H.kill_all() end)
      local reader = { token = "reader-token" }
      local url = echo("a")
      -- the plane requires credentials: anonymous registration is refused
      local put = { method = "PUT", body = cjson.encode { url = url, ttl_ms = 60000 } }
      assert.equal(401, (https(c.url .. "/v1/services/web/instances/anon", put)))
      -- the keeper authenticates with certificate a (register role)
      local reg = H.spawn(string.format("%s register --control %s --service web --id w1 --url %s " ..
        "--ttl 2s --drain 0 --control-ca %s --control-cert %s --control-key %s", q(H.bin), q(c.url), q(url),
        cert("ca.pem"), cert("client-a.pem"), cert("client-a.key")), dir, "reg-cert")
      assert.truthy(H.wait_for(function() return ids(c, "web", reader) == "w1" end, 5), H.readfile(reg.out))
      assert.equal(0, count(reg, '"event":"register_failed"'), H.readfile(reg.out))
      -- the proxy watches with certificate b (read role) and routes
      local proxy = H.start_proxy(dir, "proxy-cert", string.format(
        "--policy %s --control %s --service web --control-ca %s --control-cert %s --control-key %s",
        q(dir .. "/traffic.lua"), q(c.url), cert("ca.pem"), cert("client-b.pem"), cert("client-b.key")))
      local function who()
        local st, _, headers = H.request(dir, "GET", proxy.url .. "/", { headers = { "Host: web" } })
        return st == 200 and headers["x-who"] or st
      end
      assert.truthy(H.wait_for(function() return who() == "a" end, 5), H.readfile(proxy.out))
      local st, body = H.request(dir, "GET", proxy.admin .. "/status")
      assert.equal(200, st)
      local w = H.json(body).watches.web
      assert.equal("streaming", w.state)
      assert.equal(c.url, w.control)
      -- certificate a lacks the read role: a watch with it is refused
      local proxy2 = H.start_proxy(dir, "proxy-cert-a", string.format(
        "--policy %s --control %s --service web --control-ca %s --control-cert %s --control-key %s",
        q(dir .. "/traffic.lua"), q(c.url), cert("ca.pem"), cert("client-a.pem"), cert("client-a.key")))
      assert.truthy(H.wait_for(function()
        local s2, b2 = H.request(dir, "GET", proxy2.admin .. "/status")
        return s2 == 200 and H.json(b2).watches.web.last_status == 403
      end, 5), H.readfile(proxy2.out))
      assert.equal(0, H.stop(reg))
      assert.equal("", (ids(c, "web", reader)))
    end)
  end)

  describe("two HTTPS planes on one Redis", function()
    if not R.available then
      it("runs with a real redis-server", function()
        pending("redis-server is not installed (scripts/deps installs it)")
      end)
      return
    end

    it("register and a proxy's watch fail over from A to B as over plaintext", function()
      local redis = R.start()
      finally(function()
        H.kill_all()
        R.stop(redis)
      end)
      local args = string.format("--store %s --store-prefix ctls", redis.url)
      local a, b = start_control(args), start_control(args)
      local ca = "--control-ca " .. cert("ca.pem")
      local reg = register({ a, b }, "w1", ca)
      assert.truthy(H.wait_for(function() return ids(b, "web") == "w1" end, 5), H.readfile(reg.out))
      local proxy = H.start_proxy(dir, "proxy-fo", string.format("--policy %s --control %s --service web %s",
        q(dir .. "/traffic.lua"), q(a.url .. "," .. b.url), ca))
      local function watch()
        local st, body = H.request(dir, "GET", proxy.admin .. "/status")
        assert.equal(200, st, body)
        return H.json(body).watches.web
      end
      assert.truthy(H.wait_for(function()
        local w = watch()
        return w.control == a.url and w.state == "streaming" and w.revision > 0
      end, 5), H.readfile(proxy.out))
      local before = watch()
      assert.equal(0, count(reg, '"event":"control_failover"'))

      H.kill(a.pid, "KILL")
      assert.truthy(H.wait_for(function() return not H.alive(a.pid) end, 5))
      local t_end, polls, seen = H.now() + 3, 0, 0
      repeat
        polls = polls + 1
        seen = seen + (ids(b, "web") == "w1" and 1 or 0)
        H.sleep(0.1)
      until H.now() > t_end
      assert.equal(polls, seen, H.readfile(reg.out))
      assert.truthy(count(reg, '"event":"control_failover"', '"from":"' .. a.url .. '"',
        '"to":"' .. b.url .. '"') >= 1, H.readfile(reg.out))
      assert.truthy(count(reg, '"event":"registered"', '"control":"' .. b.url .. '"') >= 1, H.readfile(reg.out))
      assert.truthy(H.wait_for(function()
        local w = watch()
        return w.control == b.url and w.state == "streaming"
      end, 5), H.readfile(proxy.out))
      local after = watch()
      assert.equal(1, after.failovers)
      assert.equal(0, after.duplicates)
      assert.truthy(after.revision >= before.revision)
      assert.equal(0, H.stop(reg))
      assert.equal("", (ids(b, "web")))
    end)
  end)
end)
