-- examples/policies/streaming.lua: every peer; the deadline up to the
-- head, then the stream timeouts.
local testing = require "openmesh.testing"

describe("examples/policies/streaming.lua", function()
  local p = assert(testing.load("examples/policies/streaming.lua"))

  it("bounds the head by the deadline and the stream by its timeouts", function()
    local s = p:settings()
    assert.equal(5000, s.deadline_ms)
    assert.equal(20000, s.max_deadline_ms)
    assert.equal(30000, s.stream_idle_timeout_ms)
    assert.equal(3600000, s.max_stream_ms)
    assert.is_nil(s.per_try_timeout_ms) -- an attempt may use what is left
  end)

  it("keeps every peer", function()
    local peers = testing.peers { "a", { id = "b", zone = "z1" } }
    assert.same({ "a", "b" }, testing.subset(p, testing.req {}, peers))
  end)
end)
