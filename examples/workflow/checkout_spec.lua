-- The spec a policy author writes for checkout.lua: run it with
-- `openmesh test examples/workflow` (no setup: the embedded runtime).
local testing = require "openmesh.testing"

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local PEERS = testing.peers{
  { id = "v1-a" }, { id = "v1-b" }, { id = "v1-c" },
  { id = "v2-a", metadata = { version = "v2" } },
}

-- 2,000 users, one request each
local function users(n)
  local reqs = {}
  for i = 1, n do
    reqs[i] = { headers = { ["x-user"] = "u-" .. i } }
  end
  return reqs
end

for _, case in ipairs { { "checkout.lua", 0.10 }, { "checkout_v2.lua", 0.30 } } do
  describe(case[1], function()
    local p = assert(testing.load(here .. case[1]))

    it(("sends about %d%% of users to v2"):format(case[2] * 100), function()
      local share = testing.share(p, users(2000), PEERS)
      local v2 = share["v2-a"] or 0
      assert.is_true(math.abs(v2 - case[2]) < 0.03,
        ("v2 got %.3f of the users, expected %.2f +- 0.03"):format(v2, case[2]))
    end)

    it("keeps a user on one peer", function()
      local first = testing.pick(p, { headers = { ["x-user"] = "u-7" } }, PEERS)
      for _ = 1, 5 do
        assert.equal(first, testing.pick(p, { headers = { ["x-user"] = "u-7" } }, PEERS))
      end
    end)

    it("never retries a payment", function()
      local d = testing.decide(p, { method = "POST", path = "/payments/1" })
      assert.same({ deadline_ms = 2000, retries = 0 }, d)
      assert.is_nil(testing.decide(p, { method = "GET", path = "/payments/1" }))
    end)
  end)
end
