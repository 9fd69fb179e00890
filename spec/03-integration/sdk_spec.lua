-- sdk_spec.lua: the official SDKs an application would use, driven against
-- the real `openmesh egress` in front of the fake provider
-- (tests/fixtures/fake_provider.c): the OpenAI Node SDK (npm `openai`) and
-- the Anthropic TypeScript SDK (npm `@anthropic-ai/sdk`, /v1/messages)
-- and the Vercel AI SDK (npm `ai` with `@ai-sdk/openai`), from the
-- project-local tests/sdk/node_modules (tests/sdk/package-lock.json; `make
-- check` runs `npm ci` there when it is missing). Each call runs
-- tests/sdk/drive.mjs with the SDK's default retries on, and the fake's
-- request counts say how many provider calls the whole thing cost.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../support/?.lua;" .. package.path

local H = require "control_helper"
local cjson = require "cjson"

local SDK_DIR = here .. "../../tests/sdk"

local function policy(fake)
  local routes, names = {}, {}
  for i = 0, 19 do
    names[#names + 1] = string.format("%q, %q", "s" .. i .. "_a", "s" .. i .. "_b")
    routes[#routes + 1] = string.format([[
    { name = "s%d_a", provider = "openai", base_url = "%s/s%d_a/v1", model = "gpt-fake", api_key_env = "OM_SPEC_OPENAI_KEY", attempt_timeout_ms = 1500, first_byte_timeout_ms = 400 },
    { name = "s%d_b", provider = "anthropic", base_url = "%s/s%d_b/v1", model = "claude-fake", api_key_env = "OM_SPEC_ANTHROPIC_KEY", attempt_timeout_ms = 1500, first_byte_timeout_ms = 400 },]],
      i, fake, i, i, fake, i)
  end
  return string.format([[
return {
  kind = "fallback",
  routes = {
%s
  },
  -- "any" (what drive.mjs names by default) may use every route; an
  -- alias bounds what order(ctx) picks, and order sees it as ctx.model
  models = { any = { %s }, ["claude-only"] = { "s10_b" }, ["prefer-claude"] = { "s11_a", "s11_b" } },
  order = function(ctx)
    local n = (ctx.agent or "s0"):match("^s(%%d+)$") or "0"
    if ctx.model == "prefer-claude" then
      return { "s" .. n .. "_b", "s" .. n .. "_a" }
    end
    return { "s" .. n .. "_a", "s" .. n .. "_b" }
  end,
  max_attempts = 3, per_wait_ceiling_ms = 300, deadline_ms = 4000,
  backoff_base_ms = 20, backoff_cap_ms = 100,
}
]], table.concat(routes, "\n"), table.concat(names, ", "))
end

describe("real SDKs through openmesh egress", function()
  if not H.bin or H.bin == "" then
    it("runs against OPENMESH_BIN", function()
      pending("OPENMESH_BIN is not set (make check sets it to build/bin/openmesh)")
    end)
    return
  end
  local dir, fake, gw

  local function script(route, steps)
    local st = H.request(dir, "POST", fake.url .. "/_script",
      { body = cjson.encode({ route = route, steps = steps }) })
    assert.equals(200, st)
  end

  local function counts()
    local _, body = H.request(dir, "GET", fake.url .. "/_count")
    return H.json(body).routes
  end

  -- One call with the SDK; its printed result.
  local function drive(sdk, agent, mode, model)
    local f = io.popen(string.format("cd %s && OM_DRIVE_MODEL=%s node drive.mjs %s %s %s %s 2>&1",
      H.q(SDK_DIR), H.q(model or "any"), sdk, H.q(gw.url), agent, mode or ""))
    local text = f:read("a")
    f:close()
    local line = text:match("({.*})%s*$")
    assert(line, "drive.mjs printed no result: " .. text)
    return cjson.decode(line)
  end

  setup(function()
    dir = H.tmpdir()
    fake = H.start_fixture(dir, "fake_provider", "")
    H.writefile(dir .. "/fallback.lua", policy(fake.url))
    gw = H.start_egress(dir, "egress", string.format("--fallback %s --heuristics %s",
      H.q(dir .. "/fallback.lua"), H.q(here .. "../../policies/egress_heuristics.lua")),
      "OM_SPEC_OPENAI_KEY=sk-spec OM_SPEC_ANTHROPIC_KEY=ak-spec")
  end)

  teardown(function()
    H.kill_all()
    if dir then os.execute("rm -rf " .. H.q(dir)) end
  end)

  for _, sdk in ipairs({ "openai", "vercel", "vercel-default" }) do
    it(sdk .. ": a call and a streamed one go through", function()
      local r = drive(sdk, "s0")
      assert.is_true(r.ok, cjson.encode(r))
      assert.matches("from s0_a", r.text)
      r = drive(sdk, "s0", "stream")
      assert.is_true(r.ok, cjson.encode(r))
      assert.matches("s0_a", r.text)
    end)
  end

  it("openai: a final 502 is not retried by the SDK: the provider calls are the gateway's own", function()
    script("s1_a", { "500", "500", "500" })
    script("s1_b", { "500", "500", "500" })
    local r = drive("openai", "s1")
    assert.is_false(r.ok)
    assert.equals("InternalServerError", r.error)
    assert.equals(502, r.status)
    assert.equals("all_routes_failed", r.type)
    local c = counts()
    -- 3 attempts per route, once: without x-should-retry: false the SDK's
    -- two retries would make it 18
    assert.equals(3, c.s1_a)
    assert.equals(3, c.s1_b)
  end)

  for i, sdk in ipairs({ "openai", "vercel" }) do
    it(sdk .. ": a key refused on every route is the SDK's authentication error, not retried", function()
      local agent = "s" .. (1 + i)
      script(agent .. "_a", { "401" })
      script(agent .. "_b", { "401" })
      local r = drive(sdk, agent)
      assert.is_false(r.ok)
      assert.equals(401, r.status)
      assert.equals("authentication_failed", r.type)
      if sdk == "openai" then
        assert.equals("AuthenticationError", r.error)
      end
      local c = counts()
      assert.equals(1, c[agent .. "_a"])
      assert.equals(1, c[agent .. "_b"])
    end)
  end

  it("openai: every route rate-limited with a wait: the SDK waits the gateway's Retry-After and succeeds", function()
    -- every attempt of the gateway's (3 per route, waits clamped to the
    -- policy's 300 ms ceiling) is told to come back in a second
    script("s4_a", { "429:ra=1", "429:ra=1", "429:ra=1" })
    script("s4_b", { "503:ra=1", "503:ra=1", "503:ra=1" })
    local r = drive("openai", "s4")
    -- the gateway answered 429 rate_limited, x-should-retry: true,
    -- Retry-After: 1; the SDK waited and its retry found s4_a answering.
    -- Asserted on what the gateway sent, not on a wall-clock wait.
    assert.is_true(r.ok, cjson.encode(r))
    assert.matches("from s4_a", r.text)
    assert.equals(2, #r.answers, cjson.encode(r.answers))
    assert.same({ status = 429, retry_after = "1", should_retry = "true" }, r.answers[1])
    assert.equals(200, r.answers[2].status)
    assert.equals(4, counts().s4_a)
    assert.equals(3, counts().s4_b)
  end)

  it("anthropic: a message and a streamed one go through /v1/messages", function()
    local r = drive("anthropic", "s5")
    assert.is_true(r.ok, cjson.encode(r))
    assert.equals("message", r.type)
    assert.equals("end_turn", r.stop_reason)
    assert.matches("from s5_a", r.text)
    assert.is_true(r.usage.output_tokens > 0, cjson.encode(r.usage))
    r = drive("anthropic", "s5", "stream")
    assert.is_true(r.ok, cjson.encode(r))
    assert.matches("from s5_a", r.text)
    assert.equals(r.text, r.deltas)
    assert.equals("end_turn", r.stop_reason)
    assert.is_true(r.usage.output_tokens > 0, cjson.encode(r.usage))
  end)

  it("anthropic: a streamed message from an Anthropic route keeps its usage", function()
    script("s9_a", { "500", "500", "500" })
    local r = drive("anthropic", "s9", "stream")
    assert.is_true(r.ok, cjson.encode(r))
    assert.matches("from s9_b", r.text)
    assert.is_true(r.usage.input_tokens > 0, cjson.encode(r.usage))
  end)

  it("vercel-default: generateText and streamText over /v1/responses, from an Anthropic route too", function()
    script("s13_a", { "500", "500", "500" })
    local r = drive("vercel-default", "s13")
    assert.is_true(r.ok, cjson.encode(r))
    assert.matches("from s13_b", r.text)
    assert.is_true(r.usage.outputTokens > 0, cjson.encode(r.usage))
    local _, body = H.request(dir, "GET", fake.url .. "/_last")
    assert.equals("/s13_b/v1/messages", H.json(body).path)
    script("s13_a", { "500", "500", "500" })
    r = drive("vercel-default", "s13", "stream")
    assert.is_true(r.ok, cjson.encode(r))
    assert.matches("from s13_b", r.text)
  end)

  it("vercel-default: a tool over two steps on /v1/responses, served by an Anthropic route", function()
    script("s14_a", { "500", "500", "500", "500", "500", "500" })
    script("s14_b", { "tool", "ok" })
    local r = drive("vercel-default", "s14", "tool")
    assert.is_true(r.ok, cjson.encode(r))
    assert.equals(2, r.steps)
    assert.equals("lookup_order", r.tool.name)
    assert.same({ order_id = 12 }, r.tool.input)
    assert.matches("from s14_b", r.text)
    -- the second step reached the Anthropic route as tool_use and
    -- tool_result blocks
    local _, body = H.request(dir, "GET", fake.url .. "/_last")
    local msgs = H.json(body).body.messages
    local last = msgs[#msgs].content[1]
    assert.equals("tool_result", last.type, cjson.encode(msgs))
    assert.equals(r.tool.id, last.tool_use_id)
    assert.equals("Order 12 shipped.", last.content)
    assert.equals("tool_use", msgs[#msgs - 1].content[#msgs[#msgs - 1].content].type)
  end)

  it("openai: a tool over two turns, falling back from an OpenAI route to an Anthropic one in the middle", function()
    -- turn 1: s15_a answers with a tool call; turn 2: s15_a is down, so
    -- the tool history must reach s15_b (Anthropic) as tool_use and
    -- tool_result blocks, which the fake checks as the real API does
    script("s15_a", { "tool", "503", "503", "503" })
    script("s15_b", { "ok" })
    local r = drive("openai", "s15", "tool")
    assert.is_true(r.ok, cjson.encode(r))
    assert.equals("tool_calls", r.stop_reason)
    assert.equals("lookup_order", r.tool.name)
    assert.same({ order_id = 12 }, r.tool.input)
    assert.matches("from s15_b", r.text)
    local c = counts()
    assert.equals(4, c.s15_a)
    assert.equals(1, c.s15_b)
    local _, body = H.request(dir, "GET", fake.url .. "/_last")
    local last = H.json(body)
    assert.equals("s15_b", last.route)
    local msgs = last.body.messages
    assert.equals("assistant", msgs[#msgs - 1].role, cjson.encode(msgs))
    local use = msgs[#msgs - 1].content[#msgs[#msgs - 1].content]
    assert.equals("tool_use", use.type, cjson.encode(msgs))
    assert.equals(r.tool.id, use.id)
    assert.same({ order_id = 12 }, use.input)
    local result = msgs[#msgs].content[1]
    assert.equals("tool_result", result.type, cjson.encode(msgs))
    assert.equals(r.tool.id, result.tool_use_id)
    assert.equals("Order 12 shipped.", result.content)
    assert.equals("Find an order", last.body.tools[1].description)
  end)

  it("openai: image parts reach an Anthropic route as image blocks, inline and by URL", function()
    script("s16_a", { "503", "503", "503" })
    local r = drive("openai", "s16", "image")
    assert.is_true(r.ok, cjson.encode(r))
    assert.matches("from s16_b", r.text)
    local _, body = H.request(dir, "GET", fake.url .. "/_last")
    local parts = H.json(body).body.messages[1].content
    assert.equals(3, #parts, cjson.encode(parts))
    assert.equals("text", parts[1].type)
    assert.equals("image", parts[2].type)
    assert.equals("base64", parts[2].source.type)
    assert.equals("image/png", parts[2].source.media_type)
    assert.matches("^iVBORw0KGgo", parts[2].source.data)
    assert.equals("image", parts[3].type)
    assert.equals("url", parts[3].source.type)
    assert.equals("https://example.com/cat.png", parts[3].source.url)
  end)

  it("openai: a stream with include_usage ends with the usage, from either route kind", function()
    local r = drive("openai", "s17", "stream_usage")
    assert.is_true(r.ok, cjson.encode(r))
    assert.matches("s17_a", r.text)
    assert.is_table(r.usage, cjson.encode(r))
    assert.equals(12, r.usage.prompt_tokens)
    assert.is_true(r.usage.completion_tokens > 0, cjson.encode(r.usage))
    script("s17_a", { "401" })
    r = drive("openai", "s17", "stream_usage")
    assert.is_true(r.ok, cjson.encode(r))
    assert.matches("s17_b", r.text)
    assert.is_table(r.usage, cjson.encode(r))
    assert.is_true(r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0, cjson.encode(r.usage))
  end)

  it("vercel: streamText reports the stream's usage", function()
    local r = drive("vercel", "s18", "stream")
    assert.is_true(r.ok, cjson.encode(r))
    assert.is_table(r.usage, cjson.encode(r))
    assert.equals(12, r.usage.inputTokens, cjson.encode(r.usage))
    assert.is_true((r.usage.outputTokens or 0) > 0, cjson.encode(r.usage))
  end)

  -- examples/egress/sdk/*.mjs, run as a user would (their imports resolve
  -- from tests/sdk/node_modules, the same pinned versions): each exits 0
  -- and prints answers the fake gave
  for _, ex in ipairs({ "openai", "anthropic", "vercel" }) do
    it("examples/egress/sdk/" .. ex .. ".mjs runs against the gateway", function()
      local copy = SDK_DIR .. "/.example-" .. ex .. ".mjs"
      H.writefile(copy, H.readfile(here .. "../../examples/egress/sdk/" .. ex .. ".mjs"))
      local out, rc = H.sh(string.format("cd %s && OPENMESH_EGRESS_URL=%s OPENMESH_MODEL=any node %s 2>&1",
        H.q(SDK_DIR), H.q(gw.url), H.q(".example-" .. ex .. ".mjs")))
      os.remove(copy)
      assert.equals(0, rc, out)
      assert.matches("stream: [^\n]*from s0_", out)
      assert.matches("tokens: [1-9]%d* %+ [1-9]%d*", out)
    end)
  end

  it("anthropic: a tool over two turns: tool_use out, tool_result back in", function()
    script("s6_a", { "tool", "ok" })
    local r = drive("anthropic", "s6", "tool")
    assert.is_true(r.ok, cjson.encode(r))
    assert.equals("tool_use", r.stop_reason)
    assert.equals("lookup_order", r.tool.name)
    assert.same({ order_id = 12 }, r.tool.input)
    assert.matches("from s6_a", r.text)
    -- the second turn reached the provider as the assistant's tool call
    -- and a tool message answering it
    local _, body = H.request(dir, "GET", fake.url .. "/_last")
    local msgs = H.json(body).body.messages
    local tool = msgs[#msgs]
    assert.equals("tool", tool.role, cjson.encode(msgs))
    assert.equals(r.tool.id, tool.tool_call_id)
    assert.equals("Order 12 shipped.", tool.content)
    assert.equals(r.tool.id, msgs[#msgs - 1].tool_calls[1].id)
  end)

  it("anthropic: a key refused on every route is the SDK's AuthenticationError, not retried", function()
    script("s7_a", { "401" })
    script("s7_b", { "401" })
    local r = drive("anthropic", "s7")
    assert.is_false(r.ok)
    assert.equals("AuthenticationError", r.error)
    assert.equals(401, r.status)
    local c = counts()
    assert.equals(1, c.s7_a)
    assert.equals(1, c.s7_b)
    assert.equals(1, #r.answers)
  end)

  it("anthropic: a final 502 is not retried by the SDK: the provider calls are the gateway's own", function()
    script("s8_a", { "500", "500", "500" })
    script("s8_b", { "500", "500", "500" })
    local r = drive("anthropic", "s8")
    assert.is_false(r.ok)
    assert.equals("InternalServerError", r.error)
    assert.equals(502, r.status)
    local c = counts()
    assert.equals(3, c.s8_a)
    assert.equals(3, c.s8_b)
    assert.same({ { status = 502, should_retry = "false" } }, r.answers)
  end)

  it("GET /v1/models lists the policy's model aliases, in OpenAI's list shape", function()
    local st, body = H.request(dir, "GET", gw.url .. "/v1/models")
    assert.equals(200, st)
    local j = H.json(body)
    assert.equals("list", j.object)
    local ids = {}
    for _, m in ipairs(j.data) do
      ids[#ids + 1] = m.id
      assert.equals("model", m.object)
    end
    table.sort(ids)
    assert.same({ "any", "claude-only", "prefer-claude" }, ids)
  end)

  it("a model alias bounds the chain: order(ctx) names s10_a first, the alias only has s10_b", function()
    local r = drive("openai", "s10", nil, "claude-only")
    assert.is_true(r.ok, cjson.encode(r))
    assert.matches("from s10_b", r.text)
    assert.is_nil(counts().s10_a)
    -- the provider got the route's model, not the caller's alias
    local _, body = H.request(dir, "GET", fake.url .. "/_last")
    assert.equals("claude-fake", H.json(body).body.model)
  end)

  it("order(ctx) sees the caller's alias as ctx.model", function()
    local r = drive("anthropic", "s11", nil, "prefer-claude")
    assert.is_true(r.ok, cjson.encode(r))
    assert.matches("from s11_b", r.text)
  end)

  for _, sdk in ipairs({ "openai", "anthropic" }) do
    it(sdk .. ": an unknown model is 404 model_not_found, the SDK's NotFoundError, nothing sent", function()
      local before = counts()
      local r = drive(sdk, "s12", nil, "gpt-nonexistent")
      assert.is_false(r.ok)
      assert.equals("NotFoundError", r.error)
      assert.equals(404, r.status)
      assert.same({ { status = 404, should_retry = "false" } }, r.answers)
      assert.same(before, counts())
    end)
  end
end)
