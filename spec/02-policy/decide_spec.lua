-- decide(req): a traffic policy's per-request decision, as the validator,
-- openmesh.testing and the proxy see it (one check, bindings/
-- om_policy_check.c, in the same words everywhere). The proxy applying it
-- is spec/03-integration/decide_spec.lua.
local testing = require "openmesh.testing"
local om = require "openmesh"
local contract = require "openmesh.contract"

-- A policy whose decide returns what `answer` builds (source text).
local function policy_src(answer, extra)
  return ([[
return {
  kind = "traffic",
  subset = function(_, peers) return peers end,
  decide = function(req) return %s end,
  %s
}
]]):format(answer, extra or "")
end

local function load(answer, extra)
  return om.policy.load{ name = "decide.lua", source = policy_src(answer, extra) }
end

describe("decide(req)", function()
  it("may answer nil: no decision", function()
    local h = assert(load("nil"))
    assert.is_nil(testing.decide(h, {}))
  end)

  it("answers the same through a loaded policy and a plain table", function()
    local answer = [[{ deadline_ms = 250, retries = 0, retry_non_idempotent = true,
      per_try_timeout_ms = 100, stream_idle_timeout_ms = 60000, max_stream_ms = 3600000,
      max_body_bytes = 1024, headers = { ["X-Tenant"] = "t-" .. (req.headers["x-org"] or "none"), cookie = false } }]]
    local h = assert(load(answer))
    local t = assert(_G.load(policy_src(answer)))()
    local req = { headers = { ["x-org"] = "acme" } }
    for _, d in ipairs{ testing.decide(h, req), testing.decide(t, req) } do
      assert.are.equal(250, d.deadline_ms)
      assert.are.equal(0, d.retries)
      assert.are.equal("t-acme", d.headers["X-Tenant"])
      assert.are.equal(false, d.headers.cookie)
    end
  end)

  -- Each bad answer and the message the proxy logs for it.
  local bad = {
    { "42", "decide returned a number (42), expected a table or nil" },
    { "{ deadline = 5 }", "decide returned an unknown field 'deadline'" },
    { "{ [1] = 5 }", "decide returned a table with the key 1: its fields are named" },
    { "{ deadline_ms = 0 }", "decide returned deadline_ms = 0, expected a number of ms in (0, 86400000]" },
    { "{ deadline_ms = '5' }", "decide returned deadline_ms = '5'" },
    { "{ per_try_timeout_ms = 1e12 }", "decide returned per_try_timeout_ms = " },
    { "{ retries = -1 }", "decide returned retries = -1, expected an integer in 0..100" },
    { "{ retries = 1.5 }", "decide returned retries = 1.5" },
    { "{ retries = 101 }", "decide returned retries = 101" },
    { "{ retry_non_idempotent = 1 }", "decide returned retry_non_idempotent = 1, expected a boolean" },
    { "{ max_body_bytes = -1 }", "decide returned max_body_bytes = -1" },
    { "{ headers = 'x' }", "decide returned headers = 'x', expected a table" },
    { "{ headers = { ['x y'] = 'v' } }", "decide returned headers['x y']: not a field name (RFC 9110 5.1)" },
    { "{ headers = { [''] = 'v' } }", "decide returned headers['']: a header name is 1..64 bytes" },
    { "{ headers = { ['x-a'] = 'v\\r\\nx-b: w' } }", "holds no control characters (RFC 9110 5.5)" },
    { "{ headers = { ['x-a'] = ' v' } }", "no leading or trailing space" },
    { "{ headers = { ['x-a'] = true } }", "expected a string (set it) or false (remove it)" },
    { "{ headers = { ['x-a'] = string.rep('v', 1025) } }", "a value of 1025 bytes, at most 1024" },
    { "{ headers = { ['Idempotency-Key'] = 'k' } }", "the proxy owns this field" },
    { "{ headers = { ['x-request-id'] = false } }", "the proxy owns this field" },
    { "{ headers = { host = 'evil' } }", "the proxy owns this field" },
    { "{ headers = { ['Transfer-Encoding'] = 'chunked' } }", "the proxy owns this field" },
    { "{ headers = { ['x-a'] = 'v', ['X-A'] = 'w' } }", "decide returned the header 'x-a' twice" },
  }
  for _, case in ipairs(bad) do
    it("refuses " .. case[1], function()
      local h = assert(load(case[1]))
      local ok, err = pcall(testing.decide, h, {})
      assert.is_false(ok, "decide answered " .. case[1] .. " and it was accepted")
      assert.is_truthy(tostring(err):find(case[2], 1, true),
        ("message %q does not contain %q"):format(tostring(err), case[2]))
    end)
  end

  it("refuses more header edits than a decision holds", function()
    local h = assert(load([[(function()
      local hs = {}
      for i = 1, 17 do hs["x-h" .. i] = "v" end
      return { headers = hs }
    end)()]]))
    local ok, err = pcall(testing.decide, h, {})
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("more headers than a decision holds (16 fields, 4096 bytes)", 1, true), err)
  end)

  it("is checked by examples with expect_decision", function()
    local ok, err = load("{ deadline_ms = 300 }",
      "examples = { { req = { method = 'POST' }, expect_decision = { deadline_ms = 200 } } },")
    assert.is_nil(ok)
    assert.is_truthy(err:find("example 1: decide returned {deadline_ms = 300}, expected {deadline_ms = 200}", 1, true), err)
    assert(load("nil", "examples = { { expect_decision = false } },"))
    assert(load("{ headers = { ['X-A'] = 'v' } }",
      "examples = { { expect_decision = { headers = { ['x-a'] = 'v' } } } },"))
  end)

  it("refuses an expect_decision that no decide could answer", function()
    local ok, err = load("nil", "examples = { { expect_decision = { retries = -2 } } },")
    assert.is_nil(ok)
    assert.is_truthy(err:find("examples[1].expect_decision", 1, true), err)
    assert.is_truthy(err:find("retries = -2", 1, true), err)
  end)

  it("fails an example whose decide raises, naming decide", function()
    local ok, err = load("error('boom')", "examples = { { expect_decision = false } },")
    assert.is_nil(ok)
    assert.is_truthy(err:find("decide raised", 1, true), err)
  end)

  it("sees only the declared fields under vary", function()
    local h = assert(load("{ deadline_ms = req.headers['x-tier'] == 'gold' and 9000 or 1000 }",
      "vary = { 'x-tier' },"))
    assert.are.equal(9000, testing.decide(h, { headers = { ["x-tier"] = "gold" } }).deadline_ms)
    local h2 = assert(load("{ deadline_ms = req.headers['x-other'] and 1 or 2 }", "vary = { 'x-tier' },"))
    local ok, err = pcall(testing.decide, h2, { headers = { ["x-other"] = "1" } })
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("x-other", 1, true), err)
  end)

  it("is a field the contract knows (decide must be a function)", function()
    local ok, err = contract.validate({ kind = "traffic", subset = function(_, p) return p end, decide = 5 })
    assert.is_nil(ok)
    assert.is_truthy(err:find("decide", 1, true), err)
  end)
end)
