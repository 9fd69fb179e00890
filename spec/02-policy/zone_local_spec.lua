-- examples/policies/zone_local.lua: the caller's zone while it has at least
-- two peers, every zone otherwise.
local testing = require "openmesh.testing"

describe("examples/policies/zone_local.lua", function()
  local p = assert(testing.load("examples/policies/zone_local.lua"))

  local function from(zone)
    return testing.req { metadata = { zone = zone } }
  end

  it("keeps traffic in the caller's zone when it has two or more peers", function()
    local peers = testing.peers { { id = "a", zone = "eu" }, { id = "b", zone = "eu" }, { id = "c", zone = "eu" },
      { id = "x", zone = "us" }, { id = "y" } }
    assert.same({ "a", "b", "c" }, testing.subset(p, from("eu"), peers))
    local two = testing.peers { { id = "a", zone = "eu" }, { id = "b", zone = "eu" }, { id = "x", zone = "us" } }
    assert.same({ "a", "b" }, testing.subset(p, from("eu"), two))
  end)

  it("spills over to every zone when the caller's zone has fewer than two", function()
    local one = testing.peers { { id = "a", zone = "eu" }, { id = "x", zone = "us" }, { id = "y", zone = "us" } }
    assert.same({ "a", "x", "y" }, testing.subset(p, from("eu"), one))
    local none = testing.peers { { id = "x", zone = "us" }, { id = "y" } }
    assert.same({ "x", "y" }, testing.subset(p, from("eu"), none))
  end)

  it("switches exactly at the threshold as peers of the zone come and go", function()
    local list = { { id = "x", zone = "us" }, { id = "y", zone = "us" } }
    local expected = { [0] = { "x", "y" }, { "e1", "x", "y" }, { "e1", "e2" }, { "e1", "e2", "e3" } }
    for n = 0, 3 do
      if n > 0 then
        list[#list + 1] = { id = "e" .. n, zone = "eu" }
      end
      assert.same(expected[n], testing.subset(p, from("eu"), testing.peers(list)))
    end
  end)

  it("gives callers without a zone every peer", function()
    local peers = testing.peers { { id = "a", zone = "eu" }, { id = "b", zone = "eu" }, { id = "y" } }
    assert.same({ "a", "b", "y" }, testing.subset(p, testing.req {}, peers))
  end)

  it("has nothing to give when nothing is registered", function()
    assert.same({}, testing.subset(p, from("eu"), {}))
  end)
end)
