-- policies/fallback.lua: the default route order for model calls.
local testing = require "openmesh.testing"
local contract = require "openmesh.contract"

describe("policies/fallback.lua", function()
  local p = assert(testing.load("policies/fallback.lua"))

  it("loads through the validator as a fallback policy", function()
    assert.equal("fallback", p:kind())
    assert.equal("fallback", p:name())
  end)

  it("points primary and backup at the loopback fake providers", function()
    local routes = p:settings().routes
    assert.equal(2, #routes)
    assert.same({ name = "primary", provider = "openai", base_url = "http://127.0.0.1:9101/v1",
      model = "gpt-4o-mini", api_key_env = "OPENAI_API_KEY", attempt_timeout_ms = 30000,
      first_byte_timeout_ms = 10000, context_tokens = 128000 }, routes[1])
    assert.equal("backup", routes[2].name)
    assert.equal("anthropic", routes[2].provider)
    assert.equal("http://127.0.0.1:9102/v1", routes[2].base_url)
    assert.equal("ANTHROPIC_API_KEY", routes[2].api_key_env)
  end)

  it("bounds recovery three ways", function()
    local s = p:settings()
    assert.equal(3, s.max_attempts)
    assert.equal(8000, s.per_wait_ceiling_ms)
    assert.equal(60000, s.deadline_ms)
    assert.is_true(s.backoff_base_ms < s.backoff_cap_ms)
  end)

  it("sets Layer C timings and an opt-in quality gate", function()
    local s = p:settings()
    assert.equal(60000, s.pending_retry_interval_ms)
    assert.equal(3600000, s.pending_max_age_ms)
    assert.equal(120000, s.commitment_ms)
    assert.same({ agents = { "support" }, judge_route = "primary", judge_timeout_ms = 2000 }, s.quality_gate)
  end)

  describe("the contract for the new fields", function()
    local function policy(extra)
      local t = {
        kind = "fallback",
        routes = { { name = "a", provider = "openai", base_url = "http://x/", model = "m" } },
      }
      for k, v in pairs(extra) do
        t[k] = v
      end
      return t
    end

    it("accepts them", function()
      assert.is_true(contract.validate(policy {
        pending_retry_interval_ms = 1000, pending_max_age_ms = 5000, commitment_ms = 3000,
        quality_gate = { agents = { "x" }, judge_route = "a", judge_timeout_ms = 500 },
      }))
      assert.is_true(contract.validate(policy { quality_gate = { judge_route = "a" } }))
      assert.is_true(contract.validate(policy {
        cooldown_after_failures = 1, cooldown_ms = 50, cooldown_max_ms = 50 }))
      assert.is_true(contract.validate(policy { cooldown_ms = 100 }))
      assert.is_true(contract.validate(policy {
        retry_budget = { unit = "tokens", ratio = 0.2, min_per_s = 100, window_ms = 10000 } }))
      assert.is_true(contract.validate(policy {
        retry_budget = { unit = "cost", ratio = 0 },
        prices = { m = { input = 0.15, output = 0.6, cached_input = 0.075 } } }))
      assert.is_true(contract.validate(policy { retry_budget = { unit = "attempts" } }))
    end)

    it("refuses a route's cost budget without a price for its model", function()
      local ok, err = contract.validate {
        kind = "fallback",
        routes = {
          { name = "a", provider = "openai", base_url = "http://x/", model = "m" },
          { name = "b", provider = "openai", base_url = "http://x/", model = "n",
            retry_budget = { unit = "cost" } },
        },
        prices = { m = { input = 1, output = 1 } },
      }
      assert.is_nil(ok)
      assert.matches("field 'routes[2].retry_budget.unit': \"cost\" needs a price for model 'n'", err, 1, true)
    end)

    it("refuses bad values, naming the field", function()
      local cases = {
        { { pending_retry_interval_ms = 0 }, "field 'pending_retry_interval_ms': number > 0 expected, got 0" },
        { { pending_max_age_ms = "1h" }, "field 'pending_max_age_ms': number > 0 expected" },
        { { commitment_ms = -1 }, "field 'commitment_ms'" },
        { { quality_gate = {} }, "field 'quality_gate.judge_route': non-empty string expected, got nil" },
        { { quality_gate = { judge_route = "nope" } },
          "field 'quality_gate.judge_route': unknown route 'nope' (routes: {a})" },
        { { quality_gate = { judge_route = "a", agents = { 1 } } }, "field 'quality_gate.agents[1]'" },
        { { quality_gate = { judge_route = "a", judge_timeout_ms = 0 } },
          "field 'quality_gate.judge_timeout_ms'" },
        { { quality_gate = { judge_route = "a", judge = "a" } },
          "unknown field 'quality_gate.judge'" },
        { { quality_gate = "on" }, "field 'quality_gate': table expected" },
        { { cooldown_after_failures = 0 }, "field 'cooldown_after_failures': integer >= 1 expected, got 0" },
        { { cooldown_after_failures = 2.5 }, "field 'cooldown_after_failures': integer >= 1 expected" },
        { { cooldown_ms = 0 }, "field 'cooldown_ms': number > 0 expected, got 0" },
        { { cooldown_ms = 0 / 0 }, "field 'cooldown_ms': number > 0 expected" },
        { { cooldown_max_ms = "1m" }, "field 'cooldown_max_ms': number > 0 expected" },
        { { cooldown_ms = 5000, cooldown_max_ms = 1000 }, "field 'cooldown_max_ms': 1000 is below cooldown_ms (5000)" },
        { { cooldown_max_ms = 1000 }, "field 'cooldown_max_ms': 1000 is below cooldown_ms (2000)" },
        { { cooldown = 5 }, "unknown field 'cooldown'" },
        { { retry_budget = {} }, "field 'retry_budget.unit': one of 'attempts', 'tokens', 'cost' expected, got nil" },
        { { retry_budget = { unit = "coins" } }, "field 'retry_budget.unit': one of 'attempts', 'tokens', 'cost' expected, got 'coins'" },
        { { retry_budget = { unit = "tokens", ratio = -0.1 } }, "field 'retry_budget.ratio': number >= 0 and <= 100 expected, got -0.1" },
        { { retry_budget = { unit = "tokens", ratio = 0 / 0 } }, "field 'retry_budget.ratio': number >= 0 and <= 100 expected" },
        { { retry_budget = { unit = "tokens", min_per_s = 1e7 } }, "field 'retry_budget.min_per_s'" },
        { { retry_budget = { unit = "tokens", window_ms = 0 } }, "field 'retry_budget.window_ms': number > 0 and <= 3600000 expected, got 0" },
        { { retry_budget = { unit = "tokens", windows = 1 } }, "unknown field 'retry_budget.windows'" },
        { { retry_budget = "20%" }, "field 'retry_budget': table expected" },
        { { retry_budget = { unit = "cost" } }, "field 'retry_budget.unit': \"cost\" needs a price for model 'm' (prices.m)" },
        { { prices = { gpt9 = { input = 1, output = 2 } } }, "field 'prices.gpt9': no route has model 'gpt9' (models: {m})" },
        { { prices = { m = { input = 1 } } }, "field 'prices.m.output': number >= 0 and <= 1000000 expected, got nil" },
        { { prices = { m = { input = -1, output = 1 } } }, "field 'prices.m.input': number >= 0 and <= 1000000 expected, got -1" },
        { { prices = { m = { input = 1, output = 1, cache = 1 } } }, "unknown field 'prices.m.cache'" },
        { { prices = 3 }, "field 'prices'" },
      }
      for _, c in ipairs(cases) do
        local ok, err = contract.validate(policy(c[1]))
        assert.is_nil(ok)
        assert.matches(c[2], err, 1, true)
      end
    end)
  end)

  it("starts with primary while nothing has failed", function()
    assert.same({ "primary", "backup" }, testing.order(p, { context = "interactive" }))
    assert.same({ "primary", "backup" }, testing.order(p, { context = "async" }))
  end)

  it("puts the route that is answering first in an interactive turn", function()
    local failed = { { route = "primary", status = 503, class = "server_error" } }
    assert.same({ "backup", "primary" }, testing.order(p, { context = "interactive", failed = failed }))
    failed = { { route = "backup", class = "timeout" } }
    assert.same({ "primary", "backup" }, testing.order(p, { context = "interactive", failed = failed }))
  end)

  it("keeps the listed order in an async turn, whatever failed", function()
    local failed = { { route = "primary", status = 429, class = "rate_limited" } }
    assert.same({ "primary", "backup" }, testing.order(p, { context = "async", failed = failed }))
  end)

  it("always orders every route exactly once", function()
    local failures = { {}, { { route = "primary" } }, { { route = "backup" } },
      { { route = "primary" }, { route = "backup" } }, { { route = "primary" }, { route = "primary" } } }
    for _, context in ipairs { "interactive", "async" } do
      for _, failed in ipairs(failures) do
        local names = testing.order(p, { context = context, failed = failed, agent = "support" })
        table.sort(names)
        assert.same({ "backup", "primary" }, names)
      end
    end
  end)
end)
