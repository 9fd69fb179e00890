-- examples/egress/fallback.lua: two routes on two loopback fake providers
-- (build/bin/fake_provider, see README.md), a judge route for the quality
-- gate, and short timeouts so the faults you script show up in seconds.
-- In production point base_url at the real providers.
return {
  kind = "fallback",
  description = "primary (OpenAI-compatible) then backup (Anthropic); the support agent is gated.",

  routes = {
    { name = "primary", provider = "openai",
      base_url = "http://127.0.0.1:9101/primary/v1", model = "gpt-4o-mini",
      api_key_env = "OPENAI_API_KEY",
      attempt_timeout_ms = 5000, first_byte_timeout_ms = 2000 },
    { name = "backup", provider = "anthropic",
      base_url = "http://127.0.0.1:9101/backup/v1", model = "claude-3-5-haiku-latest",
      api_key_env = "ANTHROPIC_API_KEY",
      attempt_timeout_ms = 5000, first_byte_timeout_ms = 2000 },
    { name = "judge", provider = "openai",
      base_url = "http://127.0.0.1:9101/judge/v1", model = "gpt-4o-mini",
      api_key_env = "OPENAI_API_KEY",
      attempt_timeout_ms = 1500, first_byte_timeout_ms = 1000 },
  },

  -- Model aliases: a caller's `model` names one and gets its chain
  -- (GET /v1/models lists them; any other model is 404 model_not_found;
  -- a request without a model gets the whole order). The provider always
  -- receives the route's own `model`, never the alias.
  models = {
    default = { "primary", "backup" },
    claude = { "backup" },
  },

  -- The judge is only ever called by the gate: keep it out of the order.
  -- ctx.model is the caller's alias; the alias bounds what order returns.
  order = function(ctx)
    return { "primary", "backup" }
  end,

  -- Retries spend at most 20% of the tokens the successful calls spent
  -- (plus 50 tokens/s), per route; fallbacks are never charged. The
  -- prices (USD per million tokens) feed openmesh_egress_cost_usd_total.
  retry_budget = { unit = "tokens", ratio = 0.2, min_per_s = 50 },
  prices = {
    ["gpt-4o-mini"] = { input = 0.15, output = 0.60, cached_input = 0.075 },
    ["claude-3-5-haiku-latest"] = { input = 0.80, output = 4.00 },
  },

  max_attempts = 3,
  per_wait_ceiling_ms = 2000,
  deadline_ms = 15000,
  backoff_base_ms = 500,
  backoff_cap_ms = 8000,
  cooldown_after_failures = 3, -- then the route is skipped for 2 s, 4 s, ... 60 s
  cooldown_ms = 2000,
  cooldown_max_ms = 60000,

  pending_retry_interval_ms = 10000, -- async turns: next cycle
  pending_max_age_ms = 600000,
  commitment_ms = 60000,             -- interactive: after the holding line

  quality_gate = { agents = { "support" }, judge_route = "judge", judge_timeout_ms = 1500 },
}
