-- openmesh.policy (the helpers policies compose) and openmesh.testing (the
-- helpers these specs use).
local policy = require "openmesh.policy"
local testing = require "openmesh.testing"
local contract = require "openmesh.contract"

-- Every helper must answer with the given peer tables themselves.
local function assert_identity(result, peers)
  return testing.assert_subset(result, peers)
end

local function peer_set()
  return testing.peers {
    { id = "a", zone = "z1", metadata = { version = "v1" } },
    { id = "b", zone = "z1", metadata = { version = "v2" } },
    { id = "c", zone = "z2", metadata = { version = "v2", tier = "gold" } },
    { id = "d", metadata = {} },
  }
end

describe("openmesh.policy", function()
  describe("filter / match_metadata / exclude_metadata", function()
    it("filters by predicate, keeping order and identity", function()
      local peers = peer_set()
      local r = policy.filter(peers, function(p)
        return p.id ~= "b"
      end)
      assert.same({ "a", "c", "d" }, assert_identity(r, peers))
      assert.are_not.equal(peers, r) -- a new array
    end)

    it("accepts a metadata table as the predicate (all entries must match)", function()
      local peers = peer_set()
      assert.same({ "b", "c" }, assert_identity(policy.filter(peers, { version = "v2" }), peers))
      assert.same({ "c" }, assert_identity(policy.filter(peers, { version = "v2", tier = "gold" }), peers))
    end)

    it("matches and excludes one metadata value", function()
      local peers = peer_set()
      assert.same({ "b", "c" }, assert_identity(policy.match_metadata(peers, "version", "v2"), peers))
      assert.same({ "a", "d" }, assert_identity(policy.exclude_metadata(peers, "version", "v2"), peers))
      assert.same({}, policy.match_metadata(peers, "version", "v9"))
    end)

    it("raises on a predicate that is neither function nor table", function()
      assert.has_error(function()
        policy.filter(peer_set(), "v2")
      end, "predicate expected (a function or a metadata table), got string")
    end)
  end)

  describe("by_zone / zone_local", function()
    it("selects one zone; a nil zone selects nothing", function()
      local peers = peer_set()
      assert.same({ "a", "b" }, assert_identity(policy.by_zone(peers, "z1"), peers))
      assert.same({}, policy.by_zone(peers, nil))
    end)

    it("prefers the zone while it has min_peers, then spills to all", function()
      local peers = peer_set()
      assert.same({ "a", "b" }, assert_identity(policy.zone_local(peers, "z1"), peers))
      assert.same({ "a", "b" }, assert_identity(policy.zone_local(peers, "z1", 2), peers))
      assert.same({ "a", "b", "c", "d" }, assert_identity(policy.zone_local(peers, "z1", 3), peers))
      assert.same({ "c" }, assert_identity(policy.zone_local(peers, "z2", 1), peers))
      assert.same({ "a", "b", "c", "d" }, assert_identity(policy.zone_local(peers, "z3"), peers))
      assert.same({ "a", "b", "c", "d" }, assert_identity(policy.zone_local(peers, nil), peers))
    end)

    it("raises on a bad min_peers", function()
      assert.has_error(function()
        policy.zone_local(peer_set(), "z1", 0)
      end, "zone_local: min_peers must be an integer >= 1, got 0")
    end)
  end)

  describe("unit", function()
    it("maps keys into [0, 1), the same way every time", function()
      for i = 1, 1000 do
        local u = policy.unit("k" .. i)
        assert.is_true(u >= 0 and u < 1)
        assert.equal(u, policy.unit("k" .. i))
      end
    end)

    it("is uniform: each tenth gets about a tenth of 20,000 keys", function()
      local bins = {}
      for i = 0, 9 do
        bins[i] = 0
      end
      for i = 1, 20000 do
        local b = math.floor(policy.unit("key:" .. i) * 10)
        bins[b] = bins[b] + 1
      end
      for i = 0, 9 do
        assert.is_true(math.abs(bins[i] - 2000) < 200, ("bin %d: %d"):format(i, bins[i]))
      end
    end)

    it("is the top 53 bits of openmesh.hash (XXH3-64), as in C", function()
      assert.equal((0x2D06800538D394C2 >> 11) * 2 ^ -53, policy.unit("")) -- XXH3_64bits("")
      assert.equal((require("openmesh").hash("user-57") >> 11) * 2 ^ -53, policy.unit("user-57"))
    end)

    it("raises on a non-string key", function()
      assert.has_error(function()
        policy.unit(42)
      end, "unit: key must be a string, got number")
    end)
  end)

  describe("canary", function()
    local v2 = { version = "v2" }

    it("sends percent of keys to the canary peers, the rest to the others", function()
      local peers = peer_set()
      local n, hits = 10000, 0
      for i = 1, n do
        local r = policy.canary(peers, "user-" .. i, 25, v2)
        local ids = assert_identity(r, peers)
        if ids[1] == "b" then
          assert.same({ "b", "c" }, ids)
          hits = hits + 1
        else
          assert.same({ "a", "d" }, ids)
        end
      end
      assert.is_true(math.abs(hits / n - 0.25) <= 0.02, ("share %.4f"):format(hits / n))
    end)

    it("keeps keys already in the canary when the percentage grows", function()
      local peers = peer_set()
      local before = {}
      for i = 1, 2000 do
        before[i] = policy.canary(peers, "u" .. i, 5, v2)[1].id == "b"
      end
      for i = 1, 2000 do
        local after = policy.canary(peers, "u" .. i, 20, v2)[1].id == "b"
        assert.is_true(after or not before[i])
      end
    end)

    it("sends keyless requests to the stable peers; 0 and 100 are all or nothing", function()
      local peers = peer_set()
      assert.same({ "a", "d" }, testing.ids(policy.canary(peers, nil, 100, v2)))
      for i = 1, 200 do
        assert.same({ "a", "d" }, testing.ids(policy.canary(peers, "k" .. i, 0, v2)))
        assert.same({ "b", "c" }, testing.ids(policy.canary(peers, "k" .. i, 100, v2)))
      end
    end)

    it("never sends a stable key to the canary, not even when it is all there is", function()
      local only_v2 = testing.peers { { id = "b", metadata = { version = "v2" } } }
      for i = 1, 500 do
        local key = "k" .. i
        local ids = testing.ids(policy.canary(only_v2, key, 10, v2))
        assert.same(policy.unit(key) * 100 < 10 and { "b" } or {}, ids)
      end
    end)

    it("sends canary keys to the stable peers while no canary peer exists", function()
      local only_v1 = testing.peers { { id = "a", metadata = { version = "v1" } } }
      assert.same({ "a" }, testing.ids(policy.canary(only_v1, "k", 100, v2)))
    end)

    it("takes a predicate function too", function()
      local peers = peer_set()
      local r = policy.canary(peers, "k", 100, function(p)
        return p.zone == "z2"
      end)
      assert.same({ "c" }, assert_identity(r, peers))
    end)

    it("raises on a percent outside [0, 100]", function()
      for _, bad in ipairs { -1, 101, 0 / 0, "10" } do
        assert.has_error(function()
          policy.canary(peer_set(), "k", bad, v2)
        end)
      end
    end)
  end)

  describe("split", function()
    local function group_peers()
      return testing.peers {
        { id = "a1", metadata = { version = "a" } }, { id = "a2", metadata = { version = "a" } },
        { id = "b1", metadata = { version = "b" } }, { id = "c1", metadata = { version = "c" } },
        { id = "x1", metadata = { version = "x" } },
      }
    end

    it("splits keys by weight, stable per key, one label per answer", function()
      local peers = group_peers()
      local weights = { a = 60, b = 30, c = 10 }
      local count, n = { a = 0, b = 0, c = 0 }, 20000
      for i = 1, n do
        local key = "s" .. i
        local r = policy.split(peers, key, weights)
        local ids = assert_identity(r, peers)
        local label = ids[1]:sub(1, 1) -- ids are label .. n
        for _, id in ipairs(ids) do
          assert.equal(label, id:sub(1, 1))
        end
        count[label] = count[label] + 1
        assert.same(ids, testing.ids(policy.split(peers, key, weights)))
      end
      assert.is_true(math.abs(count.a / n - 0.6) < 0.02)
      assert.is_true(math.abs(count.b / n - 0.3) < 0.02)
      assert.is_true(math.abs(count.c / n - 0.1) < 0.02)
    end)

    it("never chooses a label without weight, or with weight 0", function()
      local peers = group_peers()
      for i = 1, 2000 do
        local ids = testing.ids(policy.split(peers, "k" .. i, { a = 1, b = 0, c = 1 }))
        assert.is_true(ids[1] == "a1" or ids[1] == "c1")
      end
    end)

    it("sends keyless requests to the heaviest label", function()
      assert.same({ "b1" }, testing.ids(policy.split(group_peers(), nil, { a = 1, b = 5, c = 2 })))
    end)

    it("answers empty when the chosen label has no peers", function()
      local only_a = testing.peers { { id = "a1", metadata = { version = "a" } } }
      assert.same({}, policy.split(only_a, nil, { a = 1, z = 9 }))
    end)

    it("labels by any metadata field or by a function", function()
      local peers = testing.peers { { id = "p", zone = "z1", metadata = { ring = "blue" } },
        { id = "q", zone = "z2", metadata = { ring = "green" } } }
      assert.same({ "p" }, testing.ids(policy.split(peers, nil, { blue = 1 }, "ring")))
      assert.same({ "q" }, testing.ids(policy.split(peers, "k", { z2 = 1 }, function(p)
        return p.zone
      end)))
    end)

    it("raises on bad weights", function()
      assert.has_error(function()
        policy.split(group_peers(), "k", "a=1")
      end, "split: weights must be a table of label -> weight, got string")
      assert.has_error(function()
        policy.split(group_peers(), "k", { a = -1 })
      end, "split: weight of a must be a finite number >= 0, got -1")
      assert.has_error(function()
        policy.split(group_peers(), "k", { a = 0 })
      end, "split: weights must add up to more than 0")
    end)
  end)

  describe("header / cookie", function()
    local function req(headers)
      return testing.req { headers = headers }
    end

    it("reads headers by any case of the name; empty means absent", function()
      assert.equal("u1", policy.header(req { ["x-user"] = "u1" }, "X-User"))
      assert.is_nil(policy.header(req { ["x-user"] = "" }, "x-user"))
      assert.is_nil(policy.header(req {}, "x-user"))
      assert.is_nil(policy.header({}, "x-user"))
    end)

    it("parses the Cookie header", function()
      local r = req { cookie = "a=1; user=u-9; b=\"q v\";c= spaced ;d=x=y" }
      assert.equal("1", policy.cookie(r, "a"))
      assert.equal("u-9", policy.cookie(r, "user"))
      assert.equal("q v", policy.cookie(r, "b"))
      assert.equal("spaced", policy.cookie(r, "c"))
      assert.equal("x=y", policy.cookie(r, "d"))
      assert.is_nil(policy.cookie(r, "missing"))
      assert.is_nil(policy.cookie(r, "A")) -- names are case-sensitive
    end)

    it("takes the first of repeated cookies and skips pairs without '='", function()
      local r = req { cookie = "flag; user=first; user=second" }
      assert.equal("first", policy.cookie(r, "user"))
      assert.is_nil(policy.cookie(r, "flag"))
    end)

    it("treats a cookie name as text, never as a pattern", function()
      local r = req { cookie = "a.b=1; a%b=2; (x=3" }
      assert.equal("1", policy.cookie(r, "a.b"))
      assert.equal("2", policy.cookie(r, "a%b"))
      assert.equal("3", policy.cookie(r, "(x"))
      assert.is_nil(policy.cookie(r, "a_b"))
    end)

    it("stays linear on hostile headers", function()
      local hostile = {
        ("a;"):rep(50000) .. "user=u",
        "user=" .. (" "):rep(100000) .. "x",
        ("x" .. (" "):rep(50) .. "=" .. (" "):rep(50) .. ";"):rep(1000) .. "user=u",
      }
      assert.equal("u", policy.cookie(req { cookie = hostile[1] }, "user"))
      assert.equal("x", policy.cookie(req { cookie = hostile[2] }, "user"))
      assert.equal("u", policy.cookie(req { cookie = hostile[3] }, "user"))
      -- Linear, not a time bar: inside a policy the same parse must fit the
      -- sandbox's instruction budget (2M), which a quadratic scan of these
      -- headers would exceed by orders of magnitude.
      local p = assert(require("openmesh").policy.load {
        name = "cookie.lua", instr_limit = 2000000, wall_limit_ms = 60000,
        source = [[
          local policy = require "openmesh.policy"
          return { kind = "traffic", subset = function(req, peers)
            if policy.cookie(req, "user") == req.headers["x-want"] then return peers end
            return {}
          end }]] })
      for i, h in ipairs(hostile) do
        local want = i == 2 and "x" or "u"
        local ids, err = p:subset({ headers = { cookie = h, ["x-want"] = want } }, { { id = "a" } })
        assert.same({ "a" }, ids, err)
      end
    end)

    it("has no cookies without a Cookie header, or with an empty value", function()
      assert.is_nil(policy.cookie(req {}, "user"))
      assert.is_nil(policy.cookie(req { cookie = "user=" }, "user"))
      assert.is_nil(policy.cookie(req { cookie = "user=\"\"" }, "user"))
    end)
  end)
end)

describe("openmesh.testing", function()
  it("builds requests and peers with the documented defaults", function()
    assert.same({ service = "example", method = "GET", path = "/", headers = {}, metadata = {} }, testing.req {})
    assert.same({ { id = "a", url = "http://127.0.0.1:1/", weight = 1, metadata = {} },
      { id = "b", url = "http://127.0.0.1:1/", weight = 2, zone = "z", metadata = {} } },
      testing.peers { "a", { id = "b", weight = 2, zone = "z" } })
    assert.same({ agent = "support", context = "interactive", channel = "example", failed = {} },
      testing.ctx { agent = "support" })
  end)

  it("refuses typos in what it builds", function()
    assert.has_error(function()
      testing.req { header = {} }
    end, "testing.req: unknown field 'req.header' (did you mean 'headers'?)")
    assert.has_error(function()
      testing.peers { "a", { url = "http://x/" } }
    end, "testing.peers: field 'peers[2].id': non-empty string expected, got nil")
    assert.has_error(function()
      testing.req { headers = { ["X-User"] = "u" } }
    end, "testing.req: field 'req.headers['X-User']': header names must be lower-case")
  end)

  it("has a fake clock", function()
    local clock = testing.clock(1000)
    assert.equal(1000, clock.now())
    assert.equal(1250, clock.advance(250))
    assert.equal(1300, clock:advance(50))
    assert.equal(1300, clock:now())
    assert.equal(0, testing.clock().now())
    assert.has_error(function()
      clock.advance(-1)
    end, "clock.advance: a number of milliseconds >= 0 expected")
  end)

  it("calls subset and key on a policy table or a loaded policy alike", function()
    local t = { kind = "traffic", subset = function(_, peers)
      return { peers[2] }
    end, key = function(req)
      return req.headers["x-user"]
    end }
    local req = testing.req { headers = { ["x-user"] = "u" } }
    assert.same({ "b" }, testing.subset(t, req, { "a", "b" }))
    assert.equal("u", testing.key(t, req))
    local p = assert(testing.load("examples/policies/keyed_affinity.lua"))
    assert.same({ "a", "b" }, testing.subset(p, req, testing.peers { "b", "a" })) -- sorted ids
    assert.is_nil(testing.key(p, req))
  end)

  it("raises when a policy breaks the contract", function()
    local t = { kind = "traffic", subset = function()
      return { { id = "evil" } }
    end }
    assert.has_error(function()
      testing.subset(t, {}, { "a" })
    end, "subset returned a peer that was not offered (id 'evil')")
  end)

  it("asserts subsets by identity", function()
    local peers = testing.peers { "a", "b" }
    assert.same({ "b" }, testing.assert_subset({ peers[2] }, peers))
    assert.has_error(function()
      testing.assert_subset({ testing.peer "b" }, peers)
    end, "subset returned a peer that was not offered (id 'b')")
  end)

  describe("load", function()
    local function write(src)
      local path = os.tmpname() .. "_policy.lua"
      local f = assert(io.open(path, "w"))
      f:write(src)
      f:close()
      return path
    end

    it("returns a handle with the documented methods", function()
      local p = assert(testing.load("examples/policies/zone_local.lua"))
      assert.equal("traffic", p:kind())
      assert.equal("zone_local", p:name())
      assert.equal(1, p:version())
      assert.is_string(p:settings().description)
      local ids = p:subset(testing.req { metadata = { zone = "z" } }, testing.peers { "a", "b" })
      table.sort(ids)
      assert.same({ "a", "b" }, ids)
    end)

    it("refuses an invalid policy with the validator's message", function()
      local path = write("return { kind = 'traffic', subset = function(_, p) return p end, max_inflight = -3 }")
      local p, err = testing.load(path)
      os.remove(path)
      assert.is_nil(p)
      assert.matches("^EPOLICY: ", err)
      assert.truthy(err:find("field 'max_inflight': integer >= 1 expected, got -3", 1, true), err)
    end)

    it("refuses a policy whose example fails", function()
      local path = write([[
        return { kind = "traffic", subset = function(_, p) return p end,
          examples = { { peers = { { id = "a" }, { id = "b" } }, expect = { "a" } } } }]])
      local p, err = testing.load(path)
      os.remove(path)
      assert.is_nil(p)
      assert.truthy(err:find("example 1: subset returned {a, b}, expected {a}", 1, true), err)
    end)

    it("runs the policy in the sandbox: no io, no os.execute", function()
      local path = write("return { kind = 'traffic', subset = function(_, p) return p end, x = io or os.execute }")
      local p = assert(testing.load(path))
      os.remove(path)
      assert.is_nil(p:settings().x)
      path = write("local c = require 'openmesh.contract'; return { kind = 'traffic', " ..
        "subset = function(_, p) return p end, description = type(c.validate) }")
      p = assert(testing.load(path))
      os.remove(path)
      assert.equal("function", p:settings().description)
      path = write("require 'socket'; return {}")
      local _, err = testing.load(path)
      os.remove(path)
      assert.truthy(err:find("policies may only require 'openmesh' and 'openmesh.*'", 1, true), err)
    end)

    it("returns errors from a loaded policy at runtime as EPOLICY", function()
      local path = write("return { kind = 'traffic', subset = function(_, p) return { p[1], p[1] } end }")
      local p = assert(testing.load(path))
      os.remove(path)
      local ids, err = p:subset(testing.req {}, testing.peers { "a" })
      assert.is_nil(ids)
      assert.matches("^EPOLICY: .*subset", err) -- the C hot path words it its own way
    end)
  end)
end)

describe("every shipped and example policy", function()
  it("loads through the validator and is named after its file", function()
    for _, path in ipairs { "policies/traffic.lua", "policies/fallback.lua", "policies/egress_heuristics.lua",
      "examples/policies/canary.lua", "examples/policies/metadata_match.lua",
      "examples/policies/zone_local.lua", "examples/policies/keyed_affinity.lua" } do
      local p, err = testing.load(path)
      assert.is_nil(err)
      assert.truthy(p, path)
      assert.equal(contract.name({}, path), p:name())
    end
  end)
end)
