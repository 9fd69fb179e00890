-- examples/policies/canary.lua: 10% of users on v2, stable per user, and
-- nobody else ever on v2.
local testing = require "openmesh.testing"
local policy = require "openmesh.policy"

describe("examples/policies/canary.lua", function()
  local p = assert(testing.load("examples/policies/canary.lua"))
  local mixed = testing.peers {
    { id = "v1-a", metadata = { version = "v1" } }, { id = "v1-b", metadata = { version = "v1" } },
    { id = "v2-a", metadata = { version = "v2" } }, { id = "v2-b", metadata = { version = "v2" } },
  }
  local STABLE, CANARY = { "v1-a", "v1-b" }, { "v2-a", "v2-b" }

  local function by_header(user)
    return testing.req { headers = { ["x-user"] = user } }
  end

  local function is_canary(ids)
    if #ids == 2 and ids[1] == "v2-a" and ids[2] == "v2-b" then
      return true
    end
    assert.same(STABLE, ids) -- one side or the other, never a mix
    return false
  end

  it("sends about 10% of 10,000 users to v2 (within 2 points)", function()
    local n, canary = 10000, 0
    for i = 1, n do
      if is_canary(testing.subset(p, by_header("user-" .. i), mixed)) then
        canary = canary + 1
      end
    end
    assert.is_true(math.abs(canary / n - 0.10) <= 0.02, ("canary share %.4f"):format(canary / n))
  end)

  it("puts exactly the users whose hash falls below 0.10 on v2", function()
    for i = 1, 500 do
      local user = "u" .. i * 7919
      assert.equal(policy.unit(user) < 0.10, is_canary(testing.subset(p, by_header(user), mixed)), user)
    end
  end)

  it("keeps each user on the same side on every request, by header or by cookie", function()
    for i = 1, 300 do
      local user = "user-" .. i
      local first = testing.subset(p, by_header(user), mixed)
      for _ = 1, 3 do
        assert.same(first, testing.subset(p, by_header(user), mixed))
      end
      local cookie = testing.req { headers = { cookie = "a=1; user=" .. user .. "; z=2" } }
      assert.same(first, testing.subset(p, cookie, mixed))
    end
  end)

  it("never sends a request without a user to v2", function()
    assert.same(STABLE, testing.subset(p, testing.req {}, mixed))
    assert.same(STABLE, testing.subset(p, testing.req { headers = { ["x-user"] = "" } }, mixed))
    assert.same(STABLE, testing.subset(p, testing.req { headers = { cookie = "session=s1" } }, mixed))
  end)

  it("never sends a stable user to v2, even when only v2 peers are left: empty, not v2", function()
    local only_v2 = testing.peers { { id = "v2-a", metadata = { version = "v2" } },
      { id = "v2-b", metadata = { version = "v2" } } }
    local stable_users, checked = 0, 0
    for i = 1, 2000 do
      local user = "user-" .. i
      local ids = testing.subset(p, by_header(user), only_v2)
      if policy.unit(user) >= 0.10 then
        stable_users = stable_users + 1
        assert.same({}, ids)
      else
        assert.same(CANARY, ids)
      end
      checked = checked + 1
    end
    assert.equal(2000, checked)
    assert.is_true(stable_users > 1500)
    assert.same({}, testing.subset(p, testing.req {}, only_v2)) -- no user at all
  end)

  it("sends canary users to the stable peers while no v2 peer exists", function()
    local only_v1 = testing.peers { { id = "v1-a", metadata = { version = "v1" } }, { id = "v1-b" } }
    for i = 1, 500 do
      assert.same({ "v1-a", "v1-b" }, testing.subset(p, by_header("user-" .. i), only_v1))
    end
  end)

  it("keys requests by user, so each sticks to one peer on its side", function()
    assert.equal("user-9", testing.key(p, by_header("user-9")))
    assert.equal("user-9", testing.key(p, testing.req { headers = { cookie = "user=user-9" } }))
    assert.is_nil(testing.key(p, testing.req {}))
  end)
end)
