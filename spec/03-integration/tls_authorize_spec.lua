-- A traffic policy refuses a call by the caller's identity, with the real
-- binary: `openmesh proxy --tls-cert .. --tls-client-ca ..` with
-- examples/policies/identity_authorize.lua (authorize admits only
-- spiffe://mesh/ns/a/..., vary = { ":identity" }). curl with certificate a
-- gets 200 from the upstream; with certificate b, 403 forbidden with the
-- policy's reason and an x-request-id; the upstream sees only a's calls,
-- and the refusals are counted in /metrics and /status. Certificates are
-- made for the run by tests/fixtures/tls_certs.sh.
local H = require "spec.support.control_helper"
local cjson = require "cjson"

local q = H.q

describe("authorize by identity", function()
  if not H.bin or H.bin == "" then
    it("runs against OPENMESH_BIN", function()
      pending("OPENMESH_BIN is not set (make check sets it to build/bin/openmesh)")
    end)
    return
  end

  local dir, certs, proxy, admin, up

  -- curl over TLS with a client certificate: status, body, headers.
  local function get(path, cert, headers)
    local args = { H.curl(5), "-s", "-o", q(dir .. "/body"), "-D", q(dir .. "/head"),
      "-w", "'%{http_code}'", "--cacert", q(certs .. "/ca.pem"),
      "--cert", q(certs .. "/" .. cert .. ".pem"), "--key", q(certs .. "/" .. cert .. ".key"),
      "-H", q("Host: web") }
    for _, h in ipairs(headers or {}) do
      args[#args + 1] = "-H " .. q(h)
    end
    args[#args + 1] = q("https://localhost:" .. proxy.port .. path)
    local out = H.sh(table.concat(args, " "))
    local body, head = H.readfile(dir .. "/body"), H.readfile(dir .. "/head"):lower()
    os.remove(dir .. "/body")
    os.remove(dir .. "/head")
    return tonumber(out) or 0, body, head
  end

  setup(function()
    dir = H.tmpdir()
    certs = dir .. "/certs"
    local out, rc = H.sh("tests/fixtures/tls_certs.sh " .. q(certs) .. " 2>&1")
    assert(rc == 0, "tls_certs.sh: " .. out)
    -- the upstream prints every path it serves, then answers "up"
    up = H.spawn("python3 -c " .. q([[
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        print("saw", self.path, flush=True)
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"up")
    def log_message(self, *a): pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print("port", s.server_address[1], flush=True)
s.serve_forever()
]]), dir, "upstream")
    local port = H.wait_for(function()
      return tonumber(H.readfile(up.out):match("port (%d+)"))
    end, 10)
    assert(port, "upstream did not start: " .. H.readfile(up.out))
    H.writefile(dir .. "/static.json", cjson.encode { services = { web = { revision = 1, instances = {
      { id = "u1", url = "http://127.0.0.1:" .. port },
    } } } })
    -- one worker: the decision cache is per worker, and this counts the
    -- policy runs of one cache
    proxy = H.spawn(q(H.bin) .. " proxy --workers 1 --listen 127.0.0.1:0 --admin 127.0.0.1:0" ..
      " --static " .. q(dir .. "/static.json") ..
      " --policy examples/policies/identity_authorize.lua" ..
      " --tls-cert " .. q(certs .. "/server.pem") .. " --tls-key " .. q(certs .. "/server.key") ..
      " --tls-client-ca " .. q(certs .. "/ca.pem"), dir, "proxy")
    proxy.port = H.wait_for(function()
      return tonumber(H.readfile(proxy.out):match('"event":"proxy_listening","url":"https://127%.0%.0%.1:(%d+)"'))
    end, 10)
    assert(proxy.port, "proxy did not start: " .. H.readfile(proxy.out))
    admin = "http://127.0.0.1:" .. H.readfile(proxy.out):match('"admin":"http://127%.0%.0%.1:(%d+)"')
  end)

  teardown(function()
    H.kill_all()
    if dir then
      os.execute("rm -rf " .. q(dir))
    end
  end)

  it("lets namespace a through and refuses namespace b with 403 and the reason", function()
    for i = 1, 3 do -- a, b, a, b...: the decision cache keys on the identity
      local status, body = get("/a-" .. i, "client-a")
      assert.equal(200, status, body)
      assert.equal("up", body)
      local head
      status, body, head = get("/b-" .. i, "client-b")
      assert.equal(403, status, body)
      local j = H.json(body)
      assert.equal("forbidden", j.reason)
      assert.equal("namespace b may not call web", j.message)
      assert.matches("x%-request%-id: %x+", head)
      assert.matches("content%-type: application/json", head)
    end
    -- the caller's own request id comes back on the refusal
    local _, _, head = get("/b-id", "client-b", { "X-Request-Id: rid-42" })
    assert.matches("x-request-id: rid-42", head, 1, true)
    -- the upstream saw every call of a and none of b
    local seen = H.readfile(up.out)
    for i = 1, 3 do
      assert.matches("saw /a%-" .. i .. "\n", seen)
    end
    assert.not_matches("saw /b", seen)
    -- logged with the caller and the request id, at most once a second
    assert.truthy(H.wait_for(function()
      return H.readfile(proxy.out):find('"event":"proxy_denied","service":"web","request_id":"', 1, true)
    end, 5), H.readfile(proxy.out))
    assert.matches('"caller":"spiffe://mesh/ns/b/sa/y","reason":"namespace b may not call web"',
      H.readfile(proxy.out), 1, true)
  end)

  it("counts the refusals in /metrics and /status", function()
    local _, text = H.request(dir, "GET", admin .. "/metrics")
    assert.matches('openmesh_proxy_denied_total{service="web"} 4', text, 1, true)
    assert.matches('openmesh_proxy_requests_total{service="web",outcome="forbidden"} 4', text, 1, true)
    -- one policy run per identity, every other call from the cache
    local hits = tonumber(text:match('openmesh_proxy_policy_cache_hits_total{service="web"} (%d+)'))
    local misses = tonumber(text:match('openmesh_proxy_policy_cache_misses_total{service="web"} (%d+)'))
    assert.equal(2, misses, text)
    assert.equal(5, hits, text)
    local _, st = H.request(dir, "GET", admin .. "/status")
    local svc = H.json(st).services.web
    assert.equal(4, svc.calls.denied, st)
  end)
end)
