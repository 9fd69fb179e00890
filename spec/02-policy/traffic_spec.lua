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
    assert.is_nil(s.per_try_timeout_ms) -- what is left of the deadline
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

  it("depends on the peers only (vary = {}): an edit that reads the request must say so", function()
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. dir))
    local function load_edit(body)
      local path = dir .. "/traffic.lua"
      local f = assert(io.open(path, "w"))
      f:write("return { kind = 'traffic', vary = {},\n", body, "\n}\n")
      f:close()
      return testing.load(path)
    end
    -- a header read without naming it in vary: refused, the field named
    local q, err = load_edit([[subset = function(req, peers)
        if req.headers["x-user"] == "u1" then return {} end
        return peers end,
      examples = { { req = { headers = { ["x-user"] = "u1" } }, peers = { { id = "a" } }, expect = {} } },]])
    assert.is_nil(q)
    assert.matches([[reads header 'x-user', which its vary does not name (add "x-user" to vary)]], err, 1, true)
    -- chance in a decision that is reused: refused
    q, err = load_edit([[subset = function(_, peers)
        if math.random() < 0.5 then return {} end
        return peers end,
      examples = { { peers = { { id = "a" } }, expect = { "a" } } },]])
    assert.is_nil(q)
    assert.matches("math.random is not available to a policy that declares vary", err, 1, true)
    -- kept in a local by the top level, which may draw: refused all the same
    local f = assert(io.open(dir .. "/captured.lua", "w"))
    f:write([[local r = math.random
local seed = r(100)
return { kind = 'traffic', vary = {},
  subset = function(_, peers) if r() < 0.5 then return {} end return peers end,
  examples = { { peers = { { id = "a" } }, expect = { "a" } } } }
]])
    f:close()
    q, err = testing.load(dir .. "/captured.lua")
    assert.is_nil(q)
    assert.matches("captured.lua:4: math.random is not available to a policy that declares vary", err, 1, true)
    os.execute("rm -rf " .. dir)
  end)

  it("leaves the key to the proxy (x-openmesh-key)", function()
    assert.is_nil(testing.key(p, testing.req { headers = { ["x-openmesh-key"] = "k", ["x-user"] = "u" } }))
  end)
end)
