-- policies/fallback.lua: the default route order for model calls.
local testing = require "openmesh.testing"

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
