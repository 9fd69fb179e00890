-- One verdict, one message: the same bad answer of a policy, judged on the
-- production path (a policy loaded by the C runtime, om.policy.load, whose
-- :subset is the proxy's om_policy_route) and by the Lua library
-- (openmesh.contract and openmesh.testing, as examples and specs use it),
-- must fail with the same words. Both call bindings/om_policy_check.c.
local om = require "openmesh"
local contract = require "openmesh.contract"
local testing = require "openmesh.testing"

local PEERS = { "a", "b", "c" }

-- The message of an om.policy handle's failure, without its "EPOLICY: ".
local function production(ok, err)
  assert.is_nil(ok)
  assert.is_string(err)
  return (err:gsub("^EPOLICY: ", ""))
end

-- A policy source whose subset returns `answer` (Lua code over peers).
local function traffic_source(answer, extra)
  return ("return { kind = 'traffic', %s subset = function(req, peers) return %s end }")
    :format(extra or "", answer)
end

local function load_handle(src)
  return assert(om.policy.load { source = src, name = "conformance.lua" })
end

local function load_table(src)
  return assert(load(src, "=conformance.lua", "t"))()
end

describe("policy answer checks: production and library agree", function()
  local subset_cases = {
    { "{ { id = 'a' } }", "subset returned a peer that was not offered (id 'a')" },
    { "{ peers[1], peers[1] }", "subset returned the peer 'a' twice" },
    { "{ peers[1], peers[2], peers[3], peers[2] }", "subset returned the peer 'b' twice" },
    { "{ peers[1], nil, peers[3] }", "subset returned a table that is not an array (a hole at [2])" },
    { "{ peers[1], first = peers[2] }", "subset returned a table that is not an array (non-array key 'first')" },
    { "'a'", "subset returned a non-table ('a'), expected an array of the peers it was given" },
    { "nil", "subset returned a non-table (nil), expected an array of the peers it was given" },
    { "{ peers[1], 7.0 }", "subset returned a number (7.0) at [2], expected one of the peer tables it was given" },
    { "{ peers[1].id }", "subset returned a string ('a') at [1], expected one of the peer tables it was given"
      .. " (return the peers themselves, not their ids)" },
  }

  for _, case in ipairs(subset_cases) do
    it("subset returning " .. case[1], function()
      local src = traffic_source(case[1])
      local handle, tbl = load_handle(src), load_table(src)
      local peers = testing.peers(PEERS)
      local req = testing.req {}
      -- production: om_policy_route in the policy's own sandbox
      assert.equal(case[2], production(handle:subset(req, peers)))
      -- library: openmesh.contract on the policy table
      local result, err = contract.subset(tbl, req, peers)
      assert.is_nil(result)
      assert.equal(case[2], err)
      -- openmesh.testing, on the table and on the handle
      local ok, raised = pcall(testing.subset, tbl, req, PEERS)
      assert.is_false(ok)
      assert.truthy(raised:find(case[2], 1, true), raised)
      ok, raised = pcall(testing.subset, handle, req, PEERS)
      assert.is_false(ok)
      assert.truthy(raised:find(case[2], 1, true), raised)
      handle:close()
    end)
  end

  it("subset answers that pass on one path pass on the other", function()
    for _, answer in ipairs { "{}", "peers", "{ peers[3], peers[1] }" } do
      local src = traffic_source(answer)
      local handle, tbl = load_handle(src), load_table(src)
      local peers = testing.peers(PEERS)
      local ids = assert(handle:subset(testing.req {}, peers))
      local result = assert(contract.subset(tbl, testing.req {}, peers))
      assert.same(ids, testing.ids(result))
      assert.is_nil(om.checks.subset(result, peers))
      handle:close()
    end
  end)

  for _, case in ipairs {
    { "42", "key returned a number (42), expected a string or nil" },
    { "1.5", "key returned a number (1.5), expected a string or nil" },
    { "false", "key returned a boolean (false), expected a string or nil" },
    { "{}", "key returned a table (table), expected a string or nil" },
  } do
    it("key returning " .. case[1], function()
      local src = traffic_source("peers", ("key = function() return %s end,"):format(case[1]))
      local handle, tbl = load_handle(src), load_table(src)
      local req = testing.req {}
      -- production: the proxy runs key() in om_policy_route
      assert.equal(case[2], production(handle:subset(req, testing.peers(PEERS))))
      assert.equal(case[2], production(handle:key(req)))
      local key, err = contract.key(tbl, req)
      assert.is_nil(key)
      assert.equal(case[2], err)
      handle:close()
    end)
  end

  for _, case in ipairs {
    { "{ 'primary', 'nope' }", "order returned an unknown route 'nope' (routes: {primary, backup})" },
    { "{ 'backup', 'backup' }", "order returned the route 'backup' twice" },
    { "{ 'backup', 2 }", "order returned a number (2) at [2], expected a route name" },
    { "{}", "order returned no routes" },
    { "'primary'", "order returned a non-table ('primary'), expected an array of route names" },
    { "{ [2] = 'backup' }", "order returned a table that is not an array (a hole at [1])" },
  } do
    it("order returning " .. case[1], function()
      local src = ([[return { kind = 'fallback',
        routes = {
          { name = 'primary', provider = 'openai', base_url = 'http://127.0.0.1:9101/v1', model = 'm' },
          { name = 'backup', provider = 'openai', base_url = 'http://127.0.0.1:9102/v1', model = 'm' },
        },
        order = function() return %s end }]]):format(case[1])
      local handle, tbl = load_handle(src), load_table(src)
      -- production: the gateway's om_fallback_order runs the same check
      assert.equal(case[2], production(handle:order(testing.ctx {})))
      local names, err = contract.order(tbl, testing.ctx {})
      assert.is_nil(names)
      assert.equal(case[2], err)
      handle:close()
    end)
  end

  for _, case in ipairs {
    { "req.headers['x-b']", "reads header 'x-b', which its vary does not name (add \"x-b\" to vary)" },
    { "req.headers['X-B']", "reads header 'X-B', which its vary does not name (add \"x-b\" to vary)" },
    { "req.path", "reads req.path, which its vary does not name (add \":path\" to vary)" },
    { "req.method", "reads req.method, which its vary does not name (add \":method\" to vary)" },
    { "req.grpc", "reads req.grpc, which comes from the path its vary does not name"
      .. " (add \":path\" to vary)" },
    { "req.metadata.zone", "reads req.metadata.zone, which its vary does not name"
      .. " (a policy that declares vary sees no metadata)" },
  } do
    it("a vary policy reading " .. case[1], function()
      local src = ("return { kind = 'traffic', vary = { 'x-a' }, "
        .. "subset = function(req, peers) local _ = %s; return peers end }"):format(case[1])
      local handle, tbl = load_handle(src), load_table(src)
      local req = testing.req { path = "/p", headers = { ["x-a"] = "1", ["x-b"] = "2" } }
      local err = production(handle:subset(req, testing.peers(PEERS)))
      assert.truthy(err:find(case[2], 1, true), err)
      local result, lerr = contract.subset(tbl, req, testing.peers(PEERS))
      assert.is_nil(result)
      assert.equal("subset raised: " .. case[2], lerr)
      handle:close()
    end)
  end

  it("the vary view holds the service and the declared fields only", function()
    local req = { service = "s", method = "GET", path = "/p", headers = { ["x-a"] = "1", ["x-b"] = "2" } }
    local view = om.checks.vary_view({ "x-a", ":path" }, req)
    assert.equal("s", view.service)
    assert.equal("/p", view.path)
    assert.equal("1", view.headers["x-a"])
    assert.is_nil(rawget(view.headers, "x-b"))
    assert.is_nil(view.headers["X-A"]) -- declared, in another case: nil, no raise
    assert.has_error(function()
      return view.method
    end, 'reads req.method, which its vary does not name (add ":method" to vary)')
  end)

  it("the vary view shows req.grpc with the path it comes from", function()
    local req = { service = "s", path = "/pkg.S/M", grpc = { service = "pkg.S", method = "M" } }
    local view = om.checks.vary_view({ ":path" }, req)
    assert.equal("M", view.grpc.method)
    assert.equal("pkg.S", view.grpc.service)
  end)
end)
