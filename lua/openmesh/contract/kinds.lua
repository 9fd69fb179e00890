-- openmesh.contract.kinds: the examples (running them and comparing with what
-- they expect) and the shape of each policy kind. One part of
-- openmesh.contract (the facade, lua/openmesh/contract.lua, says what the
-- whole does); like it, it uses only what the sandbox _ENV offers.

local messages = require "openmesh.contract.messages"
local checkers = require "openmesh.contract.checkers"
local inputs = require "openmesh.contract.inputs"
local answers = require "openmesh.contract.answers"

local quote = messages.quote
local show = messages.show
local show_list = messages.show_list
local join = messages.join
local field_error = messages.field_error
local expected = messages.expected
local sequence_length = messages.sequence_length
local same_set = messages.same_set
local same_list = messages.same_list
local integer_at_least = checkers.integer_at_least
local number_above = checkers.number_above
local number_within = checkers.number_within
local number_from = checkers.number_from
local boolean = checkers.boolean
local func = checkers.func
local text = checkers.text
local nonempty = checkers.nonempty
local string_or_false = checkers.string_or_false
local one_of = checkers.one_of
local http_url = checkers.http_url
local env_name = checkers.env_name
local lua_pattern = checkers.lua_pattern
local array_of = checkers.array_of
local vary_list = checkers.vary_list
local map_of = checkers.map_of
local record = checkers.record
local req_shape = inputs.req_shape
local peer_shape = inputs.peer_shape
local ctx_shape = inputs.ctx_shape
local default_peers = inputs.default_peers
local route_names = answers.route_names
local checks = require("openmesh").checks -- bindings/l_checks.c

local M = {}

local KINDS = { "traffic", "fallback", "egress_heuristics" }
local CONFIDENCES = { "high", "low" }

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

-- A decision as the messages show it: its fields in name order,
-- headers as a table of name = value (false: removed).
local function show_decision(d)
  if type(d) ~= "table" then
    return show(d)
  end
  local names, parts = {}, {}
  for k in pairs(d) do
    names[#names + 1] = tostring(k)
  end
  table.sort(names)
  for _, k in ipairs(names) do
    local v = d[k]
    if k == "headers" and type(v) == "table" then
      local hs = {}
      for hk, hv in pairs(v) do
        hs[#hs + 1] = ("[%s] = %s"):format(show(hk), show(hv))
      end
      table.sort(hs)
      parts[#parts + 1] = "headers = {" .. table.concat(hs, ", ") .. "}"
    else
      parts[#parts + 1] = ("%s = %s"):format(k, show(v))
    end
  end
  return "{" .. table.concat(parts, ", ") .. "}"
end

-- Two decisions agree: the same fields, equal values, the same header
-- edits (names compared case-insensitively, as the proxy applies them).
local function same_decision(a, b)
  if a == nil or b == nil then
    return a == b
  end
  for k, v in pairs(a) do
    if k ~= "headers" and b[k] ~= v then
      return false
    end
  end
  for k in pairs(b) do
    if a[k] == nil then
      return false
    end
  end
  local ha, hb = {}, {}
  for k, v in pairs(a.headers or {}) do
    ha[k:lower()] = v
  end
  for k, v in pairs(b.headers or {}) do
    hb[k:lower()] = v
  end
  for k, v in pairs(ha) do
    if hb[k] ~= v then
      return false
    end
  end
  for k in pairs(hb) do
    if ha[k] == nil then
      return false
    end
  end
  return true
end

local function run_traffic_example(policy, ex)
  if ex.expect_authorized ~= nil then
    local ok, reason = answers.authorize(policy, inputs.default_req(ex.req))
    if ok == nil then
      return reason
    end
    if ok ~= ex.expect_authorized then
      return ("authorize returned %s%s, expected %s"):format(tostring(ok),
        ok and "" or (reason ~= "" and " (reason " .. quote(reason) .. ")" or ""),
        tostring(ex.expect_authorized))
    end
    if ex.expect_reason ~= nil and reason ~= ex.expect_reason then
      return ("authorize gave the reason %s, expected %s"):format(quote(reason), quote(ex.expect_reason))
    end
  end
  if ex.expect ~= nil then
    local got, err = answers.subset(policy, inputs.default_req(ex.req), default_peers(ex.peers))
    if not got then
      return err
    end
    local ids = ids_of(got)
    if not same_set(ids, ex.expect) then
      return ("subset returned %s, expected %s%s"):format(show_list(ids), show_list(ex.expect),
        rawget(policy, "vary") and " (the policy declares vary: it sees only the service and those fields)" or "")
    end
  end
  if ex.expect_decision ~= nil then
    local d, err = answers.decide(policy, inputs.default_req(ex.req))
    if err then
      return err
    end
    local want = ex.expect_decision or nil
    if not same_decision(d, want) then
      return ("decide returned %s, expected %s"):format(show_decision(d), show_decision(want))
    end
  end
  if ex.expect_key ~= nil then
    local key, err = answers.key(policy, inputs.default_req(ex.req))
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
  local names, err = answers.order(policy, inputs.default_ctx(ex.ctx))
  if not names then
    return err
  end
  if not same_list(names, ex.expect) then
    return ("order returned %s, expected %s"):format(show_list(names), show_list(ex.expect))
  end
end

local function run_egress_example(policy, ex)
  local got, err = answers.evaluate(policy, ex.text, inputs.default_ctx(ex.ctx))
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
  if ex.expect == nil and ex.expect_key == nil and ex.expect_authorized == nil and ex.expect_decision == nil then
    return field_error(path, "an example needs 'expect', 'expect_key', 'expect_decision' or 'expect_authorized'")
  end
  if ex.expect_reason ~= nil and ex.expect_authorized ~= false then
    return field_error(join(path, "expect_reason"), "goes with expect_authorized = false")
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
  -- what decide(req) answers: a decision table, or false for none (nil)
  { "expect_decision", function(v, path)
    if v == false then
      return nil
    end
    if type(v) ~= "table" then
      return field_error(path, ("must be a decision table or false, got %s"):format(show(v)))
    end
    local err = checks.decision(v)
    if err then
      return field_error(path, (err:gsub("^decide returned ", "")))
    end
  end },
  -- what authorize(req) answers: true, or false and (optionally) the reason
  { "expect_authorized", boolean },
  { "expect_reason", text },
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

-- A retry budget (Finagle's, in the unit chosen): retries spend at most
-- `ratio` of what the successful calls spent over `window_ms`, plus a
-- reserve of `min_per_s` units per second. Tokens and cost make a retry
-- storm bounded in what it costs, not only in how many calls it makes.
local retry_budget = record {
  { "unit", one_of { "attempts", "tokens", "cost" }, required = true },
  { "ratio", number_from(0, 100) },
  { "min_per_s", number_from(0, 1000000) },
  { "window_ms", number_within(0, 3600000) },
}

-- USD per million tokens, as the providers publish them.
local price = record {
  { "input", number_from(0, 1000000), required = true },
  { "output", number_from(0, 1000000), required = true },
  { "cached_input", number_from(0, 1000000) },
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
  { "retry_budget", retry_budget },
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

-- A caller may shorten the deadline, never raise it past max_deadline_ms;
-- a cap below the service's own deadline_ms (10000 when omitted) would
-- give a caller who asks for more less than one who asks for nothing.
local function max_deadline_covers_deadline(policy, _path)
  local max = rawget(policy, "max_deadline_ms")
  local deadline = rawget(policy, "deadline_ms")
  if max ~= nil and max < (deadline or 10000) then
    return field_error("max_deadline_ms", ("must be >= deadline_ms (%s), got %s")
      :format(deadline and show(deadline) or "10000 when omitted", show(max)))
  end
  return nil
end

-- Every route an alias names is one of the policy's routes.
local function aliases_name_routes(policy, _path)
  local models = rawget(policy, "models")
  if type(models) ~= "table" then
    return nil
  end
  local names, known = route_names(policy), {}
  for i = 1, #names do
    known[names[i]] = true
  end
  for alias, chain in next, models do
    for i = 1, #chain do
      if not known[chain[i]] then
        return field_error(("models.%s[%d]"):format(alias, i),
          ("unknown route %s (routes: %s)"):format(quote(chain[i]), show_list(names)))
      end
    end
  end
  return nil
end

-- Every priced model is some route's model (a typo would price nothing),
-- and a route budgeted in cost has a price for its model.
local function prices_cover_cost_budgets(policy, _path)
  local prices, routes = rawget(policy, "prices"), rawget(policy, "routes")
  local models, list = {}, {}
  for i = 1, #routes do
    local m = rawget(routes[i], "model")
    if not models[m] then
      models[m] = true
      list[#list + 1] = m
    end
  end
  if type(prices) == "table" then
    for model in next, prices do
      if not models[model] then
        return field_error("prices." .. tostring(model),
          ("no route has model %s (models: %s)"):format(quote(model), show_list(list)))
      end
    end
  end
  local default = rawget(policy, "retry_budget")
  for i = 1, #routes do
    local b = rawget(routes[i], "retry_budget") or default
    local m = rawget(routes[i], "model")
    if b ~= nil and rawget(b, "unit") == "cost"
      and (type(prices) ~= "table" or rawget(prices, m) == nil) then
      local where = rawget(routes[i], "retry_budget") and ("routes[%d].retry_budget.unit"):format(i)
        or "retry_budget.unit"
      return field_error(where, ("\"cost\" needs a price for model %s (prices.%s)")
        :format(quote(m), m))
    end
  end
  return nil
end

local function fallback_rule(policy, path)
  return gate_names_a_route(policy, path) or cooldown_cap_covers_period(policy, path)
    or aliases_name_routes(policy, path) or prices_cover_cost_budgets(policy, path)
end

-- `upgrades`: the protocols a request may switch to through the proxy
-- (RFC 9110 7.8: protocol-name ["/" protocol-version], tokens), compared
-- case-insensitively, each at most once; at most 8, each under 32 bytes
-- (the proxy keeps them in fixed slots). h2c is never forwarded (RFC 9113
-- 3.1 deprecates it): naming it would promise what the proxy will not do.
local function upgrade_tokens(v, path)
  if type(v) ~= "table" then
    return expected(path, "array of protocol tokens", v)
  end
  local n, why = sequence_length(v)
  if not n then
    return field_error(path, "array expected, got a table with " .. why)
  end
  if n > 8 then
    return field_error(path, ("at most 8 tokens, got %d"):format(n))
  end
  local seen = {}
  for i = 1, n do
    local tok = rawget(v, i)
    local at = join(path, i)
    if type(tok) ~= "string" then
      return expected(at, "protocol token", tok)
    end
    if tok == "" or #tok > 31 or not tok:find("^[%w!#$%%&'*+%-.^_`|~]+/?[%w!#$%%&'*+%-.^_`|~]*$")
      or tok:sub(-1) == "/" then
      return field_error(at, ("%s is not a protocol token (RFC 9110 7.8) of at most 31 bytes"):format(quote(tok)))
    end
    local low = tok:lower()
    if low == "h2c" then
      return field_error(at, "\"h2c\" is never forwarded (RFC 9113 3.1 deprecates the h2c upgrade)")
    end
    if seen[low] then
      return field_error(at, ("duplicate token %s"):format(quote(tok)))
    end
    seen[low] = true
  end
end

-- gRPC status names (grpc/doc/statuscodes.md) a retry may follow: every
-- code but OK.
local GRPC_STATUSES = {
  "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
  "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
  "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
  "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
}
local GRPC_STATUS_SET = {}
for _, name in ipairs(GRPC_STATUSES) do
  GRPC_STATUS_SET[name] = true
end

local function grpc_status_names(v, path)
  if type(v) ~= "table" then
    return expected(path, "array of gRPC status names", v)
  end
  local n, why = sequence_length(v)
  if not n then
    return field_error(path, "array expected, got a table with " .. why)
  end
  local seen = {}
  for i = 1, n do
    local name = rawget(v, i)
    if not GRPC_STATUS_SET[name] then
      return expected(join(path, i), "gRPC status name (as \"UNAVAILABLE\")", name)
    end
    if seen[name] then
      return field_error(join(path, i), ("duplicate status %s"):format(quote(name)))
    end
    seen[name] = true
  end
end

local KIND_SPECS = {
  traffic = kind_spec(traffic_example, run_traffic_example, {
    { "subset", func, required = true },
    { "key", func },
    -- decide(req) -> nil | { deadline_ms, per_try_timeout_ms, retries,
    -- retry_non_idempotent, stream_idle_timeout_ms, max_stream_ms,
    -- max_body_bytes, headers }: this request's settings, over the
    -- service's (docs/POLICIES.md "Per-request decisions").
    { "decide", func },
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
    -- after commit: no byte either way for this long cuts the stream
    { "stream_idle_timeout_ms", number_above(0) },
    -- after commit: the stream is cut this long after its head, flowing or not
    { "max_stream_ms", number_above(0) },
    -- the most a caller's x-openmesh-deadline-ms may ask for
    { "max_deadline_ms", number_above(0) },
    { "upgrades", upgrade_tokens },
    -- How the proxy speaks to this service's peers (docs/PROXY.md
    -- "HTTP/2 to upstreams"): HTTP/1.1, or HTTP/2 ("h2c" and "h2" alike:
    -- prior knowledge to an http:// peer, ALPN to an https:// one).
    { "protocol", one_of({ "http1", "h2c", "h2" }) },
    -- gRPC statuses whose Trailers-Only answer is retried on another
    -- peer (gRPC proposal A6's retryableStatusCodes; default
    -- { "UNAVAILABLE" }; {} retries none).
    { "grpc_retry_on", grpc_status_names },
    -- request bodies (docs/PROXY.md "Request bodies"): bytes; 0 is no limit
    { "max_body_bytes", integer_at_least(0) },
    { "replay_limit", integer_at_least(0) },
    { "body_idle_timeout_ms", number_above(0) },
    -- Wall clock one call of subset/key may hold the proxy's loop (default
    -- 1 ms; bindings/om_policy.h OM_POLICY_MAX_BUDGET_MS is the ceiling).
    { "budget_ms", number_within(0, 50) },
    -- Peers by name (docs/PROXY.md "Peers by name"): a resolved host name
    -- is looked up again this often (default 30 s), at least every 10 ms.
    { "resolve_interval_ms", number_within(9, 86400000) },
    -- TLS to this service's https:// peers (docs/PROXY.md "TLS to
    -- upstreams"): the proxy reads the files when the version loads, and a
    -- file that does not load rejects the version. A missing field falls
    -- back to the proxy's --upstream-ca / --upstream-cert / --upstream-key.
    { "tls", record({
      { "ca_file", nonempty },
      { "server_name", function(v, path)
        if type(v) ~= "string" or v == "" or #v > 253 then
          return field_error(path, ("must be a host name of 1..253 bytes, got %s"):format(show(v)))
        end
      end },
      { "verify", boolean },
      { "cert_file", nonempty },
      { "key_file", nonempty },
    }, function(v, path)
      local cert, key = rawget(v, "cert_file"), rawget(v, "key_file")
      if (cert == nil) ~= (key == nil) then
        local missing, given = "key_file", "cert_file"
        if cert == nil then
          missing, given = "cert_file", "key_file"
        end
        return field_error(join(path, missing), ("required with %s"):format(given))
      end
    end) },
    -- authorize(req) -> true | false, reason: runs first, under the same
    -- budget as key and subset; false answers 403 forbidden with the
    -- reason (docs/POLICIES.md "Refusing a call").
    { "authorize", func },
    -- Upstream keep-alive (docs/PROXY.md "Upstream keep-alive"): idle
    -- connections kept per peer (default: the peer's share of
    -- max_inflight, at least 8), how long one may sit idle (default 60 s),
    -- and the requests one carries before it is closed (0: no limit).
    { "pool", record({
      { "max_idle_per_peer", function(v, path)
        local err = integer_at_least(1)(v, path)
        if err == nil and v > 1000000 then
          err = field_error(path, ("at most 1000000 (descriptors), got %s"):format(show(v)))
        end
        return err
      end },
      { "idle_timeout_ms", number_above(0) },
      { "max_requests_per_connection", integer_at_least(0) },
    }) },
  }, max_deadline_covers_deadline),
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
    -- Model aliases: the caller's `model` names one, and its routes are
    -- the call's chain (order(ctx) sees it as ctx.model).
    { "models", map_of(array_of(nonempty, { min = 1 })) },
    -- Retry budgets: the policy's, for every route without its own.
    { "retry_budget", retry_budget },
    -- Prices per model (USD per million tokens): cost metrics, and the
    -- unit of a "cost" budget.
    { "prices", map_of(price) },
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

-- What the other parts use.
M.KINDS = KINDS
M.KIND_SPECS = KIND_SPECS

return M
