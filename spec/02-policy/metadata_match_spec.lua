-- examples/policies/metadata_match.lua: x-version: v2 selects v2, and
-- nothing else ever reaches v2.
local testing = require "openmesh.testing"

describe("examples/policies/metadata_match.lua", function()
  local p = assert(testing.load("examples/policies/metadata_match.lua"))
  local peers = testing.peers {
    { id = "a", metadata = { version = "v1" } }, { id = "b", metadata = { version = "v2" } },
    { id = "c" }, { id = "d", metadata = { version = "v2", zone = "z1" } },
  }

  it("gives requests with x-version: v2 only the v2 peers", function()
    assert.same({ "b", "d" }, testing.subset(p, testing.req { headers = { ["x-version"] = "v2" } }, peers))
  end)

  it("gives every other request only the non-v2 peers", function()
    for _, headers in ipairs { {}, { ["x-version"] = "v1" }, { ["x-version"] = "V2" }, { ["x-version"] = "v2 " },
      { ["x-version"] = "" }, { ["x-v"] = "v2" } } do
      assert.same({ "a", "c" }, testing.subset(p, testing.req { headers = headers }, peers))
    end
  end)

  it("never spills into the other side when one side is empty", function()
    local only_v2 = testing.peers { { id = "b", metadata = { version = "v2" } } }
    local only_v1 = testing.peers { { id = "a", metadata = { version = "v1" } } }
    assert.same({}, testing.subset(p, testing.req {}, only_v2))
    assert.same({}, testing.subset(p, testing.req { headers = { ["x-version"] = "v2" } }, only_v1))
  end)

  it("never puts a v2 peer in a non-v2 answer, over random peer sets", function()
    local rng = 12345
    local function rand(n) -- a small LCG: the spec is deterministic
      rng = (rng * 1103515245 + 12345) % 2147483648
      return rng % n
    end
    for _ = 1, 200 do
      local list, v2 = {}, {}
      for i = 1, 1 + rand(8) do
        local version = ({ "v1", "v2", "v3" })[1 + rand(3)]
        list[i] = { id = "p" .. i, metadata = { version = version } }
        v2["p" .. i] = version == "v2"
      end
      local asked = rand(2) == 0
      local req = testing.req { headers = asked and { ["x-version"] = "v2" } or {} }
      for _, id in ipairs(testing.subset(p, req, testing.peers(list))) do
        assert.equal(asked, v2[id])
      end
    end
  end)
end)
