-- egress_tls_spec.lua: the real `openmesh egress` binary calling https://
-- model routes over its own HTTP client (docs/EGRESS.md "Provider
-- connections"): one nginx terminating TLS on two loopback ports (a good
-- certificate for localhost, one from an untrusted CA) in front of the fake
-- provider (tests/fixtures/fake_provider.c), with throwaway certificates
-- from tests/fixtures/tls_certs.sh. The gateway trusts the test CA through
-- SSL_CERT_FILE, as OpenSSL's default verify paths read it.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../support/?.lua;" .. package.path

local H = require "control_helper"
local cjson = require "cjson"

describe("openmesh egress to https:// routes", function()
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

  local dir, fake, gw
  local P = {}

  local function start_nginx()
    H.start_nginx(dir, nginx, 23000, 10, function(base)
      P = { good = base, untrusted = base + 1 }
      local function server(port, c)
        return ([[
  server {
    listen 127.0.0.1:%d ssl;
    ssl_certificate %s/%s.pem;
    ssl_certificate_key %s/%s.key;
    location / { proxy_pass %s; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; }
  }
]]):format(port, dir, c, dir, c, fake.url)
      end
      return ([[
worker_processes 1;
pid %s/nginx.pid;
error_log %s/nginx.log warn;
events { worker_connections 256; }
http {
  access_log off;
  client_body_temp_path %s/body;
  proxy_temp_path %s/proxy;
  fastcgi_temp_path %s/fastcgi;
  uwsgi_temp_path %s/uwsgi;
  scgi_temp_path %s/scgi;
%s%s}
]]):format(dir, dir, dir, dir, dir, dir, dir, server(P.good, "server"), server(P.untrusted, "untrusted"))
    end, function(base) return base + 1 end)
  end

  local function counts()
    local _, body = H.request(dir, "GET", fake.url .. "/_count")
    return H.json(body).routes
  end

  setup(function()
    dir = H.tmpdir()
    local _, rc = H.sh("bash " .. H.q(here .. "../../tests/fixtures/tls_certs.sh") .. " " .. H.q(dir))
    assert.equals(0, rc)
    fake = H.start_fixture(dir, "fake_provider", "")
    start_nginx()
    H.writefile(dir .. "/fallback.lua", ([[
return {
  kind = "fallback",
  routes = {
    { name = "untrusted", provider = "openai", base_url = "https://localhost:%d/untrusted/v1", model = "gpt-fake", attempt_timeout_ms = 3000 },
    { name = "good", provider = "openai", base_url = "https://localhost:%d/good/v1", model = "gpt-fake", attempt_timeout_ms = 3000 },
  },
  max_attempts = 1,
}
]]):format(P.untrusted, P.good))
    gw = H.start_egress(dir, "egress", string.format("--fallback %s --heuristics %s",
      H.q(dir .. "/fallback.lua"), H.q(here .. "../../policies/egress_heuristics.lua")),
      "SSL_CERT_FILE=" .. H.q(dir .. "/ca.pem"))
  end)

  teardown(function()
    H.kill_all()
    if dir then os.execute("rm -rf " .. H.q(dir)) end
  end)

  it("says why in the attempts: a connect failure of that route, never the certificate text", function()
    -- the good route fails at the provider, so the answer lists both attempts
    H.request(dir, "POST", fake.url .. "/_script", { body = cjson.encode({ route = "good", steps = { "500" } }) })
    local st, resp = H.request(dir, "POST", gw.url .. "/v1/chat/completions",
      { body = cjson.encode({ model = "m", messages = { { role = "user", content = "hi" } } }), max_time = 10 })
    assert.equals(502, st, resp)
    local j = H.json(resp)
    assert.equals("untrusted", j.error.attempts[1].route)
    assert.equals("connection_refused", j.error.attempts[1].class)
    assert.is_nil(resp:find("certificate", 1, true), resp)
  end)

  it("calls a route over verified TLS; a certificate it cannot verify fails the attempt and the chain falls back", function()
    local body = cjson.encode({ model = "m", messages = { { role = "user", content = "hi" } } })
    local before = counts().good or 0
    for _ = 1, 3 do
      local st, resp = H.request(dir, "POST", gw.url .. "/v1/chat/completions", { body = body, max_time = 10 })
      assert.equals(200, st, resp)
      assert.matches("from good%.$", H.json(resp).choices[1].message.content)
    end
    local c = counts()
    assert.equals(before + 3, c.good, cjson.encode(c))
    assert.is_nil(c.untrusted, "a call went past a certificate it could not verify")
    -- streamed too, over the same pooled TLS connection
    local out = H.sh(string.format("%s -s -N -X POST --data-binary %s %s", H.curl(10),
      H.q(cjson.encode({ model = "m", stream = true, messages = { { role = "user", content = "hi" } } })),
      H.q(gw.url .. "/v1/chat/completions")))
    assert.truthy(out:find("data: [DONE]", 1, true), out)
    assert.equals(before + 4, counts().good)
  end)

end)
