-- openmesh.testing's answers to the questions a policy author asks: what
-- does the policy do at 08:59 and at 09:00 (testing.clock, inside the
-- sandbox, no dofile), which peer does user u-7 land on (testing.pick, the
-- proxy's hash), how does traffic spread (testing.share), and what does
-- decide() return (testing.decide).
local testing = require "openmesh.testing"
local om = require "openmesh"

local PEERS = testing.peers{
  { id = "a", metadata = { version = "v1" } },
  { id = "b", metadata = { version = "v1" } },
  { id = "c", metadata = { version = "v2" } },
}

describe("testing.clock", function()
  it("reads UTC times as ms since the epoch", function()
    assert.equal(86400000, testing.clock("1970-01-02T00:00:00Z"):now())
    assert.equal(1796203800000, testing.clock("2026-12-02T09:30:00Z"):now())
    assert.has_error(function() testing.clock("tomorrow") end)
  end)

  it("drives os.time() inside a loaded policy's sandbox", function()
    local clock = testing.clock("2026-12-02T08:59:59Z")
    local p = assert(testing.load("examples/policies/business_hours.lua", { clock = clock }))
    local canary = { headers = { ["x-canary"] = "1" } }
    assert.same({ "a", "b" }, testing.subset(p, canary, PEERS)) -- closed
    clock:advance(1000)                                        -- 09:00:00
    assert.same({ "c" }, testing.subset(p, canary, PEERS))
    clock:set("2026-12-02T16:59:59Z")
    assert.same({ "c" }, testing.subset(p, canary, PEERS))
    clock:advance(1000)                                        -- 17:00:00
    assert.same({ "a", "b" }, testing.subset(p, canary, PEERS))
    -- no opt-in: the hour does not matter
    clock:set("2026-12-02T12:00:00Z")
    assert.same({ "a", "b" }, testing.subset(p, {}, PEERS))
  end)

  it("fixes os.clock() too, and gives the host's clocks back with nil", function()
    local p = assert(om.policy.load{ name = "clocks.lua", source = [[
      local seen = {}
      return { kind = "traffic",
        subset = function(req, peers)
          seen.time, seen.clock = os.time(), os.clock()
          return peers
        end,
        key = function() return tostring(seen.time) .. " " .. tostring(seen.clock) end }
    ]] })
    p:set_clock(1500)
    testing.subset(p, {}, PEERS)
    assert.equal("1 1.5", testing.key(p, {}))
    p:set_clock(nil)
    testing.subset(p, {}, PEERS)
    local t = tonumber(testing.key(p, {}):match("^(%d+)"))
    assert.is_true(math.abs(t - os.time()) <= 2, ("host time %d, policy read %s"):format(os.time(), tostring(t)))
  end)

  it("still refuses the clock to a policy that declares vary", function()
    local clock = testing.clock("2026-12-02T10:00:00Z")
    local p = assert(om.policy.load{ name = "vary_clock.lua", source = [[
      return { kind = "traffic", vary = {},
        subset = function(_, peers) if os.time() > 0 then return peers end return {} end }
    ]] })
    clock:attach(p)
    local ok, err = pcall(testing.subset, p, {}, PEERS)
    assert.is_false(ok)
    assert.matches("os.time is not available to a policy that declares vary", err)
  end)
end)

describe("testing.pick", function()
  local all = assert(om.policy.load{ name = "all.lua", source = [[
    return { kind = "traffic", subset = function(_, peers) return peers end }
  ]] })

  it("gives the rendezvous winner for x-openmesh-key, as the proxy hashes it", function()
    local rdv = assert(om.rendezvous{ "a", "b", "c" })
    for i = 1, 50 do
      local key = "u-" .. i
      local want = rdv:pick(key)
      local got = testing.pick(all, { headers = { ["x-openmesh-key"] = key } }, PEERS)
      assert.equal(want, got, key)
    end
  end)

  it("picks inside the subset only, and prefers the policy's key()", function()
    local canary = assert(om.policy.load{ name = "canary_key.lua", source = [[
      local policy = require "openmesh.policy"
      return { kind = "traffic",
        subset = function(_, peers) return policy.match_metadata(peers, "version", "v1") end,
        key = function(req) return policy.header(req, "x-user") end }
    ]] })
    local rdv = assert(om.rendezvous{ "a", "b" })
    for i = 1, 20 do
      local req = { headers = { ["x-user"] = "u-" .. i, ["x-openmesh-key"] = "ignored" } }
      assert.equal(rdv:pick("u-" .. i), testing.pick(canary, req, PEERS))
    end
  end)

  it("is P2C with a seed when unkeyed: the same seed, the same picks", function()
    local one, two = {}, {}
    for i = 1, 10 do
      one[i] = testing.pick(all, {}, PEERS, { seed = 42 })
      two[i] = testing.pick(all, {}, PEERS, { seed = 42 })
    end
    assert.same(one, two)
    assert.truthy(({ a = 1, b = 1, c = 1 })[one[1]], one[1])
  end)

  it("answers nil when the subset is empty", function()
    local none = assert(om.policy.load{ name = "none.lua", source = [[
      return { kind = "traffic", subset = function() return {} end }
    ]] })
    assert.is_nil(testing.pick(none, {}, PEERS))
  end)
end)

describe("testing.share", function()
  it("measures a 10% canary within tolerance", function()
    local p = assert(testing.load("examples/policies/canary.lua"))
    local peers = testing.peers{
      { id = "v1-a", metadata = { version = "v1" } },
      { id = "v1-b", metadata = { version = "v1" } },
      { id = "v2", metadata = { version = "v2" } },
    }
    local share, n = testing.share(p, function(i)
      if i <= 4000 then
        return { headers = { ["x-user"] = "user-" .. i } }
      end
    end, peers)
    assert.equal(4000, n)
    local v2 = share["v2"] or 0
    assert.is_true(math.abs(v2 - 0.10) < 0.02, ("v2 share %.4f, want 0.10 +- 0.02"):format(v2))
    local total = 0
    for _, f in pairs(share) do total = total + f end
    assert.is_true(math.abs(total - 1) < 1e-9, "fractions sum to " .. total)
  end)

  it("spreads keyed traffic evenly over equal peers (rendezvous)", function()
    local all = assert(om.policy.load{ name = "all.lua", source = [[
      return { kind = "traffic", subset = function(_, peers) return peers end }
    ]] })
    local reqs = {}
    for i = 1, 3000 do reqs[i] = { headers = { ["x-openmesh-key"] = "k" .. i } } end
    local share = testing.share(all, reqs, PEERS)
    for _, id in ipairs{ "a", "b", "c" } do
      assert.is_true(math.abs((share[id] or 0) - 1 / 3) < 0.04,
        ("%s got %.4f, want 0.333 +- 0.04"):format(id, share[id] or 0))
    end
  end)

  it("counts requests that find no peer under [false]", function()
    local none = assert(om.policy.load{ name = "none.lua", source = [[
      return { kind = "traffic", subset = function() return {} end }
    ]] })
    local share = testing.share(none, { {}, {} }, PEERS)
    assert.same({ [false] = 1 }, share)
  end)

  it("refuses what is neither a list nor a generator", function()
    assert.has_error(function() testing.share({}, 42, PEERS) end,
      "testing.share: reqs: a list of requests or a generator expected")
  end)
end)

describe("testing.decide", function()
  it("returns what decide() returns, for a handle and for a table", function()
    local src = [[
      return { kind = "traffic", deadline_ms = 5000,
        subset = function(_, peers) return peers end,
        decide = function(req) if req.method == "POST" then return { deadline_ms = 1000 } end end }
    ]]
    local h = assert(om.policy.load{ name = "decide.lua", source = src })
    local d = testing.decide(h, { method = "POST" })
    assert.equal(1000, d and d.deadline_ms)
    local t = assert(load(src))()
    local d2 = testing.decide(t, { method = "POST" })
    assert.equal(1000, d2 and d2.deadline_ms)
  end)
end)
