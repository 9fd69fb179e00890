-- openmesh.contract: the shape of each policy kind, the examples, and the
-- runtime checks on what policy functions return (docs/POLICIES.md).
local contract = require "openmesh.contract"

-- A valid policy of each kind, with `t`'s fields laid over it.
local function with(base, t)
  local p = {}
  for k, v in pairs(base) do
    p[k] = v
  end
  for k, v in pairs(t or {}) do
    p[k] = v
  end
  return p
end

local function all_peers(_, peers)
  return peers
end

local function traffic(t)
  return with({ kind = "traffic", subset = all_peers }, t)
end

local function route(name, t)
  return with({ name = name, provider = "openai", base_url = "http://127.0.0.1:9101/v1",
    model = "gpt-4o-mini" }, t)
end

local function fallback(t)
  return with({ kind = "fallback", routes = { route("primary"), route("backup") } }, t)
end

local function egress(t)
  return with({ kind = "egress_heuristics",
    checks = { { name = "trace", pattern = "Traceback", confidence = "high" } },
    holding_lines = { default = "One moment." } }, t)
end

local function accepts(policy)
  local ok, err = contract.validate(policy, "p.lua")
  assert.is_nil(err)
  assert.is_true(ok)
end

local function rejects(policy, message)
  local ok, err = contract.validate(policy, "p.lua")
  assert.is_nil(ok)
  assert.equal(message, err)
end

describe("contract.validate", function()
  describe("common fields", function()
    it("accepts a minimal policy of each kind", function()
      accepts(traffic())
      accepts(fallback())
      accepts(egress())
    end)

    it("accepts name, description and an empty examples list", function()
      accepts(traffic { name = "edge", description = "the edge", examples = {} })
    end)

    it("needs a table", function()
      rejects(nil, "policy: table expected (a policy file returns a table), got nil")
      rejects("traffic", "policy: table expected (a policy file returns a table), got 'traffic'")
    end)

    it("needs a known kind", function()
      rejects({}, "field 'kind': one of 'traffic', 'fallback', 'egress_heuristics' expected, got nil")
      rejects(traffic { kind = "trafic" },
        "field 'kind': one of 'traffic', 'fallback', 'egress_heuristics' expected, got 'trafic'")
    end)

    it("refuses unknown fields, with a suggestion when one is close", function()
      rejects(traffic { max_inflght = 3 }, "unknown field 'max_inflght' (did you mean 'max_inflight'?)")
      rejects(traffic { colour = "red" }, "unknown field 'colour'")
      rejects(traffic { [1] = "x" }, "unknown field '[1]'")
      -- fields of another kind are unknown here
      rejects(traffic { routes = {} }, "unknown field 'routes'")
    end)

    it("reports unknown fields in a stable order", function()
      rejects(traffic { zz = 1, aa = 1, mm = 1 }, "unknown field 'aa'")
    end)

    it("checks name and description", function()
      rejects(traffic { name = "" }, "field 'name': non-empty string expected, got ''")
      rejects(traffic { description = 3 }, "field 'description': string expected, got 3")
    end)

    it("checks that examples is an array", function()
      rejects(traffic { examples = "none" }, "field 'examples': array expected, got 'none'")
      rejects(traffic { examples = { x = {} } }, "field 'examples': array expected, got a table with non-array key 'x'")
      rejects(traffic { examples = { [2] = { expect = {} } } },
        "field 'examples': array expected, got a table with a hole at [1]")
      rejects(traffic { examples = { 5 } }, "field 'examples[1]': table expected, got 5")
    end)

    it("reads fields raw: no __index or __pairs code runs", function()
      local p = setmetatable(traffic(), { __index = function()
        error("__index ran")
      end, __pairs = function()
        error("__pairs ran")
      end })
      accepts(p)
    end)
  end)

  describe("traffic", function()
    it("needs subset to be a function", function()
      rejects(traffic { subset = false }, "field 'subset': function expected, got false")
      local p = traffic()
      p.subset = nil
      rejects(p, "field 'subset': function expected, got nil")
      rejects(traffic { key = "x-user" }, "field 'key': function expected, got 'x-user'")
      rejects(traffic { authorize = true }, "field 'authorize': function expected, got true")
      accepts(traffic { authorize = function() return true end })
    end)

    it("accepts every pool setting at its bounds", function()
      accepts(traffic { max_inflight = 1, max_queue = 0, adaptive = true, deadline_ms = 0.5,
        per_try_timeout_ms = 1, retries = 0, retry_non_idempotent = false })
      accepts(traffic { max_inflight = 256.0 }) -- a float with an integer value is an integer
    end)

    it("checks integers: type, range, integral, finite", function()
      rejects(traffic { max_inflight = -3 }, "field 'max_inflight': integer >= 1 expected, got -3")
      rejects(traffic { max_inflight = 0 }, "field 'max_inflight': integer >= 1 expected, got 0")
      rejects(traffic { max_inflight = 2.5 }, "field 'max_inflight': integer >= 1 expected, got 2.5")
      rejects(traffic { max_inflight = 0 / 0 }, "field 'max_inflight': integer >= 1 expected, got nan")
      rejects(traffic { max_inflight = math.huge }, "field 'max_inflight': integer >= 1 expected, got inf")
      rejects(traffic { max_inflight = "10" }, "field 'max_inflight': integer >= 1 expected, got '10'")
      rejects(traffic { max_inflight = 2 ^ 70 }, "field 'max_inflight': integer >= 1 expected, got 1.1805916207174e+21")
      rejects(traffic { max_queue = -1 }, "field 'max_queue': integer >= 0 expected, got -1")
      rejects(traffic { retries = 1.5 }, "field 'retries': integer >= 0 expected, got 1.5")
    end)

    it("checks numbers: positive and finite", function()
      rejects(traffic { deadline_ms = 0 }, "field 'deadline_ms': number > 0 expected, got 0")
      rejects(traffic { deadline_ms = -1 }, "field 'deadline_ms': number > 0 expected, got -1")
      rejects(traffic { deadline_ms = math.huge }, "field 'deadline_ms': number > 0 expected, got inf")
      rejects(traffic { per_try_timeout_ms = 0 / 0 }, "field 'per_try_timeout_ms': number > 0 expected, got nan")
      rejects(traffic { per_try_timeout_ms = {} }, "field 'per_try_timeout_ms': number > 0 expected, got table")
    end)

    it("checks booleans", function()
      rejects(traffic { adaptive = "yes" }, "field 'adaptive': boolean expected, got 'yes'")
      rejects(traffic { retry_non_idempotent = 1 }, "field 'retry_non_idempotent': boolean expected, got 1")
      rejects(traffic { retry_429 = "yes" }, "field 'retry_429': boolean expected, got 'yes'")
      accepts(traffic { retry_429 = true })
    end)

    it("checks upgrade tokens and the stream idle timeout", function()
      accepts(traffic { protocol = "h2c", grpc_retry_on = { "UNAVAILABLE", "RESOURCE_EXHAUSTED" } })
      accepts(traffic { protocol = "http1", grpc_retry_on = {} })
      rejects(traffic { protocol = "h3" },
        "field 'protocol': one of 'http1', 'h2c', 'h2' expected, got 'h3'")
      rejects(traffic { grpc_retry_on = { "unavailable" } },
        "field 'grpc_retry_on[1]': gRPC status name (as \"UNAVAILABLE\") expected, got 'unavailable'")
      rejects(traffic { grpc_retry_on = { "UNAVAILABLE", "UNAVAILABLE" } },
        "field 'grpc_retry_on[2]': duplicate status 'UNAVAILABLE'")
      rejects(traffic { grpc_retry_on = "UNAVAILABLE" },
        "field 'grpc_retry_on': array of gRPC status names expected, got 'UNAVAILABLE'")
      accepts(traffic { upgrades = {} })
      accepts(traffic { upgrades = { "websocket", "Foo/2", "x-raw" }, stream_idle_timeout_ms = 500 })
      rejects(traffic { upgrades = "websocket" }, "field 'upgrades': array of protocol tokens expected, got 'websocket'")
      rejects(traffic { upgrades = { 7 } }, "field 'upgrades[1]': protocol token expected, got 7")
      rejects(traffic { upgrades = { "web socket" } },
        "field 'upgrades[1]': 'web socket' is not a protocol token (RFC 9110 7.8) of at most 31 bytes")
      rejects(traffic { upgrades = { "websocket", "WebSocket" } }, "field 'upgrades[2]': duplicate token 'WebSocket'")
      rejects(traffic { upgrades = { "H2C" } },
        "field 'upgrades[1]': \"h2c\" is never forwarded (RFC 9113 3.1 deprecates the h2c upgrade)")
      rejects(traffic { stream_idle_timeout_ms = 0 }, "field 'stream_idle_timeout_ms': number > 0 expected, got 0")
    end)

    it("checks circuit settings", function()
      accepts(traffic { circuit = {} })
      accepts(traffic { circuit = { failures = 3, cooldown_ms = 500, max_cooldown_ms = 60000 } })
      rejects(traffic { circuit = 5 }, "field 'circuit': table expected, got 5")
      rejects(traffic { circuit = { failures = 0 } }, "field 'circuit.failures': integer >= 1 expected, got 0")
      rejects(traffic { circuit = { cooldown_ms = -1 } }, "field 'circuit.cooldown_ms': number > 0 expected, got -1")
      rejects(traffic { circuit = { cooldown_ms = 500, max_cooldown_ms = 100 } },
        "field 'circuit.max_cooldown_ms': must be >= cooldown_ms (500), got 100")
      rejects(traffic { circuit = { failure = 3 } }, "unknown field 'circuit.failure' (did you mean 'failures'?)")
    end)

    it("checks the stream timeouts and the deadline cap", function()
      accepts(traffic { stream_idle_timeout_ms = 60000, max_stream_ms = 3600000 })
      accepts(traffic { deadline_ms = 1000, max_deadline_ms = 1000 })
      accepts(traffic { max_deadline_ms = 30000 }) -- above the 10000 default
      rejects(traffic { stream_idle_timeout_ms = 0 }, "field 'stream_idle_timeout_ms': number > 0 expected, got 0")
      rejects(traffic { max_stream_ms = "1h" }, "field 'max_stream_ms': number > 0 expected, got '1h'")
      rejects(traffic { max_deadline_ms = math.huge }, "field 'max_deadline_ms': number > 0 expected, got inf")
      rejects(traffic { deadline_ms = 2000, max_deadline_ms = 1000 },
        "field 'max_deadline_ms': must be >= deadline_ms (2000), got 1000")
      rejects(traffic { max_deadline_ms = 5000 },
        "field 'max_deadline_ms': must be >= deadline_ms (10000 when omitted), got 5000")
    end)

    it("checks request-body settings", function()
      accepts(traffic { max_body_bytes = 0, replay_limit = 0, body_idle_timeout_ms = 0.5 })
      accepts(traffic { max_body_bytes = 8 * 1024 * 1024, replay_limit = 1048576,
        body_idle_timeout_ms = 30000 })
      rejects(traffic { max_body_bytes = -1 }, "field 'max_body_bytes': integer >= 0 expected, got -1")
      rejects(traffic { max_body_bytes = "8MiB" },
        "field 'max_body_bytes': integer >= 0 expected, got '8MiB'")
      rejects(traffic { replay_limit = 1.5 }, "field 'replay_limit': integer >= 0 expected, got 1.5")
      rejects(traffic { body_idle_timeout_ms = 0 },
        "field 'body_idle_timeout_ms': number > 0 expected, got 0")
    end)

    it("checks the tls settings of https:// peers", function()
      accepts(traffic { tls = {} })
      accepts(traffic { tls = { ca_file = "ca.pem", server_name = "api.internal", verify = false,
        cert_file = "c.pem", key_file = "c.key" } })
      rejects(traffic { tls = "on" }, "field 'tls': table expected, got 'on'")
      rejects(traffic { tls = { ca = "ca.pem" } }, "unknown field 'tls.ca'")
      rejects(traffic { tls = { ca_file = "" } }, "field 'tls.ca_file': non-empty string expected, got ''")
      rejects(traffic { tls = { verify = "yes" } }, "field 'tls.verify': boolean expected, got 'yes'")
      rejects(traffic { tls = { server_name = 7 } },
        "field 'tls.server_name': must be a host name of 1..253 bytes, got 7")
      rejects(traffic { tls = { cert_file = "c.pem" } }, "field 'tls.key_file': required with cert_file")
      rejects(traffic { tls = { key_file = "c.key" } }, "field 'tls.cert_file': required with key_file")
    end)

    it("checks budget_ms: positive, at most 50", function()
      accepts(traffic { budget_ms = 0.5 })
      accepts(traffic { budget_ms = 50 })
      rejects(traffic { budget_ms = 0 }, "field 'budget_ms': number > 0 and <= 50 expected, got 0")
      rejects(traffic { budget_ms = 51 }, "field 'budget_ms': number > 0 and <= 50 expected, got 51")
      rejects(traffic { budget_ms = 1 / 0 }, "field 'budget_ms': number > 0 and <= 50 expected, got inf")
      rejects(traffic { budget_ms = "1" }, "field 'budget_ms': number > 0 and <= 50 expected, got '1'")
    end)

    it("checks vary, and runs examples on what a vary policy sees", function()
      accepts(traffic { vary = {} })
      accepts(traffic { vary = { "x-user", "cookie", ":method", ":path" } })
      rejects(traffic { vary = "x-user" }, "field 'vary': array of header names expected, got 'x-user'")
      rejects(traffic { vary = { "X-User" } },
        "field 'vary[1]': 'X-User' is not a lower-case header name, \":method\", \":path\" or \":identity\"")
      rejects(traffic { vary = { ":authority" } },
        "field 'vary[1]': ':authority' is not a lower-case header name, \":method\", \":path\" or \":identity\"")
      rejects(traffic { vary = { "a b" } },
        "field 'vary[1]': 'a b' is not a lower-case header name, \":method\", \":path\" or \":identity\"")
      rejects(traffic { vary = { "x", "x" } }, "field 'vary[2]': duplicate name 'x'")
      rejects(traffic { vary = { 1 } }, "field 'vary[1]': header name expected, got 1")
      -- the example's x-b header is invisible to a policy that varies on x-a only
      local reads_b = function(req, peers)
        if req.headers["x-b"] or req.method or req.path then
          return {}
        end
        return peers
      end
      local ex = { { req = { method = "POST", path = "/x", headers = { ["x-b"] = "1" } },
        peers = { { id = "a" } }, expect = {} } }
      accepts(traffic { subset = reads_b, examples = ex })
      -- reading what vary does not name is an error, never a quiet nil
      rejects(traffic { subset = reads_b, vary = { "x-a" }, examples = ex },
        'example 1: subset raised: reads header \'x-b\', which its vary does not name (add "x-b" to vary)')
      rejects(traffic { subset = reads_b, vary = { "x-a", "X-B" }, examples = ex },
        "field 'vary[2]': 'X-B' is not a lower-case header name, \":method\", \":path\" or \":identity\"")
      rejects(traffic { subset = reads_b, vary = { "x-b" }, examples = {
        { req = { method = "POST" }, peers = { { id = "a" } }, expect = {} } } },
        'example 1: subset raised: reads req.method, which its vary does not name (add ":method" to vary)')
      local reads_path = function(req, peers)
        return req.path == "/x" and {} or peers
      end
      rejects(traffic { subset = reads_path, vary = { ":method" }, examples = ex },
        'example 1: subset raised: reads req.path, which its vary does not name (add ":path" to vary)')
      accepts(traffic { subset = reads_b, vary = { "x-b", ":method", ":path" }, examples = ex })
      local zone = function(req, peers)
        return req.metadata.zone and {} or peers
      end
      rejects(traffic { subset = zone, vary = {}, examples = { { peers = { { id = "a" } }, expect = { "a" } } } },
        "example 1: subset raised: reads req.metadata.zone, which its vary does not name (a policy that declares vary sees no metadata)")
      -- a declared header the request lacks reads as nil, in any case
      local absent = function(req, peers)
        return (req.headers["x-a"] or req.headers["X-A"]) and {} or peers
      end
      accepts(traffic { subset = absent, vary = { "x-a" }, examples = { { peers = { { id = "a" } }, expect = { "a" } } } })
      -- a mismatch that is not a read of an undeclared field keeps its hint
      rejects(traffic { subset = function(_, peers) return peers end, vary = { "x-a" },
          examples = { { peers = { { id = "a" } }, expect = {} } } },
        "example 1: subset returned {a}, expected {} (the policy declares vary: it sees only the service and those fields)")
      local seen = contract.visible_req({ vary = { "x-a", ":path" } },
        { service = "s", method = "GET", path = "/p", headers = { ["x-a"] = "1", ["x-b"] = "2" } })
      assert.same({ service = "s", path = "/p", headers = { ["x-a"] = "1" }, metadata = {} }, seen)
    end)
  end)

  describe("fallback", function()
    it("accepts every route and policy field", function()
      accepts(fallback {
        routes = { route("primary", { provider = "anthropic", base_url = "https://api.example.com/v1",
          api_key_env = "ANTHROPIC_API_KEY", attempt_timeout_ms = 30000, first_byte_timeout_ms = 10000,
          context_tokens = 200000 }) },
        order = function()
          return { "primary" }
        end,
        max_attempts = 4, per_wait_ceiling_ms = 8000, deadline_ms = 60000,
        backoff_base_ms = 500, backoff_cap_ms = 8000,
      })
    end)

    it("needs a non-empty array of routes", function()
      rejects(fallback { routes = {} }, "field 'routes': non-empty array expected, got an empty one")
      rejects(fallback { routes = route("primary") },
        "field 'routes': array expected, got a table with non-array key 'base_url'") -- first in sorted order
      local p = fallback()
      p.routes = nil
      rejects(p, "field 'routes': array expected, got nil")
    end)

    it("needs unique route names", function()
      rejects(fallback { routes = { route("primary"), route("backup"), route("backup") } },
        "field 'routes[3].name': duplicate route name 'backup'")
      rejects(fallback { routes = { route("primary"), route("primary") } },
        "field 'routes[2].name': duplicate route name 'primary'")
    end)

    it("checks each route's fields by path", function()
      rejects(fallback { routes = { route("a"), route("b", { provider = "gemini" }) } },
        "field 'routes[2].provider': 'openai' or 'anthropic' expected, got 'gemini'")
      rejects(fallback { routes = { route("a", { base_url = "127.0.0.1:9101" }) } },
        "field 'routes[1].base_url': http:// or https:// URL expected, got '127.0.0.1:9101'")
      rejects(fallback { routes = { route("a", { model = "" }) } },
        "field 'routes[1].model': non-empty string expected, got ''")
      rejects(fallback { routes = { route("a", { api_key_env = "OPENAI KEY" }) } },
        "field 'routes[1].api_key_env': environment variable name expected, got 'OPENAI KEY'")
      rejects(fallback { routes = { route("a", { attempt_timeout_ms = -1 }) } },
        "field 'routes[1].attempt_timeout_ms': number > 0 expected, got -1")
      rejects(fallback { routes = { route("a", { first_byte_timeout_ms = 0 / 0 }) } },
        "field 'routes[1].first_byte_timeout_ms': number > 0 expected, got nan")
      rejects(fallback { routes = { route("a", { context_tokens = 0 }) } },
        "field 'routes[1].context_tokens': integer >= 1 expected, got 0")
      rejects(fallback { routes = { route("a", { timeout_ms = 5 }) } },
        "unknown field 'routes[1].timeout_ms'")
      rejects(fallback { routes = { { name = "a", provider = "openai", model = "m" } } },
        "field 'routes[1].base_url': http:// or https:// URL expected, got nil")
    end)

    it("checks the recovery settings", function()
      rejects(fallback { max_attempts = 0 }, "field 'max_attempts': integer >= 1 expected, got 0")
      rejects(fallback { per_wait_ceiling_ms = -5 }, "field 'per_wait_ceiling_ms': number > 0 expected, got -5")
      rejects(fallback { deadline_ms = math.huge }, "field 'deadline_ms': number > 0 expected, got inf")
      rejects(fallback { backoff_base_ms = 0 }, "field 'backoff_base_ms': number > 0 expected, got 0")
      rejects(fallback { backoff_cap_ms = "8s" }, "field 'backoff_cap_ms': number > 0 expected, got '8s'")
      rejects(fallback { order = { "primary" } }, "field 'order': function expected, got table")
    end)
  end)

  describe("egress_heuristics", function()
    it("accepts the three kinds of check, holding lines per agent and handoff", function()
      accepts(egress {
        checks = {
          { name = "a", pattern = "%f[%w]NaN%f[%W]", confidence = "high", description = "NaN" },
          { name = "b", substrings = { "rate_limit_exceeded", "insufficient_quota" }, confidence = "high" },
          { name = "c", check = function(text)
            return #text == 0
          end, confidence = "low" },
        },
        holding_lines = { default = "One moment.", support = "A teammate will follow up." },
        handoff = { support = "human-queue" },
      })
      accepts(egress { checks = {} })
    end)

    it("needs exactly one of pattern, substrings or check", function()
      rejects(egress { checks = { { name = "x", confidence = "high" } } },
        "field 'checks[1]': exactly one of 'pattern', 'substrings' or 'check' expected, got none")
      rejects(egress { checks = { { name = "x", confidence = "high", pattern = "a", check = print } } },
        "field 'checks[1]': exactly one of 'pattern', 'substrings' or 'check' expected, got 'pattern' and 'check'")
    end)

    it("checks names, confidence and matchers", function()
      rejects(egress { checks = { { pattern = "a", confidence = "high" } } },
        "field 'checks[1].name': non-empty string expected, got nil")
      rejects(egress { checks = { { name = "x", pattern = "a", confidence = "medium" } } },
        "field 'checks[1].confidence': 'high' or 'low' expected, got 'medium'")
      rejects(egress { checks = { { name = "x", pattern = "a" } } },
        "field 'checks[1].confidence': 'high' or 'low' expected, got nil")
      rejects(egress { checks = { { name = "x", substrings = {}, confidence = "low" } } },
        "field 'checks[1].substrings': non-empty array expected, got an empty one")
      rejects(egress { checks = { { name = "x", substrings = { "a", "" }, confidence = "low" } } },
        "field 'checks[1].substrings[2]': non-empty string expected, got ''")
      rejects(egress { checks = { { name = "x", check = "fn", confidence = "low" } } },
        "field 'checks[1].check': function expected, got 'fn'")
      rejects(egress { checks = { { name = "x", pattern = 5, confidence = "low" } } },
        "field 'checks[1].pattern': Lua pattern (string) expected, got 5")
    end)

    it("needs unique check names", function()
      rejects(egress { checks = {
        { name = "a", pattern = "x", confidence = "low" },
        { name = "b", pattern = "y", confidence = "low" },
        { name = "a", pattern = "z", confidence = "low" },
      } }, "field 'checks[3].name': duplicate check name 'a'")
    end)

    it("rejects patterns that would fail at match time, even where find('', p) succeeds", function()
      local cases = {
        -- pattern, message, a text on which string.find raises
        { "a[", "malformed pattern (missing ']')", "a" },
        { "x%", "malformed pattern (ends with '%')", "x" },
        { "x(a", "unfinished capture", "xa" },
        { "x.)", "invalid pattern capture", "x." },
        { "x%b", "malformed pattern (missing arguments to '%b')", "x" },
        { "x%fa", "missing '[' after '%f' in pattern", "x" },
        { "x%1", "invalid capture index %1", "x" },
        { "x(a%1)", "invalid capture index %1", "xa" },
        { "x" .. ("()"):rep(33), "too many captures", "x" },
      }
      for _, case in ipairs(cases) do
        local pattern, message, text = case[1], case[2], case[3]
        assert.is_true(pcall(string.find, "", pattern)) -- the naive check passes
        local ok, err = pcall(string.find, text, pattern)
        assert.is_false(ok)
        assert.truthy(err:find(message, 1, true), err)
        rejects(egress { checks = { { name = "x", pattern = pattern, confidence = "high" } } },
          "field 'checks[1].pattern': invalid Lua pattern: " .. message)
      end
    end)

    it("accepts the patterns Lua accepts", function()
      for _, pattern in ipairs { "^panic: ", "%f[%w]NaN%f[%W]", "[]]", "[^%]]", "%bxy", "(a)%1", "()x()",
        "a-b*c+d?", "%%", "[%a_][%w_]*", "end$", "$x", "^", "HTTP/%d[%.%d]* [45]%d%d", "[a-]", "%(%)",
        "x)" } do -- no specials at all: a plain search, ')' included
        assert.is_nil(contract.pattern_error(pattern), pattern)
        assert.is_true(pcall(string.find, "some text xy (a)a end", pattern), pattern)
      end
    end)

    it("needs holding_lines with a default", function()
      local p = egress()
      p.holding_lines = nil
      rejects(p, "field 'holding_lines': table expected, got nil")
      rejects(egress { holding_lines = { support = "hi" } },
        "field 'holding_lines.default': non-empty string expected, got nil")
      rejects(egress { holding_lines = { default = "hi", sales = "" } },
        "field 'holding_lines.sales': non-empty string expected, got ''")
      rejects(egress { holding_lines = { default = "hi", [1] = "x" } },
        "field 'holding_lines[1]': keys must be non-empty strings")
    end)

    it("checks handoff targets", function()
      rejects(egress { handoff = { support = 3 } },
        "field 'handoff.support': non-empty string expected, got 3")
      rejects(egress { handoff = "human" }, "field 'handoff': table expected, got 'human'")
    end)
  end)

  describe("example shapes", function()
    it("names the field inside an example precisely", function()
      rejects(traffic { examples = { { expect = {}, reqs = {} } } },
        "unknown field 'examples[1].reqs' (did you mean 'req'?)")
      rejects(traffic { examples = { { req = { headers = { ["X-User"] = "u" } }, expect = {} } } },
        "field 'examples[1].req.headers['X-User']': header names must be lower-case")
      rejects(traffic { examples = { { req = { headers = { ["x-n"] = 1 } }, expect = {} } } },
        "field 'examples[1].req.headers['x-n']': string expected, got 1")
      rejects(traffic { examples = { { peers = { { id = "a" }, { url = "http://x/" } }, expect = {} } } },
        "field 'examples[1].peers[2].id': non-empty string expected, got nil")
      rejects(traffic { examples = { { peers = { { id = "a", weight = 0 } }, expect = {} } } },
        "field 'examples[1].peers[1].weight': number > 0 expected, got 0")
      rejects(traffic { examples = { { peers = { { id = "a", metadata = { v = 2 } } }, expect = {} } } },
        "field 'examples[1].peers[1].metadata.v': string expected, got 2")
      rejects(traffic { examples = { { expect_key = 5 } } },
        "field 'examples[1].expect_key': string or false expected, got 5")
    end)

    it("needs something to check in a traffic example", function()
      rejects(traffic { examples = { { peers = { { id = "a" } } } } },
        "field 'examples[1]': an example needs 'expect', 'expect_key', 'expect_decision' or 'expect_authorized'")
    end)

    it("needs unique peer ids and expected ids among the peers", function()
      rejects(traffic { examples = { { peers = { { id = "a" }, { id = "a" } }, expect = {} } } },
        "field 'examples[1].peers[2].id': duplicate peer id 'a'")
      rejects(traffic { examples = { { peers = { { id = "a" } }, expect = { "b" } } } },
        "field 'examples[1].expect[1]': id 'b' is not among the example's peers")
      rejects(traffic { examples = { { peers = { { id = "a" } }, expect = { "a", "a" } } } },
        "field 'examples[1].expect[2]': duplicate id 'a'")
    end)

    it("checks fallback and egress examples", function()
      rejects(fallback { examples = { { ctx = { context = "batch" }, expect = { "primary" } } } },
        "field 'examples[1].ctx.context': 'interactive' or 'async' expected, got 'batch'")
      rejects(fallback { examples = { { ctx = { failed = { { route = "primary", status = -1 } } },
        expect = { "primary" } } } },
        "field 'examples[1].ctx.failed[1].status': integer >= 0 expected, got -1")
      rejects(fallback { examples = { { expect = {} } } },
        "field 'examples[1].expect': non-empty array expected, got an empty one")
      rejects(egress { examples = { { expect = { flagged = false } } } },
        "field 'examples[1].text': string expected, got nil")
      rejects(egress { examples = { { text = "x", expect = { flagged = "no" } } } },
        "field 'examples[1].expect.flagged': boolean expected, got 'no'")
      rejects(egress { examples = { { text = "x", expect = { flagged = true, confidence = "mid" } } } },
        "field 'examples[1].expect.confidence': 'high' or 'low' expected, got 'mid'")
    end)
  end)

  describe("running examples", function()
    local peers = { { id = "a", zone = "z1", metadata = { version = "v2" } }, { id = "b" } }

    it("passes when subset and key give what is expected (ids in any order)", function()
      accepts(traffic {
        key = function(req)
          return req.headers["x-user"]
        end,
        examples = {
          { peers = peers, expect = { "b", "a" } },
          { req = { headers = { ["x-user"] = "user-1" } }, expect_key = "user-1" },
          { expect_key = false },
        },
      })
    end)

    it("fills the documented defaults into req and peers", function()
      local seen
      accepts(traffic {
        subset = function(req, ps)
          seen = { req = req, peer = ps[1] }
          return ps
        end,
        examples = { { peers = { { id = "a" } }, expect = { "a" } } },
      })
      assert.same({ service = "example", method = "GET", path = "/", headers = {}, metadata = {} }, seen.req)
      assert.same({ id = "a", url = "http://127.0.0.1:1/", weight = 1, metadata = {} }, seen.peer)
    end)

    it("reports a wrong subset with both id lists", function()
      rejects(traffic { examples = { { peers = peers, expect = { "a" } } } },
        "example 1: subset returned {a, b}, expected {a}")
      rejects(traffic {
        subset = function()
          return {}
        end,
        examples = { { peers = peers, expect = { "a", "b" } }, { peers = peers, expect = { "b" } } },
      }, "example 1: subset returned {}, expected {a, b}")
    end)

    it("numbers the failing example", function()
      rejects(traffic {
        subset = function(_, ps)
          return { ps[1] }
        end,
        examples = {
          { peers = peers, expect = { "a" } },
          { peers = peers, expect = { "a" } },
          { peers = { { id = "a" }, { id = "b" } }, expect = { "b" } },
        },
      }, "example 3: subset returned {a}, expected {b}")
    end)

    it("reports a wrong key", function()
      rejects(traffic { examples = { { expect_key = "user-1" } } },
        "example 1: key returned nil, expected 'user-1'")
      rejects(traffic {
        key = function()
          return "user-2"
        end,
        examples = { { expect_key = false } },
      }, "example 1: key returned 'user-2', expected nil")
      rejects(traffic {
        key = function()
          return 42
        end,
        examples = { { expect_key = "42" } },
      }, "example 1: key returned a number (42), expected a string or nil")
    end)

    it("reports a policy function that raises", function()
      local ok, err = contract.validate(traffic {
        subset = function()
          error("no zone")
        end,
        examples = { { expect_key = false }, { expect = {} } },
      })
      assert.is_nil(ok)
      assert.matches("^example 2: subset raised: .*no zone$", err)
      ok, err = contract.validate(traffic {
        key = function()
          error({ code = 1 })
        end,
        examples = { { expect_key = false } },
      })
      assert.is_nil(ok)
      assert.matches("^example 1: key raised: table: ", err)
    end)

    it("reports subset answers that break the contract", function()
      rejects(traffic {
        subset = function()
          return { "a" }
        end,
        examples = { { peers = peers, expect = { "a" } } },
      }, "example 1: subset returned a string ('a') at [1], expected one of the peer tables it was given"
        .. " (return the peers themselves, not their ids)")
      rejects(traffic {
        subset = function(_, ps)
          return { { id = ps[1].id } }
        end,
        examples = { { peers = peers, expect = { "a" } } },
      }, "example 1: subset returned a peer that was not offered (id 'a')")
    end)

    it("runs fallback examples through order, comparing in order", function()
      local p = fallback {
        order = function(ctx)
          if ctx.context == "async" then
            return { "backup", "primary" }
          end
          return { "primary", "backup" }
        end,
        examples = {
          { expect = { "primary", "backup" } },
          { ctx = { context = "async" }, expect = { "backup", "primary" } },
        },
      }
      accepts(p)
      p.examples[2].expect = { "primary", "backup" }
      rejects(p, "example 2: order returned {backup, primary}, expected {primary, backup}")
      accepts(fallback { examples = { { expect = { "primary", "backup" } } } }) -- default order
    end)

    it("reports fallback order errors", function()
      rejects(fallback {
        order = function()
          return { "primary", "standby" }
        end,
        examples = { { expect = { "primary" } } },
      }, "example 1: order returned an unknown route 'standby' (routes: {primary, backup})")
    end)

    it("runs egress examples through evaluate", function()
      local p = egress {
        checks = {
          { name = "trace", pattern = "Traceback", confidence = "high" },
          { name = "short", check = function(text)
            return #text < 3
          end, confidence = "low" },
        },
        examples = {
          { text = "Traceback (most recent call last)", expect = { flagged = true, confidence = "high",
            checks = { "trace" } } },
          { text = "ok", expect = { flagged = true, confidence = "low" } },
          { text = "Your order shipped.", expect = { flagged = false } },
        },
      }
      accepts(p)
      p.examples[3].expect = { flagged = true }
      rejects(p, "example 3: evaluate returned flagged = false (checks {}), expected flagged = true")
      p.examples[3] = { text = "ok", expect = { flagged = true, confidence = "high" } }
      rejects(p, "example 3: evaluate returned confidence 'low' (checks {short}), expected 'high'")
      p.examples[3] = { text = "Tb", expect = { flagged = true, checks = { "trace" } } }
      rejects(p, "example 3: evaluate matched checks {short}, expected {trace}")
    end)

    it("passes the example's ctx (with defaults) to checks", function()
      local seen
      accepts(egress {
        checks = { { name = "c", confidence = "low", check = function(_, ctx)
          seen = ctx
          return false
        end } },
        examples = { { text = "x", ctx = { agent = "support" }, expect = { flagged = false } } },
      })
      assert.same({ agent = "support", context = "interactive", channel = "example", failed = {} }, seen)
    end)

    it("reports a check that raises", function()
      local ok, err = contract.validate(egress {
        checks = { { name = "boom", confidence = "low", check = function()
          error("bad check")
        end } },
        examples = { { text = "x", expect = { flagged = false } } },
      })
      assert.is_nil(ok)
      assert.matches("^example 1: check 'boom' raised: .*bad check$", err)
    end)
  end)
end)

describe("contract.subset", function()
  local function peers()
    return { contract.default_peer { id = "a" }, contract.default_peer { id = "b" },
      contract.default_peer { id = "c" } }
  end

  local function policy(fn)
    return { kind = "traffic", subset = fn }
  end

  it("runs a vary policy without chance or the clock, and gives them back after", function()
    local random, randomseed, time, clock = math.random, math.randomseed, os.time, os.clock
    local draws = {
      random = function() return math.random() end,
      randomseed = function() return math.randomseed(1) end,
      time = function() return os.time() end,
      clock = function() return os.clock() end,
    }
    for name, draw in pairs(draws) do
      local got, err = contract.subset({ kind = "traffic", vary = {}, subset = function(_, p)
        draw()
        return p
      end }, {}, peers())
      assert.is_nil(got)
      assert.matches("is not available to a policy that declares vary", err, 1, true)
      assert.matches(name, err, 1, true)
      -- without vary, the same policy draws
      assert.equal(3, #assert(contract.subset(policy(function(_, p)
        draw()
        return p
      end), {}, peers())))
    end
    local key, kerr = contract.key({ kind = "traffic", vary = {}, subset = all_peers,
      key = function() return tostring(os.time()) end }, {})
    assert.is_nil(key)
    assert.matches("os.time is not available to a policy that declares vary", kerr, 1, true)
    assert.equal(random, math.random)
    assert.equal(randomseed, math.randomseed)
    assert.equal(time, os.time)
    assert.equal(clock, os.clock)
  end)

  it("accepts the peers themselves, any sub-array of them, and the empty array", function()
    local ps = peers()
    assert.equal(ps, contract.subset(policy(all_peers), {}, ps))
    local r = contract.subset(policy(function(_, p)
      return { p[3], p[1] }
    end), {}, ps)
    assert.equal(ps[3], r[1])
    assert.equal(ps[1], r[2])
    assert.same({}, contract.subset(policy(function()
      return {}
    end), {}, ps))
  end)

  it("refuses copies of peers: identity, not equality", function()
    local ps = peers()
    local r, err = contract.subset(policy(function(_, p)
      return { p[1], { id = "b", url = p[2].url, weight = 1, metadata = {} } }
    end), {}, ps)
    assert.is_nil(r)
    assert.equal("subset returned a peer that was not offered (id 'b')", err)
  end)

  it("refuses duplicates, holes, non-tables and non-array tables", function()
    local ps = peers()
    local cases = {
      { function(_, p)
        return { p[1], p[1] }
      end, "subset returned the peer 'a' twice" },
      { function(_, p)
        return { p[1], nil, p[2] }
      end, "subset returned a table that is not an array (a hole at [2])" },
      { function(_, p)
        return { first = p[1] }
      end, "subset returned a table that is not an array (non-array key 'first')" },
      { function()
        return nil
      end, "subset returned a non-table (nil), expected an array of the peers it was given" },
      { function()
        return "a"
      end, "subset returned a non-table ('a'), expected an array of the peers it was given" },
      { function(_, p)
        return { p[1], 7 }
      end, "subset returned a number (7) at [2], expected one of the peer tables it was given" },
    }
    for _, case in ipairs(cases) do
      local r, err = contract.subset(policy(case[1]), {}, ps)
      assert.is_nil(r)
      assert.equal(case[2], err)
    end
  end)

  it("never widens: a failing policy gives an error, not the full peer set", function()
    local ps = peers()
    local r, err = contract.subset(policy(function()
      error("lookup failed")
    end), {}, ps)
    assert.is_nil(r)
    assert.matches("^subset raised: .*lookup failed$", err)
    r, err = contract.subset({ kind = "traffic" }, {}, ps)
    assert.is_nil(r)
    assert.matches("^subset raised: ", err)
  end)

  it("passes req and peers through unchanged", function()
    local req, ps, got_req, got_peers = contract.default_req {}, peers(), nil, nil
    contract.subset(policy(function(r, p)
      got_req, got_peers = r, p
      return {}
    end), req, ps)
    assert.equal(req, got_req)
    assert.equal(ps, got_peers)
  end)
end)

describe("contract.key", function()
  it("is nil without a key function", function()
    local k, err = contract.key({ kind = "traffic" }, {})
    assert.is_nil(k)
    assert.is_nil(err)
  end)

  it("returns a string or nil, anything else is an error", function()
    local function key(v)
      return { kind = "traffic", key = function()
        return v
      end }
    end
    assert.equal("u1", contract.key(key("u1"), {}))
    local k, err = contract.key(key(nil), {})
    assert.is_nil(k)
    assert.is_nil(err)
    k, err = contract.key(key(false), {})
    assert.is_nil(k)
    assert.equal("key returned a boolean (false), expected a string or nil", err)
    k, err = contract.key(key({}), {})
    assert.is_nil(k)
    assert.equal("key returned a table (table), expected a string or nil", err)
  end)
end)

describe("contract.order", function()
  local routes = { route("primary"), route("backup"), route("fast") }

  local function order(fn)
    return { kind = "fallback", routes = routes, order = fn }
  end

  it("defaults to the routes as listed", function()
    assert.same({ "primary", "backup", "fast" }, contract.order({ kind = "fallback", routes = routes }, {}))
  end)

  it("returns the policy's order, given the ctx", function()
    local p = order(function(ctx)
      return ctx.context == "interactive" and { "fast", "primary" } or { "primary" }
    end)
    assert.same({ "fast", "primary" }, contract.order(p, contract.default_ctx()))
    assert.same({ "primary" }, contract.order(p, contract.default_ctx { context = "async" }))
  end)

  it("refuses unknown, duplicate, non-string and no routes", function()
    local cases = {
      { { "primary", "nope" }, "order returned an unknown route 'nope' (routes: {primary, backup, fast})" },
      { { "fast", "fast" }, "order returned the route 'fast' twice" },
      { { "fast", 2 }, "order returned a number (2) at [2], expected a route name" },
      { {}, "order returned no routes" },
      { "primary", "order returned a non-table ('primary'), expected an array of route names" },
      { { [2] = "fast" }, "order returned a table that is not an array (a hole at [1])" },
    }
    for _, case in ipairs(cases) do
      local names, err = contract.order(order(function()
        return case[1]
      end), {})
      assert.is_nil(names)
      assert.equal(case[2], err)
    end
  end)

  it("reports an order function that raises", function()
    local names, err = contract.order(order(function()
      error("oops")
    end), {})
    assert.is_nil(names)
    assert.matches("^order raised: .*oops$", err)
  end)
end)

describe("contract.evaluate", function()
  local p = egress {
    checks = {
      { name = "dot_star", substrings = { ".*" }, confidence = "low" },
      { name = "trace", pattern = "Traceback %(most recent call last%)", confidence = "high" },
      { name = "short", check = function(text)
        return #text < 5 and 1 or nil -- truthy, not only true
      end, confidence = "low" },
    },
  }

  it("lists matching checks in policy order; confidence high if any high matched", function()
    assert.same({ flagged = true, confidence = "high", checks = { "dot_star", "trace" } },
      contract.evaluate(p, "Traceback (most recent call last) .*"))
    assert.same({ flagged = true, confidence = "high", checks = { "trace" } },
      contract.evaluate(p, "Traceback (most recent call last)"))
  end)

  it("is low when only low checks matched, and unflagged with no confidence otherwise", function()
    assert.same({ flagged = true, confidence = "low", checks = { "short" } }, contract.evaluate(p, "ok"))
    assert.same({ flagged = false, checks = {} }, contract.evaluate(p, "Your order shipped."))
  end)

  it("treats substrings literally and patterns as Lua patterns", function()
    assert.same({ "dot_star" }, contract.evaluate(p, "a .* b here").checks)
    assert.same({}, contract.evaluate(p, "anything at all").checks) -- '.*' is not a pattern here
  end)

  it("passes ctx (default: the example defaults) to check functions", function()
    local seen
    local q = egress { checks = { { name = "c", confidence = "low", check = function(_, ctx)
      seen = ctx
    end } } }
    contract.evaluate(q, "x")
    assert.equal("example", seen.agent)
    contract.evaluate(q, "x", { agent = "support" })
    assert.same({ agent = "support" }, seen)
  end)

  it("returns an error for a non-string text or a raising check", function()
    local r, err = contract.evaluate(p, nil)
    assert.is_nil(r)
    assert.equal("evaluate: text must be a string, got nil", err)
    r, err = contract.evaluate(egress { checks = { { name = "x", confidence = "low", check = function()
      error("broken")
    end } } }, "x")
    assert.is_nil(r)
    assert.matches("^check 'x' raised: .*broken$", err)
  end)
end)

describe("defaults and helpers", function()
  it("fills request defaults into a fresh table", function()
    local headers = { ["x-user"] = "u1" }
    local req = contract.default_req { method = "POST", headers = headers }
    assert.same({ service = "example", method = "POST", path = "/", headers = { ["x-user"] = "u1" },
      metadata = {} }, req)
    assert.are_not.equal(headers, req.headers)
    assert.same(contract.default_req {}, contract.default_req())
  end)

  it("fills peer defaults, keeping the zone optional", function()
    assert.same({ id = "a", url = "http://127.0.0.1:1/", weight = 1, metadata = {} },
      contract.default_peer { id = "a" })
    assert.same({ id = "b", url = "http://h/", weight = 3, zone = "z1", metadata = { v = "2" } },
      contract.default_peer { id = "b", url = "http://h/", weight = 3, zone = "z1", metadata = { v = "2" } })
  end)

  it("fills context defaults", function()
    assert.same({ agent = "example", context = "interactive", channel = "example", failed = {} },
      contract.default_ctx())
    local failed = { { route = "primary", status = 503 } }
    local ctx = contract.default_ctx { context = "async", failed = failed }
    assert.same(failed, ctx.failed)
    assert.are_not.equal(failed[1], ctx.failed[1])
  end)

  it("names a policy by its field, else by its file", function()
    assert.equal("edge", contract.name({ name = "edge" }, "policies/traffic.lua"))
    assert.equal("traffic", contract.name({}, "policies/traffic.lua"))
    assert.equal("canary", contract.name({}, "@examples/policies/canary.lua"))
  end)

  it("copies settings without functions or examples", function()
    local p = fallback {
      order = function()
        return { "primary" }
      end,
      max_attempts = 3,
      examples = { { expect = { "primary" } } },
    }
    local s = contract.settings(p)
    assert.equal("fallback", s.kind)
    assert.equal(3, s.max_attempts)
    assert.is_nil(s.order)
    assert.is_nil(s.examples)
    assert.equal("primary", s.routes[1].name)
    assert.are_not.equal(p.routes, s.routes)
  end)

  it("finds holding lines and handoff by agent", function()
    local p = egress { holding_lines = { default = "d", support = "s" }, handoff = { support = "q" } }
    assert.equal("s", contract.holding_line(p, "support"))
    assert.equal("d", contract.holding_line(p, "sales"))
    assert.equal("d", contract.holding_line(p, nil))
    assert.equal("q", contract.handoff(p, "support"))
    assert.is_nil(contract.handoff(p, "sales"))
    assert.is_nil(contract.handoff(egress(), "support"))
  end)
end)
