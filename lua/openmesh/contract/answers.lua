-- openmesh.contract.answers: the runtime semantics: what the host calls for
-- every request or turn, and the checks on the answers. One part of
-- openmesh.contract (the facade, lua/openmesh/contract.lua, says what the
-- whole does); like it, it uses only what the sandbox _ENV offers.

local checks = require("openmesh").checks -- bindings/l_checks.c
local messages = require "openmesh.contract.messages"
local inputs = require "openmesh.contract.inputs"

local quote = messages.quote
local show = messages.show

local M = {}

---------------------------------------------------------------------------
-- The runtime semantics (what the host calls for every request / turn)
---------------------------------------------------------------------------

local function raised(what, err)
  return ("%s raised: %s"):format(what, tostring(err))
end

-- Why `result` is not a subset of `peers` (nil when it is one): an array
-- of the very peer tables offered, without duplicates. The rule and its
-- words are the proxy's own (bindings/om_policy_check.c).
local function subset_error(result, peers)
  return checks.subset(result, peers)
end

-- M.subset(policy, req, peers) -> array of peers | nil, message
-- Calls policy.subset and accepts its answer only if it is an array of the
-- very peer tables it was given, without duplicates (an empty array is
-- fine). Never widens: any other answer is an error for this request.
-- M.visible_req(policy, req) -> what the policy sees of req. A
-- policy that declares `vary` sees only those fields (and the service):
-- its decision is then a function of them, so the proxy may reuse it for
-- every request that agrees on them. Reading anything else is an error,
-- not a quiet nil: a decision that depended on it would be reused for
-- requests that differ in it. A declared header the request lacks reads as
-- nil. Without `vary`: req itself. The view is the proxy's own
-- (om.checks.vary_view, bindings/om_policy_check.c).
function M.visible_req(policy, req)
  local vary = rawget(policy, "vary")
  if vary == nil or type(req) ~= "table" then
    return req
  end
  return checks.vary_view(vary, req)
end

-- vary_pcall(policy, fn, ...) -> pcall(fn, ...), with chance and the clock
-- (math.random, math.randomseed, os.time, os.clock) raising for the length
-- of the call when the policy declares vary, as bindings/om_policy.c seals
-- them in the host (same message). There the policy's own _ENV is sealed
-- already and this reaches only the library's copies; in a plain Lua that
-- loaded the policy table itself (openmesh.testing on a table), these are
-- the tables the policy calls through.
local sealed = { { "math", "random" }, { "math", "randomseed" }, { "os", "time" }, { "os", "clock" } }

local function vary_pcall(policy, fn, ...)
  if type(rawget(policy, "vary")) ~= "table" then
    return pcall(fn, ...)
  end
  local saved = {}
  for i, f in ipairs(sealed) do
    local lib = _ENV[f[1]]
    if type(lib) == "table" then
      saved[i] = rawget(lib, f[2])
      rawset(lib, f[2], function()
        error(("%s.%s is not available to a policy that declares vary (its decisions are reused: "
          .. "they may depend only on the declared fields and the peers)"):format(f[1], f[2]), 2)
      end)
    end
  end
  local res = table.pack(pcall(fn, ...))
  for i, f in ipairs(sealed) do
    local lib = _ENV[f[1]]
    if type(lib) == "table" then
      rawset(lib, f[2], saved[i])
    end
  end
  return table.unpack(res, 1, res.n)
end

function M.subset(policy, req, peers)
  req = M.visible_req(policy, req)
  local ok, result = vary_pcall(policy, rawget(policy, "subset"), req, peers)
  if not ok then
    return nil, raised("subset", result)
  end
  local err = subset_error(result, peers)
  if err then
    return nil, err
  end
  return result
end

-- M.authorize(policy, req) -> true | false, reason | nil, message
-- Whether the policy lets the call go on to key and subset: true without
-- authorize(); else its answer, which must be true alone, or false and an
-- optional reason of at most 200 bytes of printable ASCII ("" when it gave
-- none; om.checks.authorize, the check the proxy applies). Any other
-- answer, or a raise, is an error for this request (the proxy's 500
-- policy_error), never an allowed call.
function M.authorize(policy, req)
  local fn = rawget(policy, "authorize")
  if fn == nil then
    return true
  end
  local res = table.pack(vary_pcall(policy, fn, M.visible_req(policy, req)))
  if not res[1] then
    return nil, raised("authorize", res[2])
  end
  return checks.authorize(res[2], res[3])
end

-- M.key(policy, req) -> string | nil | nil, message
-- A policy without key() has no key (the proxy then uses x-openmesh-key).
function M.key(policy, req)
  local fn = rawget(policy, "key")
  if fn == nil then
    return nil
  end
  local ok, key = vary_pcall(policy, fn, M.visible_req(policy, req))
  if not ok then
    return nil, raised("key", key)
  end
  local err = checks.key(key)
  if err then
    return nil, err
  end
  return key
end

-- M.decide(policy, req) -> table | nil | nil, message
-- What the proxy applies to this request on top of the service's fields:
-- nil without decide() or when it answers nil; else its table, checked as
-- the proxy checks it (om.checks.decision, bindings/om_policy_check.c):
-- known fields, values in range, header edits the proxy allows. Any other
-- answer, or a raise, is an error for this request (the proxy's 500).
function M.decide(policy, req)
  local fn = rawget(policy, "decide")
  if fn == nil then
    return nil
  end
  local ok, d = vary_pcall(policy, fn, M.visible_req(policy, req))
  if not ok then
    return nil, raised("decide", d)
  end
  local err = checks.decision(d)
  if err then
    return nil, err
  end
  return d
end

local function route_names(policy)
  local names, routes = {}, rawget(policy, "routes") or {}
  for i = 1, rawlen(routes) do
    names[i] = rawget(rawget(routes, i), "name")
  end
  return names
end

-- M.order(policy, ctx) -> array of route names | nil, message
-- Without an order function: the routes as listed. With one: its answer,
-- which must name defined routes, each at most once, and at least one
-- (om.checks.order, the same check the gateway applies).
function M.order(policy, ctx)
  local defined = route_names(policy)
  local fn = rawget(policy, "order")
  if fn == nil then
    return defined
  end
  local ok, names = pcall(fn, ctx)
  if not ok then
    return nil, raised("order", names)
  end
  local err = checks.order(names, defined)
  if err then
    return nil, err
  end
  return names
end

-- Per pattern: its literal prefix and the anchored form ("^" .. p).
local prefixes = {}

-- string.find(text, pattern) ~= nil, faster: a pattern that starts with a
-- literal can only match where that literal occurs, so find it with a
-- plain search (memchr-fast) and try the pattern anchored there, instead
-- of letting the matcher try every position of the text. Same answer:
-- every match starts at an occurrence of the literal, and all of them are
-- tried in order. (Frontiers are zero-width and read the text before the
-- start position even with an init, lstrlib.c str_find_aux.)
local function pattern_found(text, pattern)
  local pre = prefixes[pattern]
  if pre == nil then
    local lit = checks.pattern_prefix(pattern) -- om_lpattern.c
    pre = { lit = lit, anchored = "^" .. pattern }
    prefixes[pattern] = pre
  end
  local lit = pre.lit
  if lit == "" then
    return string.find(text, pattern) ~= nil
  end
  local find, anchored, init = string.find, pre.anchored, 1
  while true do
    local at = find(text, lit, init, true)
    if not at then
      return false
    end
    if find(text, anchored, at) then
      return true
    end
    init = at + 1
  end
end

-- Whether one check matches: true/false, or nil and a message.
local function check_matches(check, text, ctx)
  local pattern, substrings, fn = rawget(check, "pattern"), rawget(check, "substrings"), rawget(check, "check")
  if pattern then
    local ok, found = pcall(pattern_found, text, pattern)
    if not ok then
      return nil, raised(("check %s"):format(quote(check.name)), found)
    end
    return found
  elseif substrings then
    for i = 1, #substrings do
      if text:find(substrings[i], 1, true) then
        return true
      end
    end
    return false
  end
  local ok, hit = pcall(fn, text, ctx)
  if not ok then
    return nil, raised(("check %s"):format(quote(check.name)), hit)
  end
  return not not hit
end

-- M.evaluate(policy, text [, ctx]) -> result | nil, message
-- result = { flagged = bool, confidence = "high" | "low" | nil,
--            checks = { names that matched, in policy order } }
-- confidence is "high" when any matching check is high. ctx defaults to
-- inputs.default_ctx().
function M.evaluate(policy, text, ctx)
  if type(text) ~= "string" then
    return nil, ("evaluate: text must be a string, got %s"):format(show(text))
  end
  ctx = ctx or inputs.default_ctx()
  local checks, matched, high = rawget(policy, "checks") or {}, {}, false
  for i = 1, rawlen(checks) do
    local check = rawget(checks, i)
    local hit, err = check_matches(check, text, ctx)
    if err then
      return nil, err
    end
    if hit then
      matched[#matched + 1] = check.name
      high = high or check.confidence == "high"
    end
  end
  local flagged = #matched > 0
  return {
    flagged = flagged,
    confidence = flagged and (high and "high" or "low") or nil,
    checks = matched,
  }
end

-- M.holding_line(policy, agent) -> the agent's holding line, else
-- the default one.
function M.holding_line(policy, agent)
  local lines = rawget(policy, "holding_lines") or {}
  return (agent ~= nil and rawget(lines, agent)) or rawget(lines, "default")
end

-- M.handoff(policy, agent) -> the agent's handoff target or nil.
function M.handoff(policy, agent)
  local handoff = rawget(policy, "handoff")
  return handoff and agent ~= nil and rawget(handoff, agent) or nil
end

-- The policy name: its `name` field, else the file name without
-- directories and ".lua" (a chunk name's leading '@' or '=' dropped).
function M.name(policy, file)
  local name = type(policy) == "table" and rawget(policy, "name")
  if name then
    return name
  end
  file = tostring(file or "policy"):gsub("^[@=]", "")
  return (file:match("([^/]*)$"):gsub("%.lua$", ""))
end

-- Plain data only: functions dropped at any depth.
local function copy_data(v)
  if type(v) ~= "table" then
    return v
  end
  local c = {}
  for k, item in next, v do
    if type(item) ~= "function" then
      c[k] = copy_data(item)
    end
  end
  return c
end

-- M.settings(policy) -> a copy of the policy's data: every field
-- except functions and `examples` (what om.policy's p:settings() gives).
-- For a validated policy (no cycles).
function M.settings(policy)
  local s = copy_data(policy)
  s.examples = nil
  return s
end

-- What the other parts use.
M.subset_error = subset_error
M.route_names = route_names
M.pattern_found = pattern_found

return M
