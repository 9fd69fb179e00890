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

-- testing.clock([start_ms]) -> a fake clock for code that takes `now`:
-- clock.now() -> ms; clock.advance(ms) -> the new now. Both also work as
-- methods (clock:now(), clock:advance(5)).
function testing.clock(start_ms)
  local now = start_ms or 0
  local clock = {}
  function clock.now()
    return now
  end
  function clock.advance(a, b)
    local ms = a == clock and b or a
    if type(ms) ~= "number" or ms < 0 then
      misuse("clock.advance: a number of milliseconds >= 0 expected")
    end
    now = now + ms
    return now
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
function testing.load(path, opts)
  local args = { path = path }
  for k, v in pairs(opts or {}) do
    args[k] = v
  end
  return require("openmesh").policy.load(args)
end

return testing
