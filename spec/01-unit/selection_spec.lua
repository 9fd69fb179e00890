-- selection_spec.lua: openmesh.hash, openmesh.rendezvous and openmesh.p2c as
-- a policy author uses them: which peer a key goes to, what moves when the
-- peer set changes, and how load spreads.
local om = require "openmesh"

local function peers_of(n, first)
  local peers = {}
  for i = 1, n do
    peers[i] = { id = "peer-" .. (i + (first or 0)) }
  end
  return peers
end

-- A misuse error from a module function: "bad argument #N to 'NAME' (inner)".
-- NAME depends on how the function was reached ('rendezvous' or
-- 'openmesh.rendezvous'), so only the rest is compared exactly (after the
-- "file:line: " of the caller, as assert.has_error does).
local function arg_error(fn, argn, inner)
  local ok, err = pcall(fn)
  assert.is_false(ok)
  assert.is_string(err)
  err = err:gsub("^[^\n]-:%d+: ", "", 1)
  local name = err:match("^bad argument #" .. argn .. " to '([%w%.]+)' %(")
  assert.is_truthy(name, err)
  assert.equal(("bad argument #%d to '%s' (%s)"):format(argn, name, inner), err)
end

local function count_keys(r, nkeys)
  local counts = {}
  for k = 1, nkeys do
    local id = r:pick("key-" .. k)
    counts[id] = (counts[id] or 0) + 1
  end
  return counts
end

describe("openmesh.hash", function()
  it("is XXH3-64 as a Lua integer", function()
    -- XXH3_64bits("") from the xxHash test vectors.
    assert.equal(0x2D06800538D394C2, om.hash(""))
    assert.equal(om.hash("user-42"), om.hash("user-42"))
    assert.not_equal(om.hash("user-42"), om.hash("user-43"))
    assert.is_true(math.type(om.hash("x")) == "integer")
  end)

  it("takes a seed, 0 by default", function()
    assert.equal(om.hash("abc"), om.hash("abc", 0))
    assert.not_equal(om.hash("abc", 0), om.hash("abc", 1))
  end)

  it("uses the full 64 bits (two's complement)", function()
    local negative = false
    for i = 1, 64 do
      if om.hash("k" .. i) < 0 then negative = true end
    end
    assert.is_true(negative)
  end)

  it("rejects what is not a string", function()
    arg_error(function() om.hash({}) end, 1, "string expected, got table")
  end)
end)

describe("openmesh.rendezvous", function()
  it("sends a key to the same peer every time", function()
    local r = om.rendezvous(peers_of(5))
    local first = r:pick("session-1")
    for _ = 1, 10 do assert.equal(first, r:pick("session-1")) end
    -- Another object over the same peers agrees: no hidden state.
    assert.equal(first, om.rendezvous(peers_of(5)):pick("session-1"))
    assert.equal(5, #r)
  end)

  it("accepts plain id strings and defaults weights to 1", function()
    local a = om.rendezvous({ "x", "y", "z" })
    local b = om.rendezvous({ { id = "x" }, { id = "y", weight = 1 }, { id = "z" } })
    for k = 1, 200 do assert.equal(a:pick("k" .. k), b:pick("k" .. k)) end
  end)

  it("spreads keys evenly with equal weights", function()
    local counts = count_keys(om.rendezvous(peers_of(8)), 40000)
    for i = 1, 8 do
      assert.near(1 / 8, (counts["peer-" .. i] or 0) / 40000, 0.02)
    end
  end)

  it("gives each peer weight / sum of the keys, within 2%", function()
    local shapes = {
      { 1, 2, 3, 4 },
      { 1, 1, 1, 10 },
      { 0.5, 0.25, 8 },
      { 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2 },
    }
    for _, weights in ipairs(shapes) do
      local peers, sum = {}, 0
      for i, w in ipairs(weights) do
        peers[i] = { id = "peer-" .. i, weight = w }
        sum = sum + w
      end
      local counts = count_keys(om.rendezvous(peers), 100000)
      for i, w in ipairs(weights) do
        assert.near(w / sum, (counts["peer-" .. i] or 0) / 100000, 0.02)
      end
    end
  end)

  it("moves about 1/(n+1) of the keys when a peer joins, all to it", function()
    local before = om.rendezvous(peers_of(10))
    local after = om.rendezvous(peers_of(11))
    local moved = 0
    for k = 1, 20000 do
      local a, b = before:pick("key-" .. k), after:pick("key-" .. k)
      if a ~= b then
        moved = moved + 1
        assert.equal("peer-11", b)
      end
    end
    assert.near(1 / 11, moved / 20000, 0.01)
  end)

  it("moves only the keys of a peer that leaves, to its next in rank", function()
    local all = { { id = "a", weight = 1 }, { id = "b", weight = 2 },
                  { id = "c", weight = 3 }, { id = "d", weight = 1 } }
    local without_c = { all[1], all[2], all[4] }
    local before, after = om.rendezvous(all), om.rendezvous(without_c)
    local moved = 0
    for k = 1, 10000 do
      local key = "key-" .. k
      local a, b = before:pick(key), after:pick(key)
      if a == "c" then
        moved = moved + 1
        assert.equal(before:rank(key, 2)[2], b)
      else
        assert.equal(a, b)
      end
    end
    assert.near(3 / 7, moved / 10000, 0.02)
  end)

  it("ranks every peer once, best first, for retries to walk", function()
    local r = om.rendezvous({ { id = "a", weight = 1 }, { id = "b", weight = 5 },
                              { id = "c", weight = 2 }, "d", "e" })
    for k = 1, 300 do
      local key = "key-" .. k
      local rank = r:rank(key)
      assert.equal(5, #rank)
      local seen = {}
      for _, id in ipairs(rank) do
        assert.is_nil(seen[id])
        seen[id] = true
      end
      assert.equal(r:pick(key), rank[1])
      assert.same({ rank[1], rank[2] }, r:rank(key, 2))
    end
    assert.same({}, r:rank("k", 0))
    assert.equal(5, #r:rank("k", 99))
  end)

  it("returns nil, ENOPEERS for an empty peer list", function()
    local r, err, code = om.rendezvous({})
    assert.is_nil(r)
    assert.equal("ENOPEERS: empty peer list", err)
    assert.equal("ENOPEERS", code)
  end)

  it("rejects bad weights, naming the peer", function()
    local function with_weight(w)
      return function() om.rendezvous({ "a", { id = "b", weight = w } }) end
    end
    local msg = "peers[2].weight: must be a finite number > 0, got "
    arg_error(with_weight(0), 1, msg .. "0.0")
    arg_error(with_weight(-1), 1, msg .. "-1.0")
    arg_error(with_weight(math.huge), 1, msg .. "inf")
    assert.error_matches(with_weight(0 / 0), msg, 1, true) -- nan or -nan
    arg_error(with_weight("2"), 1, "peers[2].weight: number expected, got string")
  end)

  it("rejects duplicate, empty and missing ids", function()
    arg_error(function() om.rendezvous({ "a", "b", { id = "a" } }) end, 1,
      "peers[3].id: duplicate id 'a' (also peers[1])")
    arg_error(function() om.rendezvous({ "a", "" }) end, 1,
      "peers[2].id: non-empty string expected, got empty string")
    arg_error(function() om.rendezvous({ { weight = 2 } }) end, 1,
      "peers[1].id: non-empty string expected, got nil")
    arg_error(function() om.rendezvous({ 42 }) end, 1,
      "peers[1]: table or string expected, got number")
    arg_error(function() om.rendezvous("a,b") end, 1,
      "table expected, got string")
  end)

  it("rejects a negative k and use after close", function()
    local r = om.rendezvous({ "a", "b" })
    assert.has_error(function() r:rank("k", -1) end,
      "bad argument #2 to 'rank' (k must be >= 0)")
    r:close()
    r:close() -- idempotent
    assert.has_error(function() r:pick("k") end,
      "attempt to use a closed openmesh.Rendezvous")
    assert.equal("openmesh.Rendezvous (closed)", tostring(r))
  end)

  it("closes with <close>", function()
    local r
    do
      local scoped <close> = om.rendezvous({ "a" })
      r = scoped
      assert.equal("a", r:pick("k"))
    end
    assert.has_error(function() r:pick("k") end,
      "attempt to use a closed openmesh.Rendezvous")
  end)
end)

describe("openmesh.p2c", function()
  it("picks among the peers, one peer is always that peer", function()
    local p = om.p2c({ "only" }, { seed = 1 })
    for _ = 1, 20 do assert.equal("only", p:pick()) end
    local q = om.p2c({ "a", "b", "c" }, { seed = 1 })
    local seen = {}
    for _ = 1, 300 do seen[q:pick()] = true end
    assert.same({ a = true, b = true, c = true }, seen)
    assert.equal(3, #q)
  end)

  it("is reproducible from its seed", function()
    local a = om.p2c(peers_of(20), { seed = 42 })
    local b = om.p2c(peers_of(20), { seed = 42 })
    for _ = 1, 100 do assert.equal(a:pick(), b:pick()) end
  end)

  it("sends the next request to the less loaded of two", function()
    local p = om.p2c({ "busy", "idle" }, { seed = 2 })
    p:start("busy")
    p:start("busy")
    assert.equal(2, p:inflight("busy"))
    for _ = 1, 50 do assert.equal("idle", p:pick()) end
    p:finish("busy", 30)
    p:finish("busy", 30)
    assert.equal(0, p:inflight("busy"))
  end)

  it("prefers the faster peer (peak EWMA latency)", function()
    local p = om.p2c({ "slow", "fast" }, { seed = 3 })
    assert.equal(30, p:latency("slow")) -- the default before any sample
    p:start("slow")
    p:finish("slow", 250, true, 1000)
    assert.equal(250, p:latency("slow")) -- rises at once
    -- a peer without a sample reads the mean of those with one
    assert.equal(250, p:latency("fast"))
    p:start("fast")
    p:finish("fast", 5, true, 1000)
    assert.equal(5, p:latency("fast"))
    for _ = 1, 50 do assert.equal("fast", p:pick()) end
    -- Lower samples decay it with a 10 s time constant.
    p:start("slow")
    p:finish("slow", 10, true, 11000)
    assert.near(10 + 240 * math.exp(-1), p:latency("slow"), 1e-6)
  end)

  it("advances its clock by the latency when no now_ms is given", function()
    local p = om.p2c({ "a" }, { seed = 4 })
    p:start("a")
    p:finish("a", 100) -- clock 100 ms
    p:start("a")
    p:finish("a", 10000) -- a higher sample: up at once; clock 10100 ms
    p:start("a")
    p:finish("a", 0) -- no time passes: no decay
    assert.equal(10000, p:latency("a"))
    p:start("a")
    p:finish("a", 0, true, 20100) -- 10 s later
    assert.near(10000 * math.exp(-1), p:latency("a"), 1e-6)
  end)

  it("does not let fast failures make a peer look fast", function()
    local p = om.p2c({ "a", "b" }, { seed = 5 })
    p:start("a")
    p:finish("a", 1, false, 1000)
    assert.equal(30, p:latency("a"))
  end)

  it("penalizes a Retry-After, decaying to nothing at its end", function()
    local p = om.p2c({ "limited", "ok" }, { seed = 6 })
    p:penalize("limited", 2000, 1000)
    assert.equal(2030, p:latency("limited", 1000))
    assert.equal(1030, p:latency("limited", 2000))
    -- While it lasts, the other peer takes the load even with work in flight.
    p:start("ok")
    p:start("ok")
    for _ = 1, 50 do assert.equal("ok", p:pick(nil, 2000)) end
    assert.equal(30, p:latency("limited", 3000))
    -- No Retry-After: the default 1 s window.
    p:penalize("ok", nil, 5000)
    assert.equal(1030, p:latency("ok", 5000))
  end)

  it("skips open circuits and peers this request already tried", function()
    local p = om.p2c(peers_of(10), { seed = 7 })
    for i = 1, 10, 2 do p:set_eligible("peer-" .. i, false) end
    assert.is_false(p:is_eligible("peer-1"))
    assert.is_true(p:is_eligible("peer-2"))
    local tried = { ["peer-2"] = true, ["peer-4"] = true }
    for _ = 1, 200 do
      local id = p:pick(tried)
      assert.is_true(id == "peer-6" or id == "peer-8" or id == "peer-10")
    end
    -- An array of ids works too; ids that are not peers are ignored.
    for _ = 1, 50 do
      assert.equal("peer-10", p:pick({ "peer-2", "peer-4", "peer-6", "peer-8", "gone" }))
    end
  end)

  it("finds the one eligible peer among many (bounded fallback)", function()
    local p = om.p2c(peers_of(64), { seed = 8 })
    for i = 1, 64 do p:set_eligible("peer-" .. i, i == 40) end
    for _ = 1, 200 do assert.equal("peer-40", p:pick()) end
  end)

  it("returns nil, ENOPEERS when nothing is left", function()
    local p = om.p2c({ "a", "b" }, { seed = 9 })
    local id, err, code = p:pick({ a = true, b = true })
    assert.is_nil(id)
    assert.equal("ENOPEERS: no eligible peer left to pick", err)
    assert.equal("ENOPEERS", code)
    p:set_eligible("a", false)
    p:set_eligible("b", false)
    assert.is_nil((p:pick()))
    p:set_eligible("b", true)
    assert.equal("b", p:pick())
  end)

  it("keeps the busiest peer far below random choice", function()
    -- 50000 requests over 50 peers, each lasting 50 picks: one in flight
    -- per peer on average.
    local function run(choose)
      local p = om.p2c(peers_of(50), { seed = 10 })
      local ring, load, max = {}, {}, 0
      for i = 1, 50000 do
        local done = ring[i % 50]
        if done then
          p:finish(done, 10)
          load[done] = load[done] - 1
        end
        local id = choose(p)
        p:start(id)
        load[id] = (load[id] or 0) + 1
        if load[id] > max then max = load[id] end
        ring[i % 50] = id
      end
      return max
    end
    math.randomseed(10)
    local p2c = run(function(p) return p:pick() end)
    local random = run(function() return "peer-" .. math.random(50) end)
    -- Theory: ~log2 ln n above the mean for two choices (here 4 at most),
    -- ~ln n / ln ln n for one (here 8 to 10 over seeds).
    local why = ("p2c %d, random %d"):format(p2c, random)
    assert.is_true(p2c <= 4, why)
    assert.is_true(random >= p2c + 3, why)
  end)

  it("raises on unknown ids and unmatched finishes", function()
    local p = om.p2c({ "a" }, { seed = 11 })
    assert.has_error(function() p:start("nope") end,
      "bad argument #1 to 'start' (unknown peer id 'nope')")
    assert.has_error(function() p:finish("nope", 1) end,
      "bad argument #1 to 'finish' (unknown peer id 'nope')")
    assert.has_error(function() p:finish("a", 1) end,
      "finish without a matching start on peer 'a'")
    p:start("a")
    assert.has_error(function() p:finish("a", -1) end,
      "bad argument #2 to 'finish' (latency_ms must be a finite number >= 0)")
    assert.has_error(function() p:penalize("a", 0 / 0) end,
      "bad argument #2 to 'penalize' (retry_after_ms must be a finite number >= 0)")
    assert.has_error(function() p:set_eligible("a") end,
      "bad argument #2 to 'set_eligible' (value expected)")
  end)

  it("validates its peers and options like rendezvous", function()
    local r, err = om.p2c({})
    assert.is_nil(r)
    assert.equal("ENOPEERS: empty peer list", err)
    arg_error(function() om.p2c({ { id = "a", weight = -1 } }) end, 1,
      "peers[1].weight: must be a finite number > 0, got -1.0")
    arg_error(function() om.p2c({ "a", "a" }) end, 1,
      "peers[2].id: duplicate id 'a' (also peers[1])")
    arg_error(function() om.p2c({ "a" }, { seed = 1.5 }) end, 2,
      "field 'seed': integer expected")
    assert.error_matches(function() om.p2c({ "a" }, { decay_ms = 0 }) end,
      "field 'decay_ms': must be in", 1, true)
  end)

  it("weighs peers: cost is (inflight + 1) x latency / weight", function()
    local p = om.p2c({ { id = "big", weight = 4 }, { id = "small", weight = 1 } },
                     { seed = 12 })
    for _ = 1, 2 do p:start("big") end -- 3 x 30 / 4 = 22.5 < 30
    for _ = 1, 50 do assert.equal("big", p:pick()) end
    for _ = 1, 2 do p:start("big") end -- 5 x 30 / 4 = 37.5 > 30
    for _ = 1, 50 do assert.equal("small", p:pick()) end
  end)

  it("closes once, then refuses use", function()
    local p = om.p2c({ "a" }, { seed = 13 })
    assert.equal("openmesh.P2C (1 peers, 1 eligible)", tostring(p))
    p:close()
    p:close()
    assert.has_error(function() p:pick() end,
      "attempt to use a closed openmesh.P2C")
  end)
end)
