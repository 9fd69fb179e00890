-- req.identity: the verified client certificate of the caller, as a policy
-- author fakes it in a spec, through the C runtime (testing.load) and the
-- Lua contract alike.
local testing = require "openmesh.testing"

describe("req.identity", function()
  local p = assert(testing.load("examples/policies/identity_route.lua"))
  local peers = testing.peers {
    { id = "a1", metadata = { group = "a" } }, { id = "a2", metadata = { group = "a" } },
    { id = "b1", metadata = { group = "b" } },
  }

  it("routes a SPIFFE ID to its namespace's peers", function()
    local a = testing.req { identity = { subject = "CN=x", uris = { "spiffe://mesh/ns/a/sa/x" } } }
    local b = testing.req { identity = { uris = { "https://example.org/", "spiffe://mesh/ns/b/sa/y" } } }
    assert.same({ "a1", "a2" }, testing.subset(p, a, peers))
    assert.same({ "b1" }, testing.subset(p, b, peers))
  end)

  it("gives a caller without an identity nothing", function()
    assert.same({}, testing.subset(p, testing.req {}, peers))
    assert.same({}, testing.subset(p, testing.req { identity = { dns = { "a.mesh" } } }, peers))
  end)

  it("fills in the defaults as the proxy builds the table", function()
    local req = testing.req { identity = { uris = { "urn:x", "spiffe://mesh/ns/a/sa/x" } } }
    assert.same({ subject = "", uris = { "urn:x", "spiffe://mesh/ns/a/sa/x" }, dns = {},
      spiffe = "spiffe://mesh/ns/a/sa/x" }, req.identity)
    assert.is_nil(testing.req {}.identity)
  end)

  it("is what the runtime passes to subset", function()
    local seen
    local spy = {
      kind = "traffic",
      subset = function(req, ps)
        seen = req.identity
        return ps
      end,
    }
    testing.subset(spy, { identity = { subject = "CN=y", dns = { "y.mesh" } } }, peers)
    assert.same({ subject = "CN=y", uris = {}, dns = { "y.mesh" } }, seen)
  end)

  it("refuses a malformed identity, naming the field", function()
    assert.has_error(function()
      testing.req { identity = { uris = "spiffe://mesh/ns/a/sa/x" } }
    end, "testing.req: field 'req.identity.uris': array expected, got 'spiffe://mesh/ns/a/sa/x'")
    assert.has_error(function()
      testing.req { identity = { name = "x" } }
    end)
  end)
end)
