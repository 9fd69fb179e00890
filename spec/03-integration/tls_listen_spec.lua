-- TLS on the listeners, with the real binaries: `openmesh control` over
-- HTTPS answered by curl --cacert; `openmesh proxy` with client
-- certificates routing by req.identity to real upstreams; two proxies
-- with mutual TLS between them (the caller's --upstream-cert is the
-- callee's req.identity); certificate
-- auth on the control plane (san: lines); bad files refused at start with
-- exit 2; reload that keeps the last good certificate. Certificates are
-- made for the run by tests/fixtures/tls_certs.sh.
local H = require "spec.support.control_helper"
local cjson = require "cjson"

local q = H.q

describe("TLS on the listeners", function()
  if not H.bin or H.bin == "" then
    it("runs against OPENMESH_BIN", function()
      pending("OPENMESH_BIN is not set (make check sets it to build/bin/openmesh)")
    end)
    return
  end

  local dir, certs
  local bin = "timeout 10 " .. q(H.bin) -- usage checks: never left running
  local n = 0

  -- Start `openmesh CMD ... --listen 127.0.0.1:0` and read the https URL
  -- back from its EVENT start line.
  local function start(cmd, event, args)
    n = n + 1
    local p = H.spawn(q(H.bin) .. " " .. cmd .. " --listen 127.0.0.1:0 " .. args, dir, cmd .. n)
    local port = H.wait_for(function()
      local port = H.readfile(p.out):match('"event":"' .. event .. '","url":"https://127%.0%.0%.1:(%d+)"')
      if port then
        return tonumber(port)
      end
      if H.readfile(p.rcfile) ~= "" then
        return -1
      end
    end, 10)
    assert(port and port > 0, cmd .. " did not start: " .. H.readfile(p.out))
    p.port = port
    return p
  end

  -- curl over TLS: status (0: no answer), body, curl's exit code.
  local function get(port, path, opts)
    opts = opts or {}
    local args = { H.curl(5), "-s", "-o", q(dir .. "/body"), "-w", "'%{http_code}'" }
    if opts.insecure then
      args[#args + 1] = "-k"
    elseif opts.ca ~= false then
      args[#args + 1] = "--cacert " .. q(certs .. "/ca.pem")
    end
    if opts.cert then
      args[#args + 1] = "--cert " .. q(certs .. "/" .. opts.cert .. ".pem")
      args[#args + 1] = "--key " .. q(certs .. "/" .. opts.cert .. ".key")
    end
    for _, h in ipairs(opts.headers or {}) do
      args[#args + 1] = "-H " .. q(h)
    end
    if opts.method then
      args[#args + 1] = "-X " .. opts.method
    end
    if opts.body then
      H.writefile(dir .. "/req", opts.body)
      args[#args + 1] = "--data-binary @" .. q(dir .. "/req")
    end
    args[#args + 1] = q((opts.scheme or "https") .. "://localhost:" .. port .. path)
    local out, rc = H.sh(table.concat(args, " "))
    local body = H.readfile(dir .. "/body")
    os.remove(dir .. "/body")
    return tonumber(out) or 0, body, rc
  end

  -- The subject of the certificate a listener serves.
  local function served_subject(port)
    local out = H.sh("echo | timeout 5 openssl s_client -connect 127.0.0.1:" .. port ..
      " 2>/dev/null | openssl x509 -noout -subject 2>/dev/null")
    return out:match("CN%s*=%s*([%w%.%-]+)")
  end

  local function metric(port, path, name, opts)
    local _, body = get(port, path, opts)
    return tonumber(body:match(name:gsub("[%p]", "%%%0") .. " ([%d%.]+)"))
  end

  -- A plain HTTP upstream whose answer says which one it is.
  local function upstream(name)
    local root = dir .. "/www-" .. name
    os.execute("mkdir -p " .. q(root))
    H.writefile(root .. "/index.html", name)
    local p = H.spawn("python3 -c " .. q([[
import http.server, os, sys
os.chdir(sys.argv[1])
class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a): pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
print("port", s.server_address[1], flush=True)
s.serve_forever()
]]) .. " " .. q(root), dir, "upstream-" .. name)
    local port = H.wait_for(function()
      return tonumber(H.readfile(p.out):match("port (%d+)"))
    end, 10)
    assert(port, "upstream did not start: " .. H.readfile(p.out))
    return port
  end

  setup(function()
    dir = H.tmpdir()
    certs = dir .. "/certs"
    local out, rc = H.sh("tests/fixtures/tls_certs.sh " .. q(certs) .. " 2>&1")
    assert(rc == 0, "tls_certs.sh: " .. out)
  end)

  teardown(function()
    H.kill_all()
    if dir then
      os.execute("rm -rf " .. q(dir))
    end
  end)

  describe("bad flags and files", function()
    it("refuses a certificate without its key and the reverse, on every command", function()
      for _, cmd in ipairs { "control", "proxy --static x.json", "egress", "up" } do
        local out, rc = H.sh(bin .. " " .. cmd .. " --tls-cert " .. q(certs .. "/server.pem") .. " 2>&1")
        assert.equal(2, rc, cmd .. ": " .. out)
        assert.matches("--tls-cert " .. certs .. "/server.pem needs --tls-key", out, 1, true)
        out, rc = H.sh(bin .. " " .. cmd .. " --tls-key k.pem 2>&1")
        assert.equal(2, rc, cmd .. ": " .. out)
        assert.matches("--tls-key k.pem needs --tls-cert", out, 1, true)
        out, rc = H.sh(bin .. " " .. cmd .. " --tls-client-ca ca.pem 2>&1")
        assert.equal(2, rc, cmd .. ": " .. out)
        assert.matches("--tls-client-ca ca.pem needs --tls-cert and --tls-key", out, 1, true)
      end
    end)

    it("names the flag, the file and the problem, and exits 2 before listening", function()
      local cases = {
        { "--tls-cert " .. q(certs .. "/garbage.pem") .. " --tls-key " .. q(certs .. "/server.key"),
          "--tls-cert " .. certs .. "/garbage.pem: not a PEM certificate" },
        { "--tls-cert " .. q(certs .. "/server.pem") .. " --tls-key " .. q(certs .. "/client-a.key"),
          "--tls-key " .. certs .. "/client-a.key: the key does not match the certificate" },
        { "--tls-cert " .. q(certs .. "/server.pem") .. " --tls-key " .. q(certs .. "/garbage.pem"),
          "--tls-key " .. certs .. "/garbage.pem: not a PEM private key" },
        { "--tls-cert " .. q(dir .. "/missing.pem") .. " --tls-key " .. q(certs .. "/server.key"),
          "--tls-cert " .. dir .. "/missing.pem: cannot read" },
        { "--tls-cert " .. q(certs .. "/server.pem") .. " --tls-key " .. q(certs .. "/server.key") ..
          " --tls-client-ca " .. q(certs .. "/garbage.pem"),
          "--tls-client-ca " .. certs .. "/garbage.pem:" },
      }
      for _, cmd in ipairs { "control --listen 127.0.0.1:0", "egress --listen 127.0.0.1:0" } do
        for _, c in ipairs(cases) do
          local out, rc = H.sh(bin .. " " .. cmd .. " " .. c[1] .. " 2>&1")
          assert.equal(2, rc, cmd .. " " .. c[1] .. ": " .. out)
          assert.matches(c[2], out, 1, true)
          assert.not_matches("listening", out, 1, true)
        end
      end
    end)
  end)

  describe("openmesh control", function()
    it("serves HTTPS to a client that trusts the CA, and nothing in plaintext", function()
      local c = start("control", "control_listening",
        "--tls-cert " .. q(certs .. "/server.pem") .. " --tls-key " .. q(certs .. "/server.key"))
      local status, body = get(c.port, "/healthz")
      assert.equal(200, status)
      assert.matches("ok", body)
      local _, _, rc = get(c.port, "/healthz", { ca = false }) -- untrusted: curl's 60
      assert.equal(60, rc)
      status = get(c.port, "/healthz", { scheme = "http" })
      assert.equal(0, status)
      -- a registration and a discovery read over TLS
      status = get(c.port, "/v1/services/web/instances/w1",
        { method = "PUT", body = cjson.encode { url = "http://127.0.0.1:9", ttl_ms = 60000 } })
      assert.equal(200, status)
      status, body = get(c.port, "/v1/services/web")
      assert.equal(200, status)
      assert.equal("w1", H.json(body).instances[1].id)
      local name = "openmesh_control_tls_handshakes_total"
      assert.is_true(metric(c.port, "/metrics", name .. '{result="ok"}') >= 4)
      assert.is_true(metric(c.port, "/metrics", name .. '{result="error"}') >= 2)
      assert.equal(0, H.stop(c))
    end)

    it("grants roles to a client certificate's SAN (san: lines), as an alternative to a token", function()
      H.writefile(dir .. "/tokens", "reader read\n" ..
        "san:spiffe://mesh/ns/a/sa/x register\n" ..
        "san:spiffe://mesh/ns/b/sa/y read\n")
      local c = start("control", "control_listening",
        "--tokens " .. q(dir .. "/tokens") ..
        " --tls-cert " .. q(certs .. "/server.pem") .. " --tls-key " .. q(certs .. "/server.key") ..
        " --tls-client-ca " .. q(certs .. "/ca.pem"))
      local put = { method = "PUT", body = cjson.encode { url = "http://127.0.0.1:9", ttl_ms = 60000 } }
      -- certificate a holds register: no token needed
      put.cert = "client-a"
      assert.equal(200, (get(c.port, "/v1/services/web/instances/w1", put)))
      -- certificate b holds read only: 403 for a registration, 200 for a read
      put.cert = "client-b"
      assert.equal(403, (get(c.port, "/v1/services/web/instances/w2", put)))
      assert.equal(200, (get(c.port, "/v1/services/web", { cert = "client-b" })))
      -- no certificate (optional with --tokens): the token decides
      assert.equal(401, (get(c.port, "/v1/services/web")))
      assert.equal(200, (get(c.port, "/v1/services/web", { headers = { "Authorization: Bearer reader" } })))
      put.cert = nil
      put.headers = { "Authorization: Bearer reader" }
      assert.equal(403, (get(c.port, "/v1/services/web/instances/w3", put)))
      -- a certificate from another CA is refused at the handshake
      local status, _, rc = get(c.port, "/v1/services/web", { cert = "untrusted" })
      assert.equal(0, status)
      assert.are_not.equal(0, rc)
      assert.equal(0, H.stop(c))
    end)
  end)

  describe("openmesh proxy with --tls-client-ca", function()
    local proxy

    setup(function()
      local a, b = upstream("A"), upstream("B")
      H.writefile(dir .. "/static.json", cjson.encode { services = { web = { revision = 1, instances = {
        { id = "a1", url = "http://127.0.0.1:" .. a, metadata = { group = "a" } },
        { id = "b1", url = "http://127.0.0.1:" .. b, metadata = { group = "b" } },
      } } } })
      proxy = start("proxy", "proxy_listening",
        "--admin 127.0.0.1:0 --static " .. q(dir .. "/static.json") ..
        " --policy examples/policies/identity_route.lua" ..
        " --tls-cert " .. q(certs .. "/server.pem") .. " --tls-key " .. q(certs .. "/server.key") ..
        " --tls-client-ca " .. q(certs .. "/ca.pem"))
    end)

    it("routes each caller by the SPIFFE ID of its certificate", function()
      for _ = 1, 3 do
        local status, body = get(proxy.port, "/", { cert = "client-a", headers = { "Host: web" } })
        assert.equal(200, status)
        assert.equal("A", body)
        status, body = get(proxy.port, "/", { cert = "client-b", headers = { "Host: web" } })
        assert.equal(200, status)
        assert.equal("B", body)
      end
    end)

    it("refuses a caller without a certificate, or with an untrusted one, at the handshake", function()
      local status, _, rc = get(proxy.port, "/", { headers = { "Host: web" } })
      assert.equal(0, status)
      assert.are_not.equal(0, rc)
      status, _, rc = get(proxy.port, "/", { cert = "untrusted", headers = { "Host: web" } })
      assert.equal(0, status)
      assert.are_not.equal(0, rc)
      local admin = tonumber(H.readfile(proxy.out):match('"admin":"http://127%.0%.0%.1:(%d+)"'))
      local _, text = H.request(dir, "GET", "http://127.0.0.1:" .. admin .. "/metrics")
      local errors = tonumber(text:match('openmesh_proxy_listener_tls_handshakes_total{result="error"} (%d+)'))
      assert.is_true(errors >= 2, text)
      local _, st = H.request(dir, "GET", "http://127.0.0.1:" .. admin .. "/status")
      local tls = H.json(st).listener_tls
      assert.is_true(tls.client_certificates)
      assert.equal(1, tls.generation)
      assert.is_true(tls.handshakes.error >= 2)
      assert.is_true(tls.handshakes.ok >= 6)
    end)
  end)

  describe("two proxies: service-to-service mutual TLS", function()
    local callee

    setup(function()
      local a, b = upstream("A2"), upstream("B2")
      H.writefile(dir .. "/callee.json", cjson.encode { services = { web = { revision = 1, instances = {
        { id = "a1", url = "http://127.0.0.1:" .. a, metadata = { group = "a" } },
        { id = "b1", url = "http://127.0.0.1:" .. b, metadata = { group = "b" } },
      } } } })
      callee = start("proxy", "proxy_listening",
        "--admin 127.0.0.1:0 --static " .. q(dir .. "/callee.json") ..
        " --policy examples/policies/identity_route.lua" ..
        " --tls-cert " .. q(certs .. "/server.pem") .. " --tls-key " .. q(certs .. "/server.key") ..
        " --tls-client-ca " .. q(certs .. "/ca.pem"))
      H.writefile(dir .. "/caller.json", cjson.encode { services = { web = { revision = 1, instances = {
        { id = "callee", url = "https://127.0.0.1:" .. callee.port },
      } } } })
    end)

    -- The caller's sidecar: plaintext for its application, TLS with the
    -- given client certificate (or none) to the callee's proxy.
    local function caller(name, cert)
      local args = "--static " .. q(dir .. "/caller.json") .. " --upstream-ca " .. q(certs .. "/ca.pem")
      if cert then
        args = args .. " --upstream-cert " .. q(certs .. "/" .. cert .. ".pem") ..
          " --upstream-key " .. q(certs .. "/" .. cert .. ".key")
      end
      return H.start_proxy(dir, name, args)
    end

    it("routes by the identity the calling proxy presents", function()
      local pa, pb, pn = caller("caller-a", "client-a"), caller("caller-b", "client-b"), caller("caller-none")
      for _ = 1, 3 do
        local status, body = H.request(dir, "GET", pa.url .. "/", { headers = { "Host: web" } })
        assert.equal(200, status)
        assert.equal("A2", body)
        status, body = H.request(dir, "GET", pb.url .. "/", { headers = { "Host: web" } })
        assert.equal(200, status)
        assert.equal("B2", body)
      end
      -- no client certificate: the callee refuses the handshake, the caller
      -- answers with its own error and nothing reaches an upstream
      local status, body = H.request(dir, "GET", pn.url .. "/", { headers = { "Host: web" } })
      assert.is_true(status >= 500, status .. " " .. body)
      assert.matches('"reason":"upstream"', body, 1, true)
    end)
  end)

  describe("reload", function()
    it("keeps the last good certificate on a bad file and switches on a good one", function()
      local live = dir .. "/live"
      os.execute("mkdir -p " .. q(live))
      H.sh("cp " .. q(certs .. "/server.pem") .. " " .. q(live .. "/cert.pem") .. " && cp " ..
        q(certs .. "/server.key") .. " " .. q(live .. "/key.pem"))
      local c = start("control", "control_listening",
        "--tls-cert " .. q(live .. "/cert.pem") .. " --tls-key " .. q(live .. "/key.pem"))
      assert.equal("localhost", served_subject(c.port))
      local function logged(text)
        return H.wait_for(function()
          return H.readfile(c.out):find(text, 1, true)
        end, 5)
      end
      -- garbage on disk, SIGHUP: refused, logged, the old certificate stays
      H.writefile(live .. "/cert.pem", "garbage\n")
      H.kill(c.pid, "HUP")
      assert.truthy(logged("cert.pem: not a PEM certificate"), H.readfile(c.out))
      assert.equal("localhost", served_subject(c.port))
      assert.equal(200, (get(c.port, "/healthz")))
      -- a certificate without its key: still the old one
      H.sh("cp " .. q(certs .. "/wrong.pem") .. " " .. q(live .. "/cert.pem"))
      H.kill(c.pid, "HUP")
      assert.truthy(logged("key.pem: the key does not match the certificate"), H.readfile(c.out))
      assert.equal("localhost", served_subject(c.port))
      -- the matching key arrives: the watch reloads without a signal
      H.sh("cp " .. q(certs .. "/wrong.key") .. " " .. q(live .. "/key.pem"))
      assert.truthy(H.wait_for(function()
        return served_subject(c.port) == "wrong.example"
      end, 5), H.readfile(c.out))
      -- the served name is now wrong.example: read the counters without checking it
      local reload = "openmesh_control_tls_reloads_total"
      assert.is_true(metric(c.port, "/metrics", reload .. '{result="error"}', { insecure = true }) >= 2)
      assert.is_true(metric(c.port, "/metrics", reload .. '{result="ok"}', { insecure = true }) >= 1)
      assert.equal(0, H.stop(c))
    end)
  end)
end)
