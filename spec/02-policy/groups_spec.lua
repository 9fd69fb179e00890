-- policy.by: metadata groups made once per peer view and shared, and the
-- subset answers the proxy takes without walking them (`return peers`, a
-- group), checked through the C runtime's route call.
local testing = require "openmesh.testing"
local policy = require "openmesh.policy"
local om = require "openmesh"

local function write(src)
  local path = os.tmpname() .. "_policy.lua"
  local f = assert(io.open(path, "w"))
  f:write(src)
  f:close()
  return path
end

local function load(src)
  local path = write(src)
  local p, err = testing.load(path)
  os.remove(path)
  return assert(p, err)
end

describe("policy.by", function()
  local peers = testing.peers {
    { id = "a", metadata = { version = "v1" } }, { id = "b", metadata = { version = "v2" } },
    { id = "c" }, { id = "d", metadata = { version = "v2", zone = "z1" } },
  }

  -- x-v names the version, x-keep = "no" asks for everyone else; x-call
  -- makes the policy call policy.by twice and return the second answer.
  local p = load [[
    local policy = require "openmesh.policy"
    return {
      kind = "traffic",
      subset = function(req, peers)
        local v = req.headers["x-v"]
        if v == nil then return peers end
        local keep = req.headers["x-keep"] ~= "no"
        local g = policy.by(peers, "version", v, keep)
        if req.headers["x-twice"] then
          local again = policy.by(peers, "version", v, keep)
          if again ~= g then error("a group is made once per view") end
        end
        return g
      end,
    }
  ]]

  it("keeps the peers whose metadata matches, or with keep false the others", function()
    assert.same({ "b", "d" }, testing.subset(p, testing.req { headers = { ["x-v"] = "v2" } }, peers))
    assert.same({ "a" }, testing.subset(p, testing.req { headers = { ["x-v"] = "v1" } }, peers))
    assert.same({}, testing.subset(p, testing.req { headers = { ["x-v"] = "v3" } }, peers))
    assert.same({ "a", "c" },
      testing.subset(p, testing.req { headers = { ["x-v"] = "v2", ["x-keep"] = "no" } }, peers))
  end)

  it("returns the same table for the same question on one view", function()
    assert.same({ "b", "d" },
      testing.subset(p, testing.req { headers = { ["x-v"] = "v2", ["x-twice"] = "1" } }, peers))
    assert.same({ "a", "c" }, testing.subset(p, testing.req {
      headers = { ["x-v"] = "v2", ["x-keep"] = "no", ["x-twice"] = "1" } }, peers))
  end)

  it("follows a new view: a group of the old one is not reused", function()
    assert.same({ "b", "d" }, testing.subset(p, testing.req { headers = { ["x-v"] = "v2" } }, peers))
    local other = testing.peers { { id = "x", metadata = { version = "v2" } }, { id = "y" } }
    assert.same({ "x" }, testing.subset(p, testing.req { headers = { ["x-v"] = "v2" } }, other))
    assert.same({ "b", "d" }, testing.subset(p, testing.req { headers = { ["x-v"] = "v2" } }, peers))
  end)

  it("answers `return peers` with every peer", function()
    assert.same({ "a", "b", "c", "d" }, testing.subset(p, testing.req {}, peers))
  end)

  it("gives a fresh answer, as select_metadata, for a table that is not the view", function()
    local list = {
      { id = "a", metadata = { version = "v1" } }, { id = "b", metadata = { version = "v2" } },
    }
    local g1, g2 = policy.by(list, "version", "v2"), policy.by(list, "version", "v2")
    assert.are_not.equal(g1, g2)
    assert.same(om.select_metadata(list, { version = "v2" }, true), g1)
    assert.equal(list[2], g1[1])
    assert.same({ list[1] }, policy.by(list, "version", "v2", false))
  end)

  it("refuses a key or value that is not a string", function()
    assert.has_error(function() policy.by(peers, {}, "v2") end)
    assert.has_error(function() policy.by(peers, "version") end)
  end)
end)
