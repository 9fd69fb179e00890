-- openmesh.contract: a traffic policy's `pool` (upstream keep-alive,
-- docs/PROXY.md "Upstream keep-alive"): every bad field is named.
local contract = require "openmesh.contract"

local function traffic(pool)
  return { kind = "traffic", subset = function(_, peers) return peers end, pool = pool }
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

describe("contract: traffic pool", function()
  it("accepts any subset of its fields", function()
    accepts(traffic({}))
    accepts(traffic({ max_idle_per_peer = 128 }))
    accepts(traffic({ idle_timeout_ms = 0.5 }))
    accepts(traffic({ max_requests_per_connection = 0 }))
    accepts(traffic({ max_idle_per_peer = 1000000, idle_timeout_ms = 90000,
      max_requests_per_connection = 1000 }))
  end)

  it("names the field it refuses", function()
    rejects(traffic("big"), "field 'pool': table expected, got 'big'")
    rejects(traffic({ max_idle_per_peer = 0 }),
      "field 'pool.max_idle_per_peer': integer >= 1 expected, got 0")
    rejects(traffic({ max_idle_per_peer = 2.5 }),
      "field 'pool.max_idle_per_peer': integer >= 1 expected, got 2.5")
    rejects(traffic({ max_idle_per_peer = 1000001 }),
      "field 'pool.max_idle_per_peer': at most 1000000 (descriptors), got 1000001")
    rejects(traffic({ idle_timeout_ms = 0 }),
      "field 'pool.idle_timeout_ms': number > 0 expected, got 0")
    rejects(traffic({ idle_timeout_ms = "60s" }),
      "field 'pool.idle_timeout_ms': number > 0 expected, got '60s'")
    rejects(traffic({ max_requests_per_connection = -1 }),
      "field 'pool.max_requests_per_connection': integer >= 0 expected, got -1")
    rejects(traffic({ max_idle = 4 }), -- no near name to suggest
      "unknown field 'pool.max_idle'")
  end)
end)
