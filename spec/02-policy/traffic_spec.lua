-- policies/traffic.lua: the default traffic policy.
local testing = require "openmesh.testing"

describe("policies/traffic.lua", function()
  local p = assert(testing.load("policies/traffic.lua"))

  it("loads through the validator as a traffic policy named after its file", function()
    assert.equal("traffic", p:kind())
    assert.equal("traffic", p:name())
    assert.equal(1, p:version())
  end)

  it("spells out the pool settings", function()
    local s = p:settings()
    assert.equal(256, s.max_inflight)
    assert.equal(1024, s.max_queue)
    assert.equal(10000, s.deadline_ms)
    assert.equal(3000, s.per_try_timeout_ms)
    assert.equal(2, s.retries)
    assert.is_false(s.adaptive)
    assert.is_false(s.retry_non_idempotent)
    assert.is_nil(s.subset) -- settings are data only
  end)

  it("keeps every peer, whatever the request", function()
    local peers = testing.peers { "a", { id = "b", zone = "z1" }, { id = "c", metadata = { version = "v2" } } }
    for _, req in ipairs {
      {},
      { method = "POST", path = "/orders", headers = { ["x-user"] = "u1", ["x-version"] = "v2" } },
      { metadata = { zone = "z2" } },
    } do
      assert.same({ "a", "b", "c" }, testing.subset(p, testing.req(req), peers))
    end
    assert.same({}, testing.subset(p, testing.req {}, {}))
  end)

  it("leaves the key to the proxy (x-openmesh-key)", function()
    assert.is_nil(testing.key(p, testing.req { headers = { ["x-openmesh-key"] = "k", ["x-user"] = "u" } }))
  end)
end)
