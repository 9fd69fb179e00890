-- examples/policies/keyed_affinity.lua: one session, one key.
local testing = require "openmesh.testing"

describe("examples/policies/keyed_affinity.lua", function()
  local p = assert(testing.load("examples/policies/keyed_affinity.lua"))

  local function key(headers)
    return testing.key(p, testing.req { headers = headers })
  end

  it("keys on the x-session header", function()
    assert.equal("s-42", key { ["x-session"] = "s-42" })
  end)

  it("falls back to the session cookie", function()
    assert.equal("s-7", key { cookie = "session=s-7" })
    assert.equal("s-7", key { cookie = "lang=en;session=s-7;theme=dark" })
    assert.equal("s-7", key { cookie = "  session = s-7 ; x=1" })
    assert.equal("s 7", key { cookie = "session=\"s 7\"" })
  end)

  it("prefers the header, and ignores an empty one", function()
    assert.equal("h", key { ["x-session"] = "h", cookie = "session=c" })
    assert.equal("c", key { ["x-session"] = "", cookie = "session=c" })
  end)

  it("does not confuse similar cookie names", function()
    assert.is_nil(key { cookie = "xsession=a; session_id=b; Session=c" })
    assert.equal("d", key { cookie = "xsession=a; session=d" })
  end)

  it("has no key without a session, so load balancing spreads those requests", function()
    assert.is_nil(key {})
    assert.is_nil(key { cookie = "session=" })
    assert.is_nil(key { cookie = "garbage;;;==;" })
  end)

  it("gives the same key for the same session on every request, and different keys to different sessions", function()
    local seen = {}
    for i = 1, 200 do
      local k = key { ["x-session"] = "s-" .. i }
      assert.equal(k, key { cookie = "session=s-" .. i })
      assert.is_nil(seen[k])
      seen[k] = true
    end
  end)

  it("leaves every peer eligible: affinity comes from the key, not the subset", function()
    local peers = testing.peers { "a", "b", "c" }
    assert.same({ "a", "b", "c" }, testing.subset(p, testing.req { headers = { ["x-session"] = "s" } }, peers))
  end)
end)
