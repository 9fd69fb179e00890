-- openmesh.contract: the one definition of what a policy is (its shape per
-- kind) and of what its functions may return (docs/POLICIES.md).
--
-- Everything that decides whether a policy is acceptable, or whether one of
-- its answers is, lives here: `openmesh check`, hot reload, the control
-- plane's config endpoint and openmesh.testing all call this module, inside
-- the policy's own sandbox. So it uses only what the sandbox _ENV offers
-- (base functions, string, table, math; no io, no debug) and never raises on
-- a policy's behalf: policy errors come back as `nil, message`.
--
-- Messages name the field path (`routes[2].name`, `examples[1].peers[3].id`)
-- and never the file: the host prefixes that.
local contract = {}

-- The checks on answers, in C, shared with the proxy (bindings/l_checks.c).
-- Captured now: a policy that rewrites its copy of the module later
-- cannot reach these.
local checks = require("openmesh").checks

local KINDS = { "traffic", "fallback", "egress_heuristics" }
local CONFIDENCES = { "high", "low" }

---------------------------------------------------------------------------
-- Showing values and paths in messages
---------------------------------------------------------------------------

-- A string in single quotes, control characters escaped, long ones cut.
local function quote(s)
  if #s > 60 then
    s = s:sub(1, 57) .. "..."
  end
  s = s:gsub("[%c'\\]", function(c)
    return ("\\%d"):format(c:byte())
  end)
  return "'" .. s .. "'"
end

-- How a value appears after "got": numbers and strings by value (NaN and
-- the infinities spelled the same on every platform), the rest by type.
local function show(v)
  local t = type(v)
  if t == "string" then
    return quote(v)
  elseif t == "number" then
    if v ~= v then
      return "nan"
    elseif v == math.huge then
      return "inf"
    elseif v == -math.huge then
      return "-inf"
    end
    return tostring(v)
  elseif t == "nil" or t == "boolean" then
    return tostring(v)
  end
  return t
end

-- "{a, b}": a list of names or ids as the messages print them.
local function show_list(names)
  local parts = {}
  for i = 1, #names do
    parts[i] = tostring(names[i])
  end
  return "{" .. table.concat(parts, ", ") .. "}"
end

local function is_identifier(k)
  return type(k) == "string" and k:find("^[%a_][%w_]*$") ~= nil
end

-- The path of field `key` inside `path` ("" is the policy table itself).
local function join(path, key)
  if math.type(key) == "integer" then
    return path .. "[" .. key .. "]"
  elseif is_identifier(key) then
    return path == "" and key or path .. "." .. key
  end
  return path .. "[" .. show(key) .. "]"
end

local function field_error(path, msg)
  return ("field '%s': %s"):format(path, msg)
end

local function expected(path, what, v)
  return field_error(path, ("%s expected, got %s"):format(what, show(v)))
end

---------------------------------------------------------------------------
-- Small table helpers (raw access only: validation never runs policy code
-- hidden behind __index or __pairs)
---------------------------------------------------------------------------

-- The first key of t that cannot be in an array, in a stable order.
local function first_non_array_key(t)
  local bad = {}
  for k in next, t do
    if math.type(k) ~= "integer" or k < 1 then
      bad[#bad + 1] = k
    end
  end
  table.sort(bad, function(a, b)
    return show(a) < show(b)
  end)
  return bad[1]
end

-- The length n of t when its keys are exactly 1..n; else nil and a reason.
local function sequence_length(t)
  local count, max = 0, 0
  for k in next, t do
    if math.type(k) ~= "integer" or k < 1 then
      return nil, "non-array key " .. show(first_non_array_key(t))
    end
    count = count + 1
    if k > max then
      max = k
    end
  end
  if max ~= count then
    for i = 1, max do
      if rawget(t, i) == nil then
        return nil, "a hole at [" .. i .. "]"
      end
    end
  end
  return count
end

local function set_of(list)
  local set = {}
  for i = 1, #list do
    set[list[i]] = true
  end
  return set
end

-- Same members, ignoring order (both lists are free of duplicates).
local function same_set(a, b)
  if #a ~= #b then
    return false
  end
  local in_b = set_of(b)
  for i = 1, #a do
    if not in_b[a[i]] then
      return false
    end
  end
  return true
end

local function same_list(a, b)
  if #a ~= #b then
    return false
  end
  for i = 1, #a do
    if a[i] ~= b[i] then
      return false
    end
  end
  return true
end

local function shallow_copy(t)
  local c = {}
  if t ~= nil then
    for k, v in next, t do
      c[k] = v
    end
  end
  return c
end

-- Levenshtein distance, for "did you mean" on unknown fields.
local function edit_distance(a, b)
  local prev = {}
  for j = 0, #b do
    prev[j] = j
  end
  for i = 1, #a do
    local cur = { [0] = i }
    for j = 1, #b do
      local cost = a:byte(i) == b:byte(j) and 0 or 1
      cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
    end
    prev = cur
  end
  return prev[#b]
end

local function suggestion(key, known_names)
  if type(key) ~= "string" then
    return ""
  end
  local best, best_d = nil, 3 -- at most two edits away
  for i = 1, #known_names do
    local d = edit_distance(key, known_names[i])
    if d < best_d then
      best, best_d = known_names[i], d
    end
  end
  return best and (" (did you mean '%s'?)"):format(best) or ""
end

---------------------------------------------------------------------------
-- Checkers: function(value, path) -> nil when fine, else a message
---------------------------------------------------------------------------

local function expect(what, ok)
  return function(v, path)
    if not ok(v) then
      return expected(path, what, v)
    end
  end
end

local function is_finite(v)
  return type(v) == "number" and v == v and v > -math.huge and v < math.huge
end

-- 3 and 3.0 are integers; "3", 3.5, NaN and 2^70 are not.
local function as_integer(v)
  return type(v) == "number" and math.tointeger(v) or nil
end

local function integer_at_least(min)
  return expect(("integer >= %d"):format(min), function(v)
    local i = as_integer(v)
    return i ~= nil and i >= min
  end)
end

local function number_above(min)
  return expect(("number > %s"):format(show(min)), function(v)
    return is_finite(v) and v > min
  end)
end

local boolean = expect("boolean", function(v)
  return type(v) == "boolean"
end)

local func = expect("function", function(v)
  return type(v) == "function"
end)

local text = expect("string", function(v)
  return type(v) == "string"
end)

local nonempty = expect("non-empty string", function(v)
  return type(v) == "string" and v ~= ""
end)

local string_or_false = expect("string or false", function(v)
  return type(v) == "string" or v == false
end)

local function one_of(names)
  local quoted = {}
  for i, name in ipairs(names) do
    quoted[i] = quote(name)
  end
  local what = #quoted == 2 and quoted[1] .. " or " .. quoted[2]
    or "one of " .. table.concat(quoted, ", ")
  local allowed = set_of(names)
  return expect(what, function(v)
    return allowed[v] == true
  end)
end

local http_url = expect("http:// or https:// URL", function(v)
  return type(v) == "string" and v:find("^https?://[^%s/]") ~= nil
    and not v:find("%s")
end)

local env_name = expect("environment variable name", function(v)
  return type(v) == "string" and v:find("^[%a_][%w_]*$") ~= nil
end)

local function lua_pattern(v, path)
  if type(v) ~= "string" then
    return expected(path, "Lua pattern (string)", v)
  end
  -- the budgeted matcher's own grammar (bindings/om_lpattern.c): Lua
  -- compiles a pattern while it matches, so a bad one could pass a test
  -- on some text and raise later on other text
  local err = checks.pattern(v)
  if err then
    return field_error(path, "invalid Lua pattern: " .. err)
  end
end

-- An array (keys exactly 1..n) of values accepted by `elem`.
-- opts.min: the least length; opts.unique: a field of the elements whose
-- values must be unique, opts.what naming them in the message.
local function array_of(elem, opts)
  opts = opts or {}
  return function(v, path)
    if type(v) ~= "table" then
      return expected(path, "array", v)
    end
    local n, why = sequence_length(v)
    if not n then
      return field_error(path, "array expected, got a table with " .. why)
    end
    if n < (opts.min or 0) then
      return field_error(path, "non-empty array expected, got an empty one")
    end
    local seen = {}
    for i = 1, n do
      local item = rawget(v, i)
      local err = elem(item, join(path, i))
      if err then
        return err
      end
      if opts.unique then
        local name = rawget(item, opts.unique)
        if seen[name] then
          return field_error(join(join(path, i), opts.unique),
            ("duplicate %s %s"):format(opts.what, quote(name)))
        end
        seen[name] = true
      end
    end
  end
end

-- `vary`: the request fields a traffic policy's decision depends on, as
-- HTTP's Vary names them: lower-case header names (RFC 9110 5.1: field
-- names are tokens; the proxy gives them lower-case), ":method" and
-- ":path" (HTTP/2's pseudo-header spelling). Each at most once.
local function vary_list(v, path)
  if type(v) ~= "table" then
    return expected(path, "array of header names", v)
  end
  local n, why = sequence_length(v)
  if not n then
    return field_error(path, "array expected, got a table with " .. why)
  end
  local seen = {}
  for i = 1, n do
    local name = rawget(v, i)
    local at = join(path, i)
    if type(name) ~= "string" then
      return expected(at, "header name", name)
    end
    if name ~= ":method" and name ~= ":path" and
      (name == "" or name:find("[^%l%d!#$%%&'*+%-.^_`|~]")) then
      return field_error(at, ("%s is not a lower-case header name, \":method\" or \":path\""):format(quote(name)))
    end
    if seen[name] then
      return field_error(at, ("duplicate name %s"):format(quote(name)))
    end
    seen[name] = true
  end
end

-- A table with non-empty string keys (each also passing `key_rule`, which
-- returns nil or a message) and values accepted by `value`.
local function map_of(value, key_rule)
  return function(v, path)
    if type(v) ~= "table" then
      return expected(path, "table", v)
    end
    for k, item in next, v do
      if type(k) ~= "string" or k == "" then
        return field_error(join(path, k), "keys must be non-empty strings")
      end
      local err = key_rule and key_rule(k)
      if err then
        return field_error(join(path, k), err)
      end
      err = value(item, join(path, k))
      if err then
        return err
      end
    end
  end
end

-- A table with the given fields and no others. fields: an array of
-- { name, checker, required = bool }; `rule(v, path)`, when given, runs
-- after every field passed (for constraints across fields).
local function record(fields, rule)
  local known, names = {}, {}
  for i, f in ipairs(fields) do
    known[f[1]] = true
    names[i] = f[1]
  end
  return function(v, path)
    if type(v) ~= "table" then
      return expected(path, "table", v)
    end
    local unknown = {}
    for k in next, v do
      if not known[k] then
        unknown[#unknown + 1] = k
      end
    end
    if #unknown > 0 then
      table.sort(unknown, function(a, b)
        return tostring(a) < tostring(b)
      end)
      return ("unknown field '%s'%s"):format(join(path, unknown[1]),
        suggestion(unknown[1], names))
    end
    for _, f in ipairs(fields) do
      local value = rawget(v, f[1])
      if value ~= nil or f.required then
        local err = f[2](value, join(path, f[1]))
        if err then
          return err
        end
      end
    end
    return rule and rule(v, path)
  end
end

---------------------------------------------------------------------------
-- Example inputs: shapes and defaults
---------------------------------------------------------------------------

local function lower_case(name)
  if name:lower() ~= name then
    return "header names must be lower-case"
  end
end

local req_shape = record {
  { "service", text },
  { "method", text },
  { "path", text },
  { "headers", map_of(text, lower_case) },
  { "metadata", map_of(text) },
}

local peer_shape = record {
  { "id", nonempty, required = true },
  { "url", text },
  { "weight", number_above(0) },
  { "zone", text },
  { "metadata", map_of(text) },
}

local failure_shape = record {
  { "route", text },
  { "status", integer_at_least(0) },
  { "class", text },
}

local ctx_shape = record {
  { "agent", text },
  { "context", one_of { "interactive", "async" } },
  { "channel", text },
  { "failed", array_of(failure_shape) },
  -- what a heuristics check may compare the reply with
  { "system_prompt", text },
  { "question", text },
}

-- A request as an example or a spec writes it, with the documented
-- defaults filled in. Always a fresh table: policies may mutate theirs.
function contract.default_req(t)
  t = t or {}
  return {
    service = t.service or "example",
    method = t.method or "GET",
    path = t.path or "/",
    headers = shallow_copy(t.headers),
    metadata = shallow_copy(t.metadata),
  }
end

-- A peer with the documented defaults filled in (a fresh table).
function contract.default_peer(t)
  t = t or {}
  return {
    id = t.id,
    url = t.url or "http://127.0.0.1:1/",
    weight = t.weight or 1,
    zone = t.zone,
    metadata = shallow_copy(t.metadata),
  }
end

-- A fallback / egress context with the defaults examples use.
function contract.default_ctx(t)
  t = t or {}
  local failed = {}
  for i, f in ipairs(t.failed or {}) do
    failed[i] = shallow_copy(f)
  end
  return {
    agent = t.agent or "example",
    context = t.context or "interactive",
    channel = t.channel or "example",
    failed = failed,
    system_prompt = t.system_prompt, -- nil: checks that need it pass
    question = t.question,
  }
end

local function default_peers(list)
  local peers = {}
  for i, p in ipairs(list or {}) do
    peers[i] = contract.default_peer(p)
  end
  return peers
end

-- Shape checks for the example builders of openmesh.testing (same rules,
-- same messages as inside a policy's examples).
contract.check_req = function(t, path)
  return req_shape(t, path or "req")
end
contract.check_peer = function(t, path)
  return peer_shape(t, path or "peer")
end
contract.check_ctx = function(t, path)
  return ctx_shape(t, path or "ctx")
end

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

-- contract.subset(policy, req, peers) -> array of peers | nil, message
-- Calls policy.subset and accepts its answer only if it is an array of the
-- very peer tables it was given, without duplicates (an empty array is
-- fine). Never widens: any other answer is an error for this request.
-- contract.visible_req(policy, req) -> what the policy sees of req. A
-- policy that declares `vary` sees only those fields (and the service):
-- its decision is then a function of them, so the proxy may reuse it for
-- every request that agrees on them. Reading anything else is an error,
-- not a quiet nil: a decision that depended on it would be reused for
-- requests that differ in it. A declared header the request lacks reads as
-- nil. Without `vary`: req itself. The view is the proxy's own
-- (om.checks.vary_view, bindings/om_policy_check.c).
function contract.visible_req(policy, req)
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

function contract.subset(policy, req, peers)
  req = contract.visible_req(policy, req)
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

-- contract.key(policy, req) -> string | nil | nil, message
-- A policy without key() has no key (the proxy then uses x-openmesh-key).
function contract.key(policy, req)
  local fn = rawget(policy, "key")
  if fn == nil then
    return nil
  end
  local ok, key = vary_pcall(policy, fn, contract.visible_req(policy, req))
  if not ok then
    return nil, raised("key", key)
  end
  local err = checks.key(key)
  if err then
    return nil, err
  end
  return key
end

local function route_names(policy)
  local names, routes = {}, rawget(policy, "routes") or {}
  for i = 1, rawlen(routes) do
    names[i] = rawget(rawget(routes, i), "name")
  end
  return names
end

-- contract.order(policy, ctx) -> array of route names | nil, message
-- Without an order function: the routes as listed. With one: its answer,
-- which must name defined routes, each at most once, and at least one
-- (om.checks.order, the same check the gateway applies).
function contract.order(policy, ctx)
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

-- contract.evaluate(policy, text [, ctx]) -> result | nil, message
-- result = { flagged = bool, confidence = "high" | "low" | nil,
--            checks = { names that matched, in policy order } }
-- confidence is "high" when any matching check is high. ctx defaults to
-- contract.default_ctx().
function contract.evaluate(policy, text, ctx)
  if type(text) ~= "string" then
    return nil, ("evaluate: text must be a string, got %s"):format(show(text))
  end
  ctx = ctx or contract.default_ctx()
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

-- contract.holding_line(policy, agent) -> the agent's holding line, else
-- the default one.
function contract.holding_line(policy, agent)
  local lines = rawget(policy, "holding_lines") or {}
  return (agent ~= nil and rawget(lines, agent)) or rawget(lines, "default")
end

-- contract.handoff(policy, agent) -> the agent's handoff target or nil.
function contract.handoff(policy, agent)
  local handoff = rawget(policy, "handoff")
  return handoff and agent ~= nil and rawget(handoff, agent) or nil
end

-- The policy name: its `name` field, else the file name without
-- directories and ".lua" (a chunk name's leading '@' or '=' dropped).
function contract.name(policy, file)
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

-- contract.settings(policy) -> a copy of the policy's data: every field
-- except functions and `examples` (what om.policy's p:settings() gives).
-- For a validated policy (no cycles).
function contract.settings(policy)
  local s = copy_data(policy)
  s.examples = nil
  return s
end

---------------------------------------------------------------------------
-- Examples: running them and comparing with what they expect
---------------------------------------------------------------------------

local function ids_of(peers)
  local ids = {}
  for i = 1, #peers do
    ids[i] = peers[i].id
  end
  return ids
end

local function run_traffic_example(policy, ex)
  if ex.expect ~= nil then
    local got, err = contract.subset(policy, contract.default_req(ex.req), default_peers(ex.peers))
    if not got then
      return err
    end
    local ids = ids_of(got)
    if not same_set(ids, ex.expect) then
      return ("subset returned %s, expected %s%s"):format(show_list(ids), show_list(ex.expect),
        rawget(policy, "vary") and " (the policy declares vary: it sees only the service and those fields)" or "")
    end
  end
  if ex.expect_key ~= nil then
    local key, err = contract.key(policy, contract.default_req(ex.req))
    if err then
      return err
    end
    local want = ex.expect_key or nil
    if key ~= want then
      return ("key returned %s, expected %s"):format(show(key), show(want))
    end
  end
end

local function run_fallback_example(policy, ex)
  local names, err = contract.order(policy, contract.default_ctx(ex.ctx))
  if not names then
    return err
  end
  if not same_list(names, ex.expect) then
    return ("order returned %s, expected %s"):format(show_list(names), show_list(ex.expect))
  end
end

local function run_egress_example(policy, ex)
  local got, err = contract.evaluate(policy, ex.text, contract.default_ctx(ex.ctx))
  if not got then
    return err
  end
  local want = ex.expect
  if got.flagged ~= want.flagged then
    return ("evaluate returned flagged = %s (checks %s), expected flagged = %s")
      :format(tostring(got.flagged), show_list(got.checks), tostring(want.flagged))
  end
  if want.confidence ~= nil and got.confidence ~= want.confidence then
    return ("evaluate returned confidence %s (checks %s), expected %s")
      :format(show(got.confidence), show_list(got.checks), show(want.confidence))
  end
  if want.checks ~= nil and not same_set(got.checks, want.checks) then
    return ("evaluate matched checks %s, expected %s"):format(show_list(got.checks), show_list(want.checks))
  end
end

---------------------------------------------------------------------------
-- The shapes of the three kinds
---------------------------------------------------------------------------

-- Constraints inside one traffic example that no field alone can check.
local function traffic_example_rule(ex, path)
  if ex.expect == nil and ex.expect_key == nil then
    return field_error(path, "an example needs 'expect' or 'expect_key'")
  end
  local ids = {}
  for i, p in ipairs(ex.peers or {}) do
    if ids[p.id] then
      return field_error(join(join(join(path, "peers"), i), "id"), "duplicate peer id " .. quote(p.id))
    end
    ids[p.id] = true
  end
  local seen = {}
  for i, id in ipairs(ex.expect or {}) do
    local where = join(join(path, "expect"), i)
    if not ids[id] then
      return field_error(where, ("id %s is not among the example's peers"):format(quote(id)))
    elseif seen[id] then
      return field_error(where, "duplicate id " .. quote(id))
    end
    seen[id] = true
  end
end

local traffic_example = record({
  { "description", text },
  { "req", req_shape },
  { "peers", array_of(peer_shape) },
  { "expect", array_of(nonempty) },
  { "expect_key", string_or_false },
}, traffic_example_rule)

local fallback_example = record {
  { "description", text },
  { "ctx", ctx_shape },
  { "expect", array_of(nonempty, { min = 1 }), required = true },
}

local egress_example = record {
  { "description", text },
  { "text", text, required = true },
  { "ctx", ctx_shape },
  { "expect", record {
    { "flagged", boolean, required = true },
    { "confidence", one_of(CONFIDENCES) },
    { "checks", array_of(nonempty) },
  }, required = true },
}

local route = record {
  { "name", nonempty, required = true },
  { "provider", one_of { "openai", "anthropic" }, required = true },
  { "base_url", http_url, required = true },
  { "model", nonempty, required = true },
  { "api_key_env", env_name },
  { "attempt_timeout_ms", number_above(0) },
  { "first_byte_timeout_ms", number_above(0) },
  { "context_tokens", integer_at_least(1) },
}

local MATCHERS = { "pattern", "substrings", "check" }

local function exactly_one_matcher(check, path)
  local present = {}
  for _, m in ipairs(MATCHERS) do
    if rawget(check, m) ~= nil then
      present[#present + 1] = "'" .. m .. "'"
    end
  end
  if #present ~= 1 then
    return field_error(path, ("exactly one of 'pattern', 'substrings' or 'check' expected, got %s")
      :format(#present == 0 and "none" or table.concat(present, " and ")))
  end
end

local check = record({
  { "name", nonempty, required = true },
  { "description", text },
  { "pattern", lua_pattern },
  { "substrings", array_of(nonempty, { min = 1 }) },
  { "check", func },
  { "confidence", one_of(CONFIDENCES), required = true },
}, exactly_one_matcher)

local function has_default(lines, path)
  return nonempty(rawget(lines, "default"), join(path, "default"))
end

-- Each kind: its fields (common ones first) and how one example runs.
local function common(examples)
  return {
    { "kind", one_of(KINDS), required = true },
    { "name", nonempty },
    { "description", text },
    { "examples", array_of(examples) },
  }
end

local function kind_spec(example, run, fields, rule)
  local all = common(example)
  for _, f in ipairs(fields) do
    all[#all + 1] = f
  end
  return { shape = record(all, rule), run = run }
end

-- The quality gate of a fallback policy (opt-in per agent): the judge is
-- one of the policy's own routes, so it gets the same timeouts and keys.
local quality_gate = record {
  { "agents", array_of(nonempty) },
  { "judge_route", nonempty, required = true },
  { "judge_timeout_ms", number_above(0) },
}

local function gate_names_a_route(policy, _path)
  local gate = rawget(policy, "quality_gate")
  if gate == nil then
    return nil
  end
  local name = rawget(gate, "judge_route")
  local names = route_names(policy)
  for i = 1, #names do
    if names[i] == name then
      return nil
    end
  end
  return field_error("quality_gate.judge_route",
    ("unknown route %s (routes: %s)"):format(quote(name), show_list(names)))
end

-- A cooldown cap below the first period would make the cap a lie.
local function cooldown_cap_covers_period(policy, _path)
  local base, cap = rawget(policy, "cooldown_ms"), rawget(policy, "cooldown_max_ms")
  base = base or 2000
  cap = cap or 60000
  if cap < base then
    return field_error("cooldown_max_ms",
      ("%s is below cooldown_ms (%s)"):format(show(cap), show(base)))
  end
  return nil
end

local function fallback_rule(policy, path)
  return gate_names_a_route(policy, path) or cooldown_cap_covers_period(policy, path)
end

local KIND_SPECS = {
  traffic = kind_spec(traffic_example, run_traffic_example, {
    { "subset", func, required = true },
    { "key", func },
    { "max_inflight", integer_at_least(1) },
    { "max_queue", integer_at_least(0) },
    { "adaptive", boolean },
    { "deadline_ms", number_above(0) },
    { "per_try_timeout_ms", number_above(0) },
    { "retries", integer_at_least(0) },
    { "retry_non_idempotent", boolean },
    { "retry_429", boolean },
    { "vary", vary_list },
    { "circuit", record({
      { "failures", integer_at_least(1) },
      { "cooldown_ms", number_above(0) },
      { "max_cooldown_ms", number_above(0) },
    }, function(v, path)
      local cd, max = rawget(v, "cooldown_ms"), rawget(v, "max_cooldown_ms")
      if cd and max and max < cd then
        return field_error(join(path, "max_cooldown_ms"),
          ("must be >= cooldown_ms (%s), got %s"):format(show(cd), show(max)))
      end
    end) },
  }),
  fallback = kind_spec(fallback_example, run_fallback_example, {
    { "routes", array_of(route, { min = 1, unique = "name", what = "route name" }), required = true },
    { "order", func },
    { "max_attempts", integer_at_least(1) },
    { "per_wait_ceiling_ms", number_above(0) },
    { "deadline_ms", number_above(0) },
    { "backoff_base_ms", number_above(0) },
    { "backoff_cap_ms", number_above(0) },
    -- Layer C: an async turn that failed is retried every interval until
    -- it is this old; an interactive one keeps trying for commitment_ms
    -- after its holding line.
    { "pending_retry_interval_ms", number_above(0) },
    { "pending_max_age_ms", number_above(0) },
    { "commitment_ms", number_above(0) },
    -- Route cooldown: after this many consecutive health failures a route
    -- is skipped for cooldown_ms, doubling per repeat up to cooldown_max_ms
    -- (defaults 3, 2000, 60000: one outage should not cost every turn its
    -- first attempt, and a recovered route should be back within a minute).
    { "cooldown_after_failures", integer_at_least(1) },
    { "cooldown_ms", number_above(0) },
    { "cooldown_max_ms", number_above(0) },
    { "quality_gate", quality_gate },
  }, fallback_rule),
  egress_heuristics = kind_spec(egress_example, run_egress_example, {
    { "checks", array_of(check, { unique = "name", what = "check name" }), required = true },
    { "holding_lines", function(v, path)
      return map_of(nonempty)(v, path) or has_default(v, path)
    end, required = true },
    { "handoff", map_of(nonempty) },
    -- what the user is told when the gateway hands the conversation off
    { "handoff_lines", map_of(nonempty) },
  }),
}

-- contract.validate(policy [, file]) -> true | nil, message
-- The shape of the table for its kind (unknown fields, types, ranges,
-- required fields, unique names, compilable patterns), then every example,
-- in order; the first problem found is the message. The file name the
-- host passes is not needed: the host prefixes it to the message itself.
function contract.validate(policy, _file)
  if type(policy) ~= "table" then
    return nil, ("policy: table expected (a policy file returns a table), got %s"):format(show(policy))
  end
  local spec = KIND_SPECS[rawget(policy, "kind")]
  if not spec then
    return nil, one_of(KINDS)(rawget(policy, "kind"), "kind")
  end
  local err = spec.shape(policy, "")
  if err then
    return nil, err
  end
  local examples = rawget(policy, "examples") or {}
  for i = 1, #examples do
    err = spec.run(policy, examples[i])
    if err then
      return nil, ("example %d: %s"):format(i, err)
    end
  end
  return true
end

-- Exported for openmesh.testing and the specs.
contract.subset_error = subset_error
contract.pattern_error = checks.pattern
contract.literal_prefix = checks.pattern_prefix
contract.pattern_found = pattern_found
contract.show = show
contract.show_list = show_list

return contract
