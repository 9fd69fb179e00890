-- openmesh.testing: what a busted spec needs to test a policy without a
-- network.
--
--   local testing = require "openmesh.testing"
--   local p = assert(testing.load("policies/traffic.lua"))
--   local peers = testing.peers{ "a", { id = "b", zone = "z1" } }
--   assert.same({ "a", "b" }, testing.subset(p, testing.req{}, peers))
--   assert.same({ false, "..." }, { testing.authorize(p, testing.req{}) })
--
-- testing.load goes through the real validator (the C runtime's
-- om.policy.load: sandbox, budgets, contract.validate, examples), so a
-- policy that passes its spec is one hot reload accepts.
local contract = require "openmesh.contract"

local testing = {}

-- Raise with a message that points at the spec line that misused us.
local function misuse(msg)
  error(msg, 3)
end

---------------------------------------------------------------------------
-- Builders
---------------------------------------------------------------------------

-- testing.req{...} -> a request with the example defaults filled in
-- (service "example", method "GET", path "/", empty headers and metadata).
-- Unknown fields and upper-case header names raise, as in examples.
function testing.req(t)
  t = t or {}
  local err = contract.check_req(t, "req")
  if err then
    misuse("testing.req: " .. err)
  end
  return contract.default_req(t)
end

-- testing.peer{...} -> one peer with defaults (url, weight 1, metadata {});
-- a string is a peer with just that id.
function testing.peer(t)
  if type(t) == "string" then
    t = { id = t }
  end
  local err = contract.check_peer(t, "peer")
  if err then
    misuse("testing.peer: " .. err)
  end
  return contract.default_peer(t)
end

-- testing.peers{...} -> an array of peers built by testing.peer.
function testing.peers(list)
  local peers = {}
  for i, t in ipairs(list or {}) do
    if type(t) == "string" then
      t = { id = t }
    end
    local err = contract.check_peer(t, ("peers[%d]"):format(i))
    if err then
      misuse("testing.peers: " .. err)
    end
    peers[i] = contract.default_peer(t)
  end
  return peers
end

-- testing.ctx{...} -> a fallback / egress context with the example
-- defaults (agent "example", context "interactive", channel "example",
-- failed {}).
function testing.ctx(t)
  t = t or {}
  local err = contract.check_ctx(t, "ctx")
  if err then
    misuse("testing.ctx: " .. err)
  end
  return contract.default_ctx(t)
end

-- Milliseconds since the epoch of "YYYY-MM-DDTHH:MM[:SS]Z" (UTC only: a
-- test that depends on the host's time zone is a flaky test).
local function utc_ms(text)
  local y, mo, d, h, mi, sec = text:match("^(%d%d%d%d)%-(%d%d)%-(%d%d)T(%d%d):(%d%d):?(%d*)Z$")
  if not y then
    return nil
  end
  y, mo, d = tonumber(y), tonumber(mo), tonumber(d)
  -- days from civil (Howard Hinnant's algorithm), proleptic Gregorian
  local yy = mo <= 2 and y - 1 or y
  local era = (yy >= 0 and yy or yy - 399) // 400
  local yoe = yy - era * 400
  local doy = (153 * (mo + (mo > 2 and -3 or 9)) + 2) // 5 + d - 1
  local doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
  local days = era * 146097 + doe - 719468
  return ((days * 24 + tonumber(h)) * 60 + tonumber(mi)) * 60000 + (tonumber(sec) or 0) * 1000
end
testing.utc_ms = utc_ms

-- testing.clock([start]) -> a fake clock. start: ms since the epoch, or a
-- UTC time "2026-12-02T09:30:00Z" (default 0). clock.now() -> ms;
-- clock.advance(ms) and clock.set(ms | "...Z") -> the new now; all also
-- work as methods. clock.attach(handle) makes a loaded policy read this
-- clock through os.time() (floor(now / 1000)) and os.clock() (now / 1000)
-- inside its sandbox, from now on and at every advance or set;
-- testing.load(path, {clock = c}) attaches for you. A policy that
-- declares vary still may not read the clock (it raises as in the proxy).
function testing.clock(start)
  local now = start or 0
  if type(now) == "string" then
    now = utc_ms(now) or misuse("testing.clock: start: ms or \"YYYY-MM-DDTHH:MM:SSZ\" expected, got " .. start)
  elseif type(now) ~= "number" then
    misuse("testing.clock: start: ms or \"YYYY-MM-DDTHH:MM:SSZ\" expected")
  end
  local clock = {}
  local attached = setmetatable({}, { __mode = "k" })
  local function push()
    for h in pairs(attached) do
      h:set_clock(now)
    end
  end
  local function arg(a, b)
    if a == clock then
      return b
    end
    return a
  end
  function clock.now()
    return now
  end
  function clock.advance(a, b)
    local ms = arg(a, b)
    if type(ms) ~= "number" or ms < 0 then
      misuse("clock.advance: a number of milliseconds >= 0 expected")
    end
    now = now + ms
    push()
    return now
  end
  function clock.set(a, b)
    local t = arg(a, b)
    if type(t) == "string" then
      t = utc_ms(t)
    end
    if type(t) ~= "number" then
      misuse("clock.set: ms or \"YYYY-MM-DDTHH:MM:SSZ\" expected")
    end
    now = t
    push()
    return now
  end
  function clock.attach(a, b)
    local h = arg(a, b)
    if type(h) ~= "userdata" or h.set_clock == nil then
      misuse("clock.attach: a policy from testing.load expected")
    end
    attached[h] = true
    h:set_clock(now)
    return h
  end
  return clock
end

---------------------------------------------------------------------------
-- Calling a policy
---------------------------------------------------------------------------

-- The ids of an array of peers, in order.
function testing.ids(peers)
  local ids = {}
  for i, p in ipairs(peers) do
    ids[i] = p.id
  end
  return ids
end

local function sorted(list)
  table.sort(list)
  return list
end

local function is_handle(policy)
  -- A loaded policy (userdata from om.policy.load) has methods; a policy
  -- table has a `kind` field instead.
  return type(policy) == "userdata"
end

-- testing.subset(policy, req, peers) -> the sorted ids subset() chose.
-- policy: a handle from testing.load or a policy table. req and peers may
-- be partial (defaults are filled in). A contract violation raises.
function testing.subset(policy, req, peers)
  req = contract.default_req(req)
  local full = {}
  for i, p in ipairs(peers or {}) do
    full[i] = contract.default_peer(type(p) == "string" and { id = p } or p)
  end
  if is_handle(policy) then
    local ids, err = policy:subset(req, full)
    if not ids then
      misuse(err)
    end
    return sorted(ids)
  end
  local result, err = contract.subset(policy, req, full)
  if not result then
    misuse(err)
  end
  return sorted(testing.ids(result))
end

-- testing.key(policy, req) -> what key() returns (nil without key()); a
-- contract violation raises.
function testing.key(policy, req)
  req = contract.default_req(req)
  local key, err
  if is_handle(policy) then
    key, err = policy:key(req)
  else
    key, err = contract.key(policy, req)
  end
  if err then
    misuse(err)
  end
  return key
end

-- testing.authorize(policy, req) -> true | false, reason: what
-- authorize() answers for req (partial: defaults filled in); true for a
-- policy without authorize(). reason is "" when the policy gave none. An
-- answer the proxy would count as a policy_error raises.
function testing.authorize(policy, req)
  req = contract.default_req(req)
  local ok, reason
  if is_handle(policy) then
    ok, reason = policy:authorize(req)
  else
    ok, reason = contract.authorize(policy, req)
  end
  if ok == nil then
    misuse(reason)
  end
  if ok then
    return true
  end
  return false, reason
end

-- testing.order(policy, ctx) -> the route names, in order.
function testing.order(policy, ctx)
  ctx = contract.default_ctx(ctx)
  local names, err
  if is_handle(policy) then
    names, err = policy:order(ctx)
  else
    names, err = contract.order(policy, ctx)
  end
  if not names then
    misuse(err)
  end
  return names
end

-- testing.evaluate(policy, text [, ctx]) -> {flagged, confidence, checks}.
function testing.evaluate(policy, text, ctx)
  ctx = contract.default_ctx(ctx)
  local result, err
  if is_handle(policy) then
    result, err = policy:evaluate(text, ctx)
  else
    result, err = contract.evaluate(policy, text, ctx)
  end
  if not result then
    misuse(err)
  end
  return result
end

-- testing.assert_subset(result, peers) -> result's ids; raises unless
-- result is an array of the very tables in `peers`, without duplicates
-- (what the runtime demands of subset()).
function testing.assert_subset(result, peers)
  local err = contract.subset_error(result, peers)
  if err then
    misuse(err)
  end
  return testing.ids(result)
end

---------------------------------------------------------------------------
-- Loading a policy
---------------------------------------------------------------------------

-- testing.load(path [, opts]) -> a loaded policy | nil, "EPOLICY: ...".
-- Through om.policy.load{path = path} (the C runtime: sandbox, budgets,
-- validation, examples), exactly as hot reload loads it; opts are merged
-- into its argument. The handle has :kind() :name() :version() :settings()
-- :subset(req, peers) -> ids, :key(req), :authorize(req), :order(ctx),
-- :evaluate(text, ctx).
--
-- opts.clock (from testing.clock) is attached to the loaded policy: its
-- os.time()/os.clock() read that clock. The examples run at load, on the
-- host's clock, as they do at hot reload.
function testing.load(path, opts)
  local args, clock = { path = path }, nil
  for k, v in pairs(opts or {}) do
    if k == "clock" then
      clock = v
    else
      args[k] = v
    end
  end
  local h, err = require("openmesh").policy.load(args)
  if h and clock then
    clock.attach(h)
  end
  return h, err
end

---------------------------------------------------------------------------
-- Where traffic goes
---------------------------------------------------------------------------

local function full_peers(peers)
  local full = {}
  for i, p in ipairs(peers or {}) do
    full[i] = contract.default_peer(type(p) == "string" and { id = p } or p)
  end
  return full
end

-- The key the proxy hashes: the policy's key(), else the caller's
-- x-openmesh-key header; nil (unkeyed) when neither or empty.
local function routing_key(policy, req)
  local key = testing.key(policy, req)
  if key == nil or key == "" then
    key = req.headers and req.headers["x-openmesh-key"]
  end
  if key == "" then
    return nil
  end
  return key
end

-- The selectors of one subset, built once per distinct subset.
local function chooser(cache, subset_ids, by_id, seed)
  local sig = table.concat(subset_ids, "\0")
  local c = cache[sig]
  if c then
    return c
  end
  local om = require "openmesh"
  local list = {}
  for i, id in ipairs(subset_ids) do
    list[i] = { id = id, weight = by_id[id].weight or 1 }
  end
  c = {
    rdv = assert(om.rendezvous(list)), -- seed 0, as the proxy's view
    p2c = assert(om.p2c(list, { seed = seed or 0 })),
  }
  cache[sig] = c
  return c
end

local function pick_with(policy, req, peers, by_id, cache, seed)
  req = contract.default_req(req)
  local ids = testing.subset(policy, req, peers)
  if #ids == 0 then
    return nil
  end
  local c = chooser(cache, ids, by_id, seed)
  local key = routing_key(policy, req)
  if key ~= nil then
    return (c.rdv:pick(key))
  end
  return (c.p2c:pick())
end

local function index(peers)
  local full, by_id = full_peers(peers), {}
  for _, p in ipairs(full) do
    by_id[p.id] = p
  end
  return full, by_id
end

-- testing.pick(policy, req, peers [, opts]) -> the id of the peer the
-- proxy would send req to first (nil when the subset is empty): the
-- rendezvous winner for the key (the policy's key(), else the
-- x-openmesh-key header) among the subset, with the proxy's hash and
-- seed; unkeyed, a P2C pick over the subset seeded with opts.seed
-- (default 0; the proxy's own P2C also weighs in-flight load, which a
-- test does not have). A contract violation raises.
function testing.pick(policy, req, peers, opts)
  local full, by_id = index(peers)
  return pick_with(policy, req, full, by_id, {}, opts and opts.seed)
end

-- testing.share(policy, reqs, peers [, opts]) -> { [peer id] = fraction },
-- n: how a list of requests (or a generator: a function called with
-- 1, 2, ... until it returns nil) spreads over peers, by testing.pick.
-- Requests whose subset is empty count under [false].
function testing.share(policy, reqs, peers, opts)
  local full, by_id = index(peers)
  local cache, counts, n = {}, {}, 0
  local seed = opts and opts.seed
  local function one(req)
    local id = pick_with(policy, req, full, by_id, cache, seed)
    if id == nil then
      id = false
    end
    counts[id] = (counts[id] or 0) + 1
    n = n + 1
  end
  if type(reqs) == "function" then
    local i = 1
    while true do
      local req = reqs(i)
      if req == nil then
        break
      end
      one(req)
      i = i + 1
    end
  elseif type(reqs) == "table" then
    for _, req in ipairs(reqs) do
      one(req)
    end
  else
    misuse("testing.share: reqs: a list of requests or a generator expected")
  end
  for id, c in pairs(counts) do
    counts[id] = c / n
  end
  return counts, n
end

-- testing.decide(policy, req) -> the decision table decide(req) returns
-- (nil without decide()): handle:decide on a loaded policy,
-- contract.decide on a table; an error raises, as in testing.key.
function testing.decide(policy, req)
  req = contract.default_req(req)
  local d, err
  if is_handle(policy) then
    d, err = policy:decide(req)
  else
    d, err = contract.decide(policy, req)
  end
  if err then
    misuse(err)
  end
  return d
end

-- testing.mesh{...}: a real proxy and upstreams on loopback (see
-- openmesh.testing.mesh).
function testing.mesh(opts)
  return require("openmesh.testing.mesh").start(opts)
end

return testing
