-- authorize(req): a traffic policy refuses a call by the caller's identity,
-- through the C runtime (testing.load, the proxy's own call and check) and
-- the Lua contract (a policy table) alike.
local testing = require "openmesh.testing"

local A = { identity = { uris = { "spiffe://mesh/ns/a/sa/x" } } }
local B = { service = "orders", identity = { subject = "CN=b", uris = { "spiffe://mesh/ns/b/sa/y" } } }

-- A policy table whose authorize answers what answer() returns.
local function answering(answer)
  return {
    kind = "traffic",
    authorize = answer,
    subset = function(_, peers)
      return peers
    end,
  }
end

-- The same policy, loaded by the C runtime.
local function loaded(body)
  return assert(testing.load(nil, { path = nil, source = ([[
    return { kind = "traffic", subset = function(_, p) return p end,
             authorize = function(req) %s end }]]):format(body) }))
end

describe("authorize", function()
  local p = assert(testing.load("examples/policies/identity_authorize.lua"))

  it("admits namespace a and refuses the others with the reason", function()
    assert.same({ true }, { testing.authorize(p, testing.req(A)) })
    assert.same({ false, "namespace b may not call orders" }, { testing.authorize(p, testing.req(B)) })
    assert.same({ false, "a client certificate is required" }, { testing.authorize(p, testing.req {}) })
  end)

  it("gives the same answers from the policy table", function()
    local t = dofile("examples/policies/identity_authorize.lua")
    assert.same({ true }, { testing.authorize(t, A) })
    assert.same({ false, "namespace b may not call orders" }, { testing.authorize(t, B) })
  end)

  it("is true for a policy without authorize", function()
    local q = assert(testing.load("examples/policies/identity_route.lua"))
    assert.same({ true }, { testing.authorize(q, testing.req {}) })
    assert.same({ true }, { testing.authorize({ kind = "traffic", subset = function(_, ps) return ps end }, {}) })
  end)

  it("gives \"\" for a refusal without a reason", function()
    assert.same({ false, "" }, { testing.authorize(loaded("return false"), {}) })
    assert.same({ false, "" }, { testing.authorize(answering(function() return false end), {}) })
  end)

  -- Each wrong answer, in the words both paths give (om_policy_check.c).
  local wrong = {
    { "return nil", "authorize returned a nil (nil), expected true, or false and a reason" },
    { "return 'yes'", "authorize returned a string ('yes'), expected true, or false and a reason" },
    { "return true, 'ok'", "authorize returned true and a string ('ok'): a reason goes with false only" },
    { "return false, 42", "authorize returned false and a number (42), expected a string reason or nothing" },
    { "return false, string.rep('x', 201)", "expected at most 200 bytes of printable ASCII" },
    { "return false, 'tab\\there'", "expected at most 200 bytes of printable ASCII" },
  }
  for _, w in ipairs(wrong) do
    it("fails the call on `" .. w[1] .. "`", function()
      local ok, err = pcall(testing.authorize, loaded(w[1]), {})
      assert.is_false(ok)
      assert.truthy(tostring(err):find(w[2], 1, true), tostring(err))
      ok, err = pcall(testing.authorize, answering(load(w[1])), {})
      assert.is_false(ok)
      assert.truthy(tostring(err):find(w[2], 1, true), tostring(err))
    end)
  end

  it("accepts a reason of exactly 200 printable bytes", function()
    local r = string.rep("x", 200)
    assert.same({ false, r }, { testing.authorize(loaded("return false, string.rep('x', 200)"), {}) })
  end)

  it("fails the call when authorize raises", function()
    local ok, err = pcall(testing.authorize, loaded("error('boom')"), {})
    assert.is_false(ok)
    assert.truthy(tostring(err):find("boom", 1, true), tostring(err))
  end)

  it("runs under the route budget", function()
    local ok, err = pcall(testing.authorize, loaded("while true do end"), {})
    assert.is_false(ok)
    assert.truthy(tostring(err):find("budget", 1, true), tostring(err))
  end)

  describe("examples", function()
    local function src(ex)
      return ([[return { kind = "traffic", subset = function(_, p) return p end,
        authorize = function(req) if req.path == "/ok" then return true end
          return false, "no: " .. req.path end,
        examples = { %s } }]]):format(ex)
    end

    it("pass when authorize answers as expected", function()
      assert(testing.load(nil, { path = nil, source = src(
        [[{ req = { path = "/ok" }, expect_authorized = true },
          { req = { path = "/x" }, expect_authorized = false, expect_reason = "no: /x" }]]) }))
    end)

    it("reject the policy on a wrong expectation, naming the example", function()
      local _, err = testing.load(nil, { path = nil, source = src(
        [[{ req = { path = "/x" }, expect_authorized = true }]]) })
      assert.truthy(err:find("example 1: authorize returned false (reason 'no: /x'), expected true", 1, true), err)
      _, err = testing.load(nil, { path = nil, source = src(
        [[{ req = { path = "/x" }, expect_authorized = false, expect_reason = "nope" }]]) })
      assert.truthy(err:find("example 1: authorize gave the reason 'no: /x', expected 'nope'", 1, true), err)
    end)

    it("refuse expect_reason without expect_authorized = false", function()
      local _, err = testing.load(nil, { path = nil, source = src(
        [[{ req = { path = "/ok" }, expect_authorized = true, expect_reason = "x" }]]) })
      assert.truthy(err:find("field 'examples[1].expect_reason': goes with expect_authorized = false", 1, true), err)
    end)
  end)
end)

describe("vary and :identity", function()
  local peers = testing.peers { "p" }

  local function spy(vary)
    local seen = {}
    local t = {
      kind = "traffic",
      vary = vary,
      authorize = function(req)
        seen.authorize = req.identity
        return true
      end,
      subset = function(req, ps)
        seen.subset = req.identity
        return ps
      end,
    }
    return t, seen
  end

  it("gives req.identity to a vary policy that names :identity", function()
    local t, seen = spy { ":identity" }
    testing.subset(t, A, peers)
    testing.authorize(t, A)
    assert.equal("spiffe://mesh/ns/a/sa/x", seen.subset.spiffe)
    assert.equal("spiffe://mesh/ns/a/sa/x", seen.authorize.spiffe)
  end)

  it("keeps it nil for a vary policy that does not", function()
    local t, seen = spy { "x-user" }
    testing.subset(t, A, peers)
    testing.authorize(t, A)
    assert.is_nil(seen.subset)
    assert.is_nil(seen.authorize)
  end)

  it("does the same in the C runtime", function()
    local function vary_policy(vary)
      return assert(testing.load(nil, { path = nil, source = ([[
        return { kind = "traffic", vary = %s,
          authorize = function(req)
            if req.identity == nil then return false, "nil" end
            return false, req.identity.spiffe .. " " .. req.identity.subject .. " " .. #req.identity.dns
          end,
          subset = function(_, p) return p end }]]):format(vary) }))
    end
    local with = vary_policy([[{ ":identity" }]])
    assert.same({ false, "spiffe://mesh/ns/b/sa/y CN=b 0" }, { testing.authorize(with, B) })
    local without = vary_policy([[{ "x-user" }]])
    assert.same({ false, "nil" }, { testing.authorize(without, B) })
  end)

  it("is a valid vary name, once", function()
    assert(testing.load(nil, { path = nil, source = [[
      return { kind = "traffic", vary = { ":identity", ":path" }, subset = function(_, p) return p end }]] }))
    local _, err = testing.load(nil, { path = nil, source = [[
      return { kind = "traffic", vary = { ":identity", ":identity" }, subset = function(_, p) return p end }]] })
    assert.truthy(err:find("field 'vary[2]': duplicate name ':identity'", 1, true), err)
  end)
end)
