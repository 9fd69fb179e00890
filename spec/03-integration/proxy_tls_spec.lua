-- proxy_tls_spec.lua: the real `openmesh proxy` binary to https:// peers:
-- one nginx process serving TLS on several loopback ports (a good
-- certificate for localhost/127.0.0.1, one for a wrong name, an expired one,
-- one from an untrusted CA, and a port that asks for client certificates),
-- with throwaway certificates from tests/fixtures/tls_certs.sh. Driven with
-- curl over loopback (spec/support/control_helper.lua).
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../support/?.lua;" .. package.path

local H = require "control_helper"

local function policy(extra)
  return ([[
return {
  kind = "traffic",
  subset = function(_, peers) return peers end,
  per_try_timeout_ms = 2000,
  retries = 3,
  %s
}
]]):format(extra or "")
end

describe("openmesh proxy to https:// peers", function()
  if not H.bin or H.bin == "" then
    it("runs against OPENMESH_BIN", function()
      pending("OPENMESH_BIN is not set (make check sets it to build/bin/openmesh)")
    end)
    return
  end
  local nginx = H.nginx_path()
  if not nginx then
    it("needs nginx", function()
      pending("nginx is not installed (scripts/deps-bench)")
    end)
    return
  end

  local dir, ng, base
  local bin = "timeout 10 " .. H.q(H.bin)
  local P = {}

  local function cert(name)
    return dir .. "/" .. name
  end

  -- one nginx, a server block per port; keepalive_requests 1 closes every
  -- connection after its request, so the proxy opens (and resumes) anew
  local function start_nginx()
    local p
    p, base = H.start_nginx(dir, nginx, 21000, 20, function(b)
      P = { good = b, wrong = b + 1, expired = b + 2, untrusted = b + 3, mtls = b + 4 }
      local function server(port, c, extra)
        return ([[
  server {
    listen 127.0.0.1:%d ssl;
    ssl_certificate %s.pem;
    ssl_certificate_key %s.key;
    %s
    location / { return 200 "ok $ssl_session_reused $ssl_client_verify\n"; }
  }
]]):format(port, cert(c), cert(c), extra or "")
      end
      return ([[
worker_processes 1;
pid %s/nginx.pid;
error_log %s/nginx.log warn;
events { worker_connections 256; }
http {
  access_log off;
  keepalive_requests 1;
  client_body_temp_path %s/body;
  proxy_temp_path %s/proxy;
  fastcgi_temp_path %s/fastcgi;
  uwsgi_temp_path %s/uwsgi;
  scgi_temp_path %s/scgi;
%s%s%s%s%s}
]]):format(dir, dir, dir, dir, dir, dir, dir,
        server(P.good, "server"), server(P.wrong, "wrong"),
        server(P.expired, "expired"), server(P.untrusted, "untrusted"),
        server(P.mtls, "server", "ssl_verify_client on;\n    ssl_client_certificate " ..
          cert("ca.pem") .. ";"))
    end, function(b) return b + 4 end)
    return p
  end

  local function url(port, host)
    return ("https://%s:%d"):format(host or "127.0.0.1", port)
  end

  local function topology(services)
    local parts = {}
    for name, peers in pairs(services) do
      local inst = {}
      for i, p in ipairs(peers) do
        inst[i] = ('{"id": "%s", "url": "%s"}'):format(p[1], p[2])
      end
      parts[#parts + 1] = ('"%s": {"revision": 1, "instances": [%s]}'):format(
        name, table.concat(inst, ", "))
    end
    return '{"services": {' .. table.concat(parts, ", ") .. "}}"
  end

  local function call(proxy, service, headers)
    local h = { "Host: " .. service }
    for _, x in ipairs(headers or {}) do
      h[#h + 1] = x
    end
    return H.request(dir, "GET", proxy.url .. "/", { headers = h })
  end

  local function metric(proxy, service, result)
    local _, text = H.request(dir, "GET", proxy.admin .. "/metrics")
    local pat = 'openmesh_proxy_tls_handshakes_total{service="' .. service ..
      '",result="' .. result .. '"} (%d+)'
    return tonumber(text:match(pat)) or 0
  end

  setup(function()
    dir = H.tmpdir()
    local _, rc = H.sh(H.q(here .. "../../tests/fixtures/tls_certs.sh") .. " " .. H.q(dir))
    assert.equal(0, rc)
    ng = start_nginx()
  end)

  teardown(function()
    H.kill_all()
    if dir then
      os.execute("rm -rf " .. H.q(dir))
    end
  end)

  after_each(function()
    -- nginx stays for the whole file; proxies are per test
    -- (one name per test: a killed proxy's wrapper may still write its rc
    -- file after the next spawn of the same name cleared it)
    for _, name in ipairs({ "proxy-a", "proxy-b", "proxy-c", "proxy-d", "proxy-e", "proxy-f" }) do
      local pid = H.readfile(dir .. "/" .. name .. ".pid"):match("^(%d+)")
      if pid then
        H.kill(pid, "KILL")
        os.remove(dir .. "/" .. name .. ".pid")
      end
    end
  end)

  it("answers through an https peer, verified, and resumes sessions", function()
    H.writefile(dir .. "/t.json", topology({ web = { { "a", url(P.good) } } }))
    H.writefile(dir .. "/p.lua", policy())
    -- one worker: TLS sessions are cached per worker (its upstream pool),
    -- and this counts the resumptions of one cache
    local proxy = H.start_proxy(dir, "proxy-a", "--workers 1 --static " .. H.q(dir .. "/t.json") ..
      " --policy " .. H.q(dir .. "/p.lua") .. " --upstream-ca " .. H.q(cert("ca.pem")))
    local seen_resumed = false
    for _ = 1, 4 do
      local status, body = call(proxy, "web")
      assert.equal(200, status, body)
      assert.matches("^ok ", body)
      seen_resumed = seen_resumed or body:match("^ok r ") ~= nil
    end
    -- every connection closes after one call (keepalive_requests 1): the
    -- later ones resume the first one's session, as nginx and we both say
    assert.is_true(seen_resumed)
    assert.equal(1, metric(proxy, "web", "ok"))
    assert.equal(3, metric(proxy, "web", "resumed"))
    local _, st = H.request(dir, "GET", proxy.admin .. "/status")
    local s = H.json(st).services.web
    assert.equal(4, s.tls.handshakes)
    assert.equal(3, s.tls.resumed)
    assert.equal(cert("ca.pem"), s.tls.ca_file)
  end)

  it("answers through https://localhost: resolved, SNI and the certificate's DNS name", function()
    H.writefile(dir .. "/t.json", topology({ web = { { "a", url(P.good, "localhost") } } }))
    H.writefile(dir .. "/p.lua", policy())
    local proxy = H.start_proxy(dir, "proxy-e", "--static " .. H.q(dir .. "/t.json") ..
      " --policy " .. H.q(dir .. "/p.lua") .. " --upstream-ca " .. H.q(cert("ca.pem")))
    local status, body
    assert(H.wait_for(function()
      status, body = call(proxy, "web")
      return status == 200
    end, 10), "https://localhost never answered: " .. tostring(status) .. " " .. tostring(body))
    assert.matches("^ok ", body)
    local _, st = H.request(dir, "GET", proxy.admin .. "/status")
    local s = H.json(st).services.web
    assert.equal(0, s.tls.failures, st)
    assert.truthy(s.tls.handshakes >= 1, st)
  end)

  it("refuses a wrong name, an expired and an untrusted certificate, and the call goes to another peer", function()
    H.writefile(dir .. "/t.json", topology({
      wrong = { { "bad", url(P.wrong) }, { "good", url(P.good) } },
      expired = { { "bad", url(P.expired) }, { "good", url(P.good) } },
      untrusted = { { "bad", url(P.untrusted) }, { "good", url(P.good) } },
    }))
    H.writefile(dir .. "/p.lua", policy())
    local proxy = H.start_proxy(dir, "proxy-b", "--static " .. H.q(dir .. "/t.json") ..
      " --policy " .. H.q(dir .. "/p.lua") .. " --upstream-ca " .. H.q(cert("ca.pem")))
    local want = {
      wrong = { "hostname", "certificate verify failed: hostname mismatch" },
      expired = { "expired", "certificate verify failed: certificate has expired" },
      untrusted = { "untrusted", "certificate verify failed: unable to get local issuer certificate" },
    }
    for service, w in pairs(want) do
      -- keyed calls: the rendezvous rank puts the bad peer first for some
      for k = 1, 12 do
        local status, body, headers = call(proxy, service, { "x-openmesh-key: k" .. k })
        assert.equal(200, status, service .. ": " .. body)
        assert.equal("good", headers["x-openmesh-peer"])
      end
      assert.is_true(metric(proxy, service, w[1]) >= 1, service)
      local _, st = H.request(dir, "GET", proxy.admin .. "/status")
      local s = H.json(st).services[service]
      assert.equal(w[2], s.tls.peer_errors.bad)
      assert.is_nil(s.tls.peer_errors.good)
    end
    local log = H.readfile(proxy.out)
    assert.matches('"event":"proxy_upstream_tls_failed"', log, 1, true)
    assert.matches("hostname mismatch", log, 1, true)
  end)

  it("verifies a policy's server_name and presents a policy's client certificate", function()
    H.writefile(dir .. "/t.json", topology({
      named = { { "a", url(P.good) } },
      mtls = { { "a", url(P.mtls) } },
      anon = { { "a", url(P.mtls) } },
    }))
    H.writefile(dir .. "/p.lua", policy())
    H.writefile(dir .. "/named.lua", policy(
      'tls = { server_name = "localhost", ca_file = "' .. cert("ca.pem") .. '" },'))
    H.writefile(dir .. "/mtls.lua", policy(
      'tls = { cert_file = "' .. cert("client-a.pem") .. '", key_file = "' ..
      cert("client-a.key") .. '" },'))
    local proxy = H.start_proxy(dir, "proxy-c", "--static " .. H.q(dir .. "/t.json") ..
      " --policy " .. H.q(dir .. "/p.lua") .. " --upstream-ca " .. H.q(cert("ca.pem")) ..
      " --service-policy named=" .. H.q(dir .. "/named.lua") ..
      " --service-policy mtls=" .. H.q(dir .. "/mtls.lua"))
    local status, body = call(proxy, "named")
    assert.equal(200, status, body)
    status, body = call(proxy, "mtls")
    assert.equal(200, status, body)
    assert.matches("SUCCESS", body, 1, true)
    -- without a client certificate nginx answers 400 itself
    status = call(proxy, "anon")
    assert.equal(400, status)
    local _, st = H.request(dir, "GET", proxy.admin .. "/status")
    local s = H.json(st).services
    assert.equal("localhost", s.named.tls.server_name)
    assert.equal(cert("client-a.pem"), s.mtls.tls.cert_file)
  end)

  it("refuses bad certificate and key files at start (exit 2) and keeps the last good on SIGHUP", function()
    H.writefile(dir .. "/t.json", topology({ web = { { "a", url(P.good) } } }))
    H.writefile(dir .. "/p.lua", policy())
    local common = " --static " .. H.q(dir .. "/t.json") .. " --policy " ..
      H.q(dir .. "/p.lua") .. " --listen 127.0.0.1:0 --admin 127.0.0.1:0"
    local out, rc = H.sh(bin .. " proxy" .. common .. " --upstream-ca " ..
      H.q(cert("garbage.pem")) .. " 2>&1")
    assert.equal(2, rc)
    assert.matches("--upstream-ca " .. cert("garbage.pem") .. ": not a PEM certificate", out, 1, true)
    out, rc = H.sh(bin .. " proxy" .. common .. " --upstream-cert " ..
      H.q(cert("client-a.pem")) .. " --upstream-key " .. H.q(cert("client-b.key")) .. " 2>&1")
    assert.equal(2, rc)
    assert.matches("the key does not match the certificate", out, 1, true)
    out, rc = H.sh(bin .. " proxy" .. common .. " --upstream-ca " ..
      H.q(dir .. "/missing.pem") .. " 2>&1")
    assert.equal(2, rc)
    assert.matches("cannot read: No such file or directory", out, 1, true)
    out, rc = H.sh(bin .. " proxy" .. common .. " --upstream-cert " ..
      H.q(cert("client-a.pem")) .. " 2>&1")
    assert.equal(2, rc)
    assert.matches("--upstream-key: required with --upstream-cert", out, 1, true)
    -- a policy whose tls file is bad: that service does not start
    H.writefile(dir .. "/bad.lua", policy('tls = { ca_file = "' .. cert("garbage.pem") .. '" },'))
    out, rc = H.sh(bin .. " proxy --static " .. H.q(dir .. "/t.json") .. " --policy " ..
      H.q(dir .. "/bad.lua") .. " --listen 127.0.0.1:0 --admin 127.0.0.1:0 2>&1")
    assert.equal(2, rc)
    assert.matches("tls.ca_file " .. cert("garbage.pem") .. ": not a PEM certificate", out, 1, true)

    -- SIGHUP with a broken CA file: logged, the last good stays
    os.execute("cp " .. H.q(cert("ca.pem")) .. " " .. H.q(dir .. "/live-ca.pem"))
    local proxy = H.start_proxy(dir, "proxy-d", "--static " .. H.q(dir .. "/t.json") ..
      " --policy " .. H.q(dir .. "/p.lua") .. " --upstream-ca " .. H.q(dir .. "/live-ca.pem"))
    local status = call(proxy, "web")
    assert.equal(200, status)
    os.execute("cp " .. H.q(cert("garbage.pem")) .. " " .. H.q(dir .. "/live-ca.pem"))
    H.kill(proxy.pid, "HUP")
    assert.truthy(H.wait_for(function()
      return H.readfile(proxy.out):find('"event":"proxy_tls_reload_failed"', 1, true)
    end, 5))
    assert.matches("live-ca.pem: not a PEM certificate", H.readfile(proxy.out), 1, true)
    for _ = 1, 3 do
      status = call(proxy, "web")
      assert.equal(200, status)
    end
    -- another CA: reloaded, and the next full handshake refuses the peer
    os.execute("cp " .. H.q(cert("other-ca.pem")) .. " " .. H.q(dir .. "/live-ca.pem"))
    H.kill(proxy.pid, "HUP")
    assert.truthy(H.wait_for(function()
      return H.readfile(proxy.out):find('"event":"proxy_tls_reloaded","rejected":"0"', 1, true)
    end, 5))
    status = call(proxy, "web")
    assert.equal(502, status)
    assert.is_true(metric(proxy, "web", "untrusted") >= 1)
  end)

  it("reloads --upstream-ca when the file is replaced, without SIGHUP, keeping the last good", function()
    H.writefile(dir .. "/t.json", topology({ web = { { "a", url(P.good) } } }))
    H.writefile(dir .. "/p.lua", policy())
    local live = dir .. "/watched-ca.pem"
    os.execute("cp " .. H.q(cert("ca.pem")) .. " " .. H.q(live))
    local proxy = H.start_proxy(dir, "proxy-f", "--static " .. H.q(dir .. "/t.json") ..
      " --policy " .. H.q(dir .. "/p.lua") .. " --upstream-ca " .. H.q(live))
    assert.equal(200, (call(proxy, "web")))
    -- replaced by a rename, as certificate managers do: garbage is refused
    os.execute("cp " .. H.q(cert("garbage.pem")) .. " " .. H.q(live .. ".new") ..
      " && mv " .. H.q(live .. ".new") .. " " .. H.q(live))
    assert.truthy(H.wait_for(function()
      return H.readfile(proxy.out):find('"event":"proxy_tls_reload_failed"', 1, true)
    end, 5), H.readfile(proxy.out))
    assert.matches("watched-ca.pem: not a PEM certificate", H.readfile(proxy.out), 1, true)
    for _ = 1, 3 do
      local status = call(proxy, "web")
      assert.equal(200, status)
    end
    -- another CA: taken on change, and the next full handshake refuses
    os.execute("cp " .. H.q(cert("other-ca.pem")) .. " " .. H.q(live .. ".new") ..
      " && mv " .. H.q(live .. ".new") .. " " .. H.q(live))
    assert.truthy(H.wait_for(function()
      return H.readfile(proxy.out):find('"event":"proxy_tls_reloaded","cause":"file_change","rejected":"0"', 1, true)
    end, 5), H.readfile(proxy.out))
    local status = call(proxy, "web")
    assert.equal(502, status)
    assert.is_true(metric(proxy, "web", "untrusted") >= 1)
  end)
end)
