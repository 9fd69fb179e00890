-- The default fallback policy for model calls: two routes on two providers
-- (the loopback fake providers of the examples; point base_url at the real
-- ones in production), retried and then fallen back across within one turn
-- deadline.
--
-- order(ctx): an async turn (nobody waiting) walks the routes as listed.
-- An interactive turn has a user waiting, so the fast route goes first: the
-- one that has not failed yet in this turn, rather than another attempt at
-- a provider that is erroring or timing out right now.
return {
  kind = "fallback",
  description = "primary (OpenAI-compatible) then backup (Anthropic); interactive turns go to a route that is answering first.",

  routes = {
    { name = "primary", provider = "openai",
      base_url = "http://127.0.0.1:9101/v1", model = "gpt-4o-mini",
      api_key_env = "OPENAI_API_KEY",
      attempt_timeout_ms = 30000, first_byte_timeout_ms = 10000,
      context_tokens = 128000 },
    { name = "backup", provider = "anthropic",
      base_url = "http://127.0.0.1:9102/v1", model = "claude-3-5-haiku-latest",
      api_key_env = "ANTHROPIC_API_KEY",
      attempt_timeout_ms = 30000, first_byte_timeout_ms = 10000,
      context_tokens = 200000 },
  },

  order = function(ctx)
    local listed = { "primary", "backup" }
    if ctx.context ~= "interactive" then
      return listed
    end
    local failed = {}
    for _, f in ipairs(ctx.failed or {}) do
      failed[f.route] = true
    end
    local fast, slow = {}, {}
    for _, name in ipairs(listed) do
      local list = failed[name] and slow or fast
      list[#list + 1] = name
    end
    for _, name in ipairs(slow) do
      fast[#fast + 1] = name
    end
    return fast
  end,

  max_attempts = 3, -- per route
  per_wait_ceiling_ms = 8000, -- no single backoff (or Retry-After) waits longer
  deadline_ms = 60000, -- the whole recovery of one turn
  backoff_base_ms = 500,
  backoff_cap_ms = 8000,

  -- A route that keeps failing cools down: after 3 consecutive failures
  -- that count against its health (5xx, timeouts, resets; not the
  -- request's own fault) it is skipped for 2 s, doubling per repeat up to
  -- a minute, and trusted again at its first success. Cooling routes are
  -- still tried when nothing else is left.
  cooldown_after_failures = 3,
  cooldown_ms = 2000,
  cooldown_max_ms = 60000,

  -- Layer C. An async turn that failed stays pending and is retried every
  -- minute for at most an hour (nobody is waiting; a late answer is still
  -- useful). An interactive turn got a holding line: the gateway keeps
  -- trying for two minutes, then sends the handoff message.
  pending_retry_interval_ms = 60000,
  pending_max_age_ms = 3600000,
  commitment_ms = 120000,

  -- The quality gate, opt-in per agent: flagged replies of these agents go
  -- to a judge on the fast route, which must answer within the timeout.
  quality_gate = {
    agents = { "support" },
    judge_route = "primary",
    judge_timeout_ms = 2000,
  },

  examples = {
    { description = "nothing failed yet: primary first",
      ctx = { agent = "support", context = "interactive" },
      expect = { "primary", "backup" } },
    { description = "interactive, primary is failing: the route that answers goes first",
      ctx = { agent = "support", context = "interactive",
        failed = { { route = "primary", status = 503, class = "server_error" } } },
      expect = { "backup", "primary" } },
    { description = "async: nobody waits, the listed order stands",
      ctx = { agent = "digest", context = "async",
        failed = { { route = "primary", class = "timeout" } } },
      expect = { "primary", "backup" } },
    { description = "both failed: back to the listed order",
      ctx = { context = "interactive",
        failed = { { route = "backup", status = 429, class = "rate_limited" },
          { route = "primary", status = 500, class = "server_error" } } },
      expect = { "primary", "backup" } },
  },
}
