-- egress_spec.lua: the real `openmesh egress` binary in front of real fake
-- model providers (tests/fixtures/fake_provider.c: OpenAI and Anthropic
-- wire formats, scripted faults) and a real user channel
-- (tests/fixtures/webhook_sink.c records every message it accepts). One rule
-- of docs/EGRESS.md per spec, then the randomized fault campaign. Everything runs
-- on loopback; every process is killed in teardown.
--
-- Each spec uses its own agent and so its own pair of routes (order(ctx) in
-- the fallback policy below maps agent tN to routes tN_a (OpenAI) and tN_b
-- (Anthropic), tN_solo to tN_a alone): the route cooldown one spec causes
-- cannot change the route order another spec sees.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../support/?.lua;" .. package.path

local H = require "control_helper"
local cjson = require "cjson"

local HOLDING = "One moment please, I am looking into this."
local HANDOFF = "A teammate will take it from here and reply in this conversation."

local function fallback_policy(fake, opts)
  opts = opts or {}
  local routes = {}
  for i = 0, 60 do
    routes[#routes + 1] = string.format(
      '{ name = "t%d_a", provider = "openai", base_url = "%s/t%d_a/v1", model = "gpt-fake", api_key_env = "OM_SPEC_OPENAI_KEY", attempt_timeout_ms = %d, first_byte_timeout_ms = %d },',
      i, fake, i, opts.attempt or 1500, opts.first_byte or 400)
    routes[#routes + 1] = string.format(
      '{ name = "t%d_b", provider = "anthropic", base_url = "%s/t%d_b/v1", model = "claude-fake", api_key_env = "OM_SPEC_ANTHROPIC_KEY", attempt_timeout_ms = %d, first_byte_timeout_ms = %d },',
      i, fake, i, opts.attempt or 1500, opts.first_byte or 400)
  end
  return string.format([[
return {
  kind = "fallback",
  routes = {
    %s
    { name = "judge", provider = "openai", base_url = "%s/judge/v1", model = "judge-fake", attempt_timeout_ms = 400, first_byte_timeout_ms = 300 },
  },
  order = function(ctx)
    local a = ctx.agent or "t0"
    local n = a:match("^t(%%d+)_solo$")
    if n then return { "t" .. n .. "_a" } end
    n = a:match("^t(%%d+)$")
    if n then return { "t" .. n .. "_a", "t" .. n .. "_b" } end
    return { "t0_a", "t0_b" }
  end,
  %s
  max_attempts = %d, per_wait_ceiling_ms = %d, deadline_ms = %d,
  backoff_base_ms = 20, backoff_cap_ms = 100,
  pending_retry_interval_ms = %d, pending_max_age_ms = %d, commitment_ms = %d,
  quality_gate = { agents = { "t30", "t31", "t32", "t33", "t34" }, judge_route = "judge", judge_timeout_ms = 400 },
}
]], table.concat(routes, "\n    "), fake, opts.extra or "", opts.max_attempts or 3, opts.ceiling or 300,
    opts.deadline or 4000, opts.pending_interval or 300, opts.max_age or 5000,
    opts.commitment or 2500)
end

local HEURISTICS = [[
return {
  kind = "egress_heuristics",
  checks = {
    { name = "thinking", confidence = "high", substrings = { "<thinking>" } },
    { name = "error_json", confidence = "high", pattern = "\"error\"%s*:" },
    { name = "ai_opener", confidence = "low", pattern = "^As an AI language model" },
  },
  holding_lines = { default = "]] .. HOLDING .. [[" },
  handoff_lines = { default = "]] .. HANDOFF .. [[" },
}
]]

describe("openmesh egress, the real binary", function()
  if not H.bin or H.bin == "" then
    it("runs against OPENMESH_BIN", function()
      pending("OPENMESH_BIN is not set (make check sets it to build/bin/openmesh)")
    end)
    return
  end
  local dir, fake, sink, gw, sinkfile, errfile

  local function start_fixture(name, args)
    return H.start_fixture(dir, name, args)
  end

  local function start_gateway(policy, extra)
    local n = math.random(1e6)
    H.writefile(dir .. "/fallback" .. n .. ".lua", policy)
    H.writefile(dir .. "/heuristics.lua", HEURISTICS)
    return H.start_egress(dir, "egress" .. n, string.format(
      "--fallback %s --heuristics %s --channels %s --errors %s %s",
      H.q(dir .. "/fallback" .. n .. ".lua"), H.q(dir .. "/heuristics.lua"),
      H.q(dir .. "/channels.json"), H.q(errfile), extra or ""),
      "OM_SPEC_OPENAI_KEY=sk-spec OM_SPEC_ANTHROPIC_KEY=ak-spec")
  end

  local function script(route, steps)
    local st = H.request(dir, "POST", fake.url .. "/_script",
      { body = cjson.encode({ route = route, steps = steps }) })
    assert.equals(200, st)
  end

  local function counts()
    local _, body = H.request(dir, "GET", fake.url .. "/_count")
    return H.json(body).routes
  end

  local function chat(agent, body, max_time)
    body = body or { model = "any", messages = { { role = "user", content = "Where is my order?" } } }
    local t0 = H.now()
    local st, resp, headers = H.request(dir, "POST", gw.url .. "/v1/chat/completions",
      { body = cjson.encode(body), headers = { "x-openmesh-agent: " .. agent }, max_time = max_time or 10 })
    return st, resp, H.now() - t0, headers
  end

  local function turn(fields, headers)
    fields.channel = fields.channel or "user"
    fields.request = fields.request or { messages = { { role = "user", content = "Where is my order?" } } }
    local st, body = H.request(dir, "POST", gw.url .. "/v1/turns",
      { body = cjson.encode(fields), headers = headers, max_time = 15 })
    return st, body
  end

  -- Messages the user channel accepted, in order.
  local function received()
    local out = {}
    for line in H.readfile(sinkfile):gmatch("[^\n]+") do
      out[#out + 1] = cjson.decode(line)
    end
    return out
  end

  local function for_conversation(conv)
    local out = {}
    for _, m in ipairs(received()) do
      if m.conversation == conv then out[#out + 1] = m.text end
    end
    return out
  end

  setup(function()
    dir = H.tmpdir()
    sinkfile = dir .. "/sink.jsonl"
    errfile = dir .. "/errors.jsonl"
    math.randomseed(os.time())
    fake = start_fixture("fake_provider", "")
    sink = start_fixture("webhook_sink", "--out " .. H.q(sinkfile))
    H.writefile(dir .. "/channels.json", cjson.encode({
      user = { kind = "webhook", target = sink.url .. "/hook", part_limit = 4000, max_retries = 3 } }))
    gw = start_gateway(fallback_policy(fake.url))
  end)

  teardown(function()
    H.kill_all()
    if dir then os.execute("rm -rf " .. H.q(dir)) end
  end)

  describe("the command", function()
    it("has --help, exit 0", function()
      local out, rc = H.sh(H.q(H.bin) .. " egress --help")
      assert.equals(0, rc)
      assert.matches("/v1/turns", out, 1, true)
      assert.matches("--channels", out, 1, true)
    end)

    it("refuses a bad flag, a bad listen address and a bad channels file with exit 2 naming the culprit", function()
      local out, rc = H.sh(H.q(H.bin) .. " egress --bogus 2>&1")
      assert.equals(2, rc)
      out, rc = H.sh(H.q(H.bin) .. " egress --listen nowhere 2>&1")
      assert.equals(2, rc)
      assert.matches("--listen", out, 1, true)
      H.writefile(dir .. "/bad_channels.json", '{"user": {"kind": "carrier-pigeon", "target": "x"}}')
      out, rc = H.sh(string.format("%s egress --listen 127.0.0.1:0 --fallback %s --heuristics %s --channels %s 2>&1",
        H.q(H.bin), H.q(dir .. "/fallback_bad.lua"), H.q(dir .. "/heuristics.lua"), H.q(dir .. "/bad_channels.json")))
      assert.equals(2, rc) -- missing fallback file
      H.writefile(dir .. "/fallback_ok.lua", fallback_policy(fake.url))
      out, rc = H.sh(string.format("timeout 5 %s egress --listen 127.0.0.1:0 --fallback %s --heuristics %s --channels %s 2>&1",
        H.q(H.bin), H.q(dir .. "/fallback_ok.lua"), H.q(dir .. "/heuristics.lua"), H.q(dir .. "/bad_channels.json")))
      assert.equals(2, rc)
      assert.matches("channel 'user'", out, 1, true)
      H.writefile(dir .. "/garbage.json", "{not json")
      out, rc = H.sh(string.format("timeout 5 %s egress --listen 127.0.0.1:0 --fallback %s --heuristics %s --channels %s 2>&1",
        H.q(H.bin), H.q(dir .. "/fallback_ok.lua"), H.q(dir .. "/heuristics.lua"), H.q(dir .. "/garbage.json")))
      assert.equals(2, rc)
      assert.matches("--channels", out, 1, true)
    end)
  end)

  describe("the errors file", function()
    local function run_with_errors(path)
      H.writefile(dir .. "/fallback_errs.lua", fallback_policy(fake.url))
      return H.sh(string.format("timeout 5 %s egress --listen 127.0.0.1:0 --fallback %s --heuristics %s --errors %s 2>&1",
        H.q(H.bin), H.q(dir .. "/fallback_errs.lua"), H.q(dir .. "/heuristics.lua"), H.q(path)))
    end

    it("refuses a path that cannot be appended to at start: exit 2 naming --errors", function()
      local out, rc = run_with_errors(dir .. "/no-such-dir/errors.jsonl")
      assert.equals(2, rc, out)
      assert.matches("--errors " .. dir .. "/no-such-dir/errors.jsonl: cannot open for appending", out, 1, true)
      out, rc = run_with_errors(dir) -- a directory
      assert.equals(2, rc, out)
      assert.matches("--errors", out, 1, true)
    end)

    it("follows rotation, and a failing write is counted and logged once, never failing the call", function()
      local function failing_chat(g)
        script("t28_a", { "500", "500", "500" })
        script("t28_b", { "500", "500", "500" })
        local st, body = H.request(dir, "POST", g.url .. "/v1/chat/completions",
          { body = cjson.encode({ model = "x", messages = { { role = "user", content = "hi" } } }),
            headers = { "x-openmesh-agent: t28_solo" }, max_time = 10 })
        assert.equals(502, st, body)
      end
      local efile = dir .. "/errs_rot.jsonl"
      local g = start_gateway(fallback_policy(fake.url, { max_attempts = 1 }), "--errors " .. H.q(efile))
      failing_chat(g)
      assert.equals(1, select(2, H.readfile(efile):gsub("\n", "")))
      assert.is_true(os.rename(efile, efile .. ".1"))
      failing_chat(g)
      assert.equals(1, select(2, H.readfile(efile):gsub("\n", "")))
      assert.equals(1, select(2, H.readfile(efile .. ".1"):gsub("\n", "")))
      assert.is_true(os.remove(efile))
      failing_chat(g)
      assert.equals(1, select(2, H.readfile(efile):gsub("\n", "")))
      H.stop(g)
      local f = io.open("/dev/full", "w")
      if not f then
        pending("no /dev/full")
        return
      end
      f:close()
      g = start_gateway(fallback_policy(fake.url, { max_attempts = 1 }), "--errors /dev/full")
      failing_chat(g)
      failing_chat(g)
      failing_chat(g)
      local _, metrics = H.request(dir, "GET", g.url .. "/metrics")
      assert.matches('openmesh_egress_errors_file_failures_total{op="write"} 3', metrics, 1, true)
      local _, logged = H.readfile(g.out):gsub('"event":"errors_file_failed"', "")
      assert.equals(1, logged)
      assert.matches("No space left on device", H.readfile(g.out), 1, true)
      H.stop(g)
    end)
  end)

  describe("POST /v1/chat/completions (Layer A)", function()
    it("answers with the provider's completion and sends each route's key", function()
      local st, body = chat("t1")
      assert.equals(200, st)
      local j = H.json(body)
      assert.equals("chat.completion", j.object)
      assert.matches("^Reply %d+ from t1_a%.$", j.choices[1].message.content)
      local _, last = H.request(dir, "GET", fake.url .. "/_last")
      last = H.json(last)
      assert.equals("Bearer sk-spec", last.authorization)
      assert.equals("gpt-fake", last.body.model)
    end)

    it("translates to Anthropic messages on an anthropic route (x-api-key, anthropic-version, system)", function()
      script("t2_a", { "401" })
      local st, body = chat("t2", { model = "x", messages = {
        { role = "system", content = "Be brief." }, { role = "user", content = "hi" } } })
      assert.equals(200, st)
      assert.matches("^Reply %d+ from t2_b%.$", H.json(body).choices[1].message.content)
      local _, last = H.request(dir, "GET", fake.url .. "/_last")
      last = H.json(last)
      assert.equals("ak-spec", last.x_api_key)
      assert.equals("2023-06-01", last.anthropic_version)
      assert.equals("Be brief.", last.body.system)
      assert.equals("claude-fake", last.body.model)
    end)

    it("abandons a stalled primary after one timeout when a fallback exists", function()
      script("t3_a", { "stall:ms=5000" })
      local st, body, elapsed = chat("t3")
      assert.equals(200, st)
      assert.matches("from t3_b", H.json(body).choices[1].message.content)
      assert.equals(1, counts().t3_a) -- one attempt, no retry of the timeout
      assert.is_true(elapsed < 2.5, "took " .. elapsed)
    end)

    it("retries a stalled route when it is the last (or only) one", function()
      script("t4_a", { "stall:ms=5000", "ok" })
      local st, body = chat("t4_solo")
      assert.equals(200, st)
      assert.matches("from t4_a", H.json(body).choices[1].message.content)
      assert.equals(2, counts().t4_a)
    end)

    it("clamps Retry-After 3600 and falls back at once instead of waiting", function()
      script("t5_a", { "429:ra=3600" })
      local st, body, elapsed = chat("t5")
      assert.equals(200, st)
      assert.matches("from t5_b", H.json(body).choices[1].message.content)
      assert.is_true(elapsed < 2, "took " .. elapsed)
      -- only route: the wait is clamped to the 300 ms ceiling, not 3 s
      script("t6_a", { "429:ra=3", "ok" })
      st, body, elapsed = chat("t6_solo")
      assert.equals(200, st)
      assert.is_true(elapsed < 2.5, "took " .. elapsed)
      assert.equals(2, counts().t6_a)
    end)

    it("honours retry-after-ms and retries a 5xx on the same route first", function()
      script("t7_a", { "503:ram=50", "500", "ok" })
      local st, body = chat("t7")
      assert.equals(200, st)
      assert.matches("from t7_a", H.json(body).choices[1].message.content)
      assert.equals(3, counts().t7_a)
      assert.is_nil(counts().t7_b)
    end)

    it("stops at a 400 validation error without trying another route", function()
      script("t8_a", { "400" })
      local st, body = chat("t8")
      assert.equals(400, st)
      local j = H.json(body)
      assert.equals("request_rejected", j.error.type)
      assert.is_nil(counts().t8_b)
      assert.is_nil(body:find("invalid_request_error", 1, true)) -- never the provider's text
    end)

    it("falls back on quota exhausted and context length exceeded, terminal for that route", function()
      script("t9_a", { "quota" })
      local st, body = chat("t9")
      assert.equals(200, st)
      assert.matches("from t9_b", H.json(body).choices[1].message.content)
      assert.equals(1, counts().t9_a)
      script("t10_a", { "ctx" })
      st, body = chat("t10")
      assert.equals(200, st)
      assert.matches("from t10_b", H.json(body).choices[1].message.content)
      assert.equals(1, counts().t10_a)
    end)

    it("x-should-retry: false stops retrying the route", function()
      script("t11_a", { "503:xsr=false" })
      local st, body = chat("t11")
      assert.equals(200, st)
      assert.equals(1, counts().t11_a)
    end)

    it("retries an empty completion and a length cut with no content moves on", function()
      script("t12_a", { "empty", "ok" })
      local st, body = chat("t12")
      assert.equals(200, st)
      assert.matches("from t12_a", H.json(body).choices[1].message.content)
      assert.equals(2, counts().t12_a)
      script("t13_a", { "length" })
      st, body = chat("t13")
      assert.equals(200, st)
      assert.matches("from t13_b", H.json(body).choices[1].message.content)
      assert.equals(1, counts().t13_a)
    end)

    it("repairs a tool call with invalid JSON once, in the same attempt", function()
      script("t14_a", { "badtool", "tool" })
      local st, body = chat("t14")
      assert.equals(200, st)
      local call = H.json(body).choices[1].message.tool_calls[1]
      assert.same({ order_id = 12 }, cjson.decode(call["function"].arguments))
      local _, last = H.request(dir, "GET", fake.url .. "/_last")
      local msgs = H.json(last).body.messages
      assert.matches("not valid JSON", msgs[#msgs].content, 1, true) -- the correction
      -- still broken after the repair: retryable, the next attempt succeeds
      script("t15_a", { "badtool", "badtool", "ok" })
      st, body = chat("t15")
      assert.equals(200, st)
      assert.equals(3, counts().t15_a)
    end)

    it("resets and refused connections are retried and fall back", function()
      -- (a request on a reused connection closed before any byte is re-sent
      -- once on a fresh one, so an attempt may consume two resets)
      script("t16_a", { "reset", "reset", "reset", "reset", "reset", "reset" })
      local st, body = chat("t16")
      assert.equals(200, st)
      assert.matches("from t16_b", H.json(body).choices[1].message.content)
    end)

    it("answers a structured error with a stable type when every route fails", function()
      script("t17_a", { "500", "500", "500" })
      script("t17_b", { "529", "529", "529" })
      local st, body, _, headers = chat("t17")
      assert.equals(502, st)
      -- the gateway already retried and fell back: the caller's SDK must
      -- not run the chain again
      assert.equals("false", headers["x-should-retry"])
      assert.is_nil(headers["retry-after"])
      local j = H.json(body)
      assert.equals("all_routes_failed", j.error.type)
      assert.equals(6, #j.error.attempts)
      assert.equals("t17_a", j.error.attempts[1].route)
      assert.equals("server_error", j.error.attempts[1].class)
      assert.equals("overloaded", j.error.attempts[6].class)
      assert.is_nil(body:find("The server had an error", 1, true))
    end)

    it("says x-should-retry: false on its own refusals", function()
      local st, _, h = H.request(dir, "POST", gw.url .. "/v1/chat/completions", { body = "{" })
      assert.equals(400, st)
      assert.equals("false", h["x-should-retry"])
    end)

    it("puts an X-Request-Id on every answer, the caller's when it sent one", function()
      local body = cjson.encode({ model = "any", messages = { { role = "user", content = "hi" } } })
      local st, _, h = H.request(dir, "POST", gw.url .. "/v1/chat/completions",
        { body = body, headers = { "x-openmesh-agent: t0", "X-Request-Id: caller-42" } })
      assert.equals(200, st)
      assert.equals("caller-42", h["x-request-id"])
      local seen = {}
      for _, b in ipairs({ body, "{" }) do
        st, _, h = H.request(dir, "POST", gw.url .. "/v1/chat/completions", { body = b })
        assert.matches("^%x+$", h["x-request-id"] or "", 1)
        assert.equals(32, #h["x-request-id"])
        assert.is_nil(seen[h["x-request-id"]], "an id twice")
        seen[h["x-request-id"]] = true
      end
      -- one the gateway would not echo (a space) is replaced
      st, _, h = H.request(dir, "POST", gw.url .. "/v1/chat/completions",
        { body = "{", headers = { "X-Request-Id: two words" } })
      assert.equals(32, #h["x-request-id"])
      -- streamed answers too
      st, _, h = H.request(dir, "POST", gw.url .. "/v1/chat/completions",
        { body = cjson.encode({ model = "any", stream = true, messages = { { role = "user", content = "hi" } } }),
          headers = { "x-openmesh-agent: t0", "X-Request-Id: s-1" } })
      assert.equals(200, st)
      assert.equals("s-1", h["x-request-id"])
    end)

    it("answers 401 when every route refuses the key, 429 insufficient_quota when every quota is spent", function()
      script("t29_a", { "401" })
      script("t29_b", { "401" })
      local st, body, _, headers = chat("t29")
      assert.equals(401, st)
      assert.equals("authentication_failed", H.json(body).error.type)
      assert.equals("false", headers["x-should-retry"])
      assert.equals(1, counts().t29_a)
      assert.equals(1, counts().t29_b)
      script("t39_a", { "quota" })
      script("t39_b", { "quota" })
      st, body, _, headers = chat("t39")
      assert.equals(429, st)
      assert.equals("insufficient_quota", H.json(body).error.type)
      assert.equals("false", headers["x-should-retry"])
      -- one route's key refused, the other's quota spent: the last decides
      script("t29_a", { "403" })
      script("t29_b", { "quota" })
      st, body = chat("t29")
      assert.equals(429, st)
      assert.equals("insufficient_quota", H.json(body).error.type)
      -- one terminal cause among transient ones: not the caller's to fix
      script("t39_a", { "401" })
      script("t39_b", { "500", "500", "500" })
      st, body, _, headers = chat("t39")
      assert.equals(502, st)
      assert.equals("all_routes_failed", H.json(body).error.type)
      assert.equals("false", headers["x-should-retry"])
    end)

    it("says when to come back when every route asked for a wait", function()
      script("t40_a", { "429:ra=5" })
      script("t40_b", { "503:ra=4", "503:ra=4", "503:ra=4" })
      local st, body, _, headers = chat("t40")
      assert.equals(429, st)
      assert.equals("rate_limited", H.json(body).error.type)
      assert.equals("true", headers["x-should-retry"])
      local ra = tonumber(headers["retry-after"])
      assert.is_truthy(ra and ra >= 1 and ra <= 4, "Retry-After " .. tostring(headers["retry-after"]))
      -- a wait beyond a minute is no help to a caller
      script("t40_a", { "429:ra=3600" })
      script("t40_b", { "503:ra=3600", "503:ra=3600", "503:ra=3600" })
      st, body, _, headers = chat("t40")
      assert.equals(502, st)
      assert.equals("false", headers["x-should-retry"])
    end)

    it("refuses malformed and hostile bodies with 400 invalid_request", function()
      for _, b in ipairs({ "", "{", "[]", '{"messages": []}', '{"messages": "hi"}',
        '{"messages": [{"content": "no role"}]}', '{"messages": [{"role": "user"}], "stream": "yes"}',
        '{"a": 1, "a": 2}', string.rep("[", 100000) }) do
        local st, body = H.request(dir, "POST", gw.url .. "/v1/chat/completions", { body = b })
        assert.equals(400, st, b:sub(1, 40))
        assert.equals("invalid_request", H.json(body).error.type)
      end
      local st = H.request(dir, "POST", gw.url .. "/v1/chat/completions",
        { body = '{"messages":[{"role":"user","content":"' .. string.rep("x", 2 * 1024 * 1024) .. '"}]}' })
      assert.equals(413, st)
      st = H.request(dir, "GET", gw.url .. "/v1/chat/completions")
      assert.equals(405, st)
    end)
  end)

  describe("provider connections", function()
    -- routes named by host: looked up off the loop, every address tried
    local named
    setup(function()
      local port = fake.url:match(":(%d+)$")
      named = start_gateway(string.format([[
return {
  kind = "fallback",
  routes = {
    { name = "gone", provider = "openai", base_url = "http://no-such-host.invalid:%s/gone/v1", model = "gpt-fake", attempt_timeout_ms = 1500 },
    { name = "byname", provider = "openai", base_url = "http://localhost:%s/byname/v1", model = "gpt-fake", attempt_timeout_ms = 1500 },
  },
  max_attempts = 2, backoff_base_ms = 5, backoff_cap_ms = 10,
}
]], port, port))
    end)

    local function ask()
      return H.request(dir, "POST", named.url .. "/v1/chat/completions",
        { body = cjson.encode({ model = "any", messages = { { role = "user", content = "hi" } } }), max_time = 10 })
    end

    it("says which name did not resolve, and only to the operator", function()
      script("byname", { "500", "500" })
      local st, body = ask()
      assert.equals(502, st, body)
      local j = H.json(body)
      assert.equals("gone", j.error.attempts[1].route)
      assert.equals("connection_refused", j.error.attempts[1].class)
      assert.is_nil(body:find("no-such-host", 1, true), body)
      local log = H.readfile(named.out)
      assert.truthy(log:find('"event":"egress_resolve_failed","host":"no-such-host.invalid"', 1, true), log)
    end)

    it("calls a route by name, and one whose name does not resolve falls back", function()
      local before = counts().byname or 0
      for _ = 1, 3 do
        local st, body = ask()
        assert.equals(200, st, body)
        assert.matches("from byname%.$", H.json(body).choices[1].message.content)
      end
      local c = counts()
      assert.equals(before + 3, c.byname, cjson.encode(c))
      assert.is_nil(c.gone, "a call reached the unresolvable route")
    end)

    it("tries a name's next address when one refuses, within the same attempt", function()
      -- the test hook answers for the name: 127.0.0.2 first (nothing
      -- listens there), then the fake provider's 127.0.0.1
      local port = fake.url:match(":(%d+)$")
      H.writefile(dir .. "/hosts", "127.0.0.2 twoaddr\n127.0.0.1 twoaddr other\n")
      H.writefile(dir .. "/fallback_two.lua", string.format([[
return {
  kind = "fallback",
  routes = {
    { name = "two", provider = "openai", base_url = "http://twoaddr:%s/two/v1", model = "gpt-fake", attempt_timeout_ms = 1500 },
  },
  max_attempts = 1,
}
]], port))
      local g = H.start_egress(dir, "egress_two", string.format("--fallback %s --heuristics %s",
        H.q(dir .. "/fallback_two.lua"), H.q(dir .. "/heuristics.lua")),
        "OPENMESH_RESOLVE_HOSTS=" .. H.q(dir .. "/hosts"))
      for _ = 1, 2 do
        local st, body = H.request(dir, "POST", g.url .. "/v1/chat/completions",
          { body = cjson.encode({ model = "any", messages = { { role = "user", content = "hi" } } }), max_time = 10 })
        assert.equals(200, st, body)
        assert.matches("from two%.$", H.json(body).choices[1].message.content)
      end
      local _, m = H.request(dir, "GET", g.url .. "/metrics")
      assert.truthy(m:find('openmesh_egress_route_attempts_total{route="two",class="ok",status="200"} 2', 1, true), m)
      assert.is_nil(m:find('route="two",class="connection_refused"', 1, true), m)
    end)

    it("refuses a base_url the mesh's URL rule does not accept, naming the field", function()
      local n = math.random(1e6)
      local path = dir .. "/badurl" .. n .. ".lua"
      H.writefile(path, [[
return { kind = "fallback", routes = {
  { name = "q", provider = "openai", base_url = "http://127.0.0.1:1/v1?x=1", model = "m" } } }
]])
      local out, rc = H.sh(string.format("timeout 5 %s egress --listen 127.0.0.1:0 --fallback %s --heuristics %s 2>&1",
        H.q(H.bin), H.q(path), H.q(dir .. "/heuristics.lua")))
      assert.equals(2, rc, out)
      assert.truthy(out:find("routes[1].base_url", 1, true), out)
    end)
  end)

  describe("pass-through (every route OpenAI)", function()
    local pt
    setup(function()
      pt = start_gateway(string.format([[
return {
  kind = "fallback",
  routes = {
    { name = "pa", provider = "openai", base_url = "%s/pa/v1", model = "gpt-route", api_key_env = "OM_SPEC_OPENAI_KEY", attempt_timeout_ms = 1500 },
    { name = "pb", provider = "openai", base_url = "%s/pb/v1", model = "gpt-route-b", api_key_env = "OM_SPEC_OPENAI_KEY", attempt_timeout_ms = 1500 },
  },
  max_attempts = 2, backoff_base_ms = 5, backoff_cap_ms = 10,
}
]], fake.url, fake.url))
    end)

    local function post(body, max_time)
      return H.request(dir, "POST", pt.url .. "/v1/chat/completions",
        { body = body, max_time = max_time or 10 })
    end

    local function last_body()
      local _, last = H.request(dir, "GET", fake.url .. "/_last")
      return H.json(last).body
    end

    it("sends the caller's fields as they came, with the route's model", function()
      local st, body = post([[{ "messages" : [{"role":"user","content":"caf\u00e9 \"q\"\n"}],
        "model":"any", "temperature":0.25, "user":"u-1", "vendor_x":{"a":[1,2,{"b":null}]},
        "stream":false, "max_tokens":7 }]])
      assert.equals(200, st, body)
      assert.matches("from pa%.$", H.json(body).choices[1].message.content)
      local b = last_body()
      assert.equals("gpt-route", b.model)
      assert.equals(0.25, b.temperature)
      assert.equals("u-1", b.user)
      assert.equals(7, b.max_tokens)
      assert.same({ a = { 1, 2, { b = cjson.null } } }, b.vendor_x)
      assert.equals('café "q"\n', b.messages[1].content)
      assert.is_nil(b.stream, "stream: false is not sent")
      -- the answer is the provider's as it came
      assert.equals("chatcmpl-fake", H.json(body).id)
    end)

    it("asks a streamed call for usage, keeping a caller's own stream_options", function()
      local out = H.sh(string.format("%s -s -N -X POST --data-binary %s %s", H.curl(10),
        H.q('{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'),
        H.q(pt.url .. "/v1/chat/completions")))
      assert.truthy(out:find("data: [DONE]", 1, true), out)
      local b = last_body()
      assert.is_true(b.stream)
      assert.is_true(b.stream_options.include_usage)
      assert.equals("gpt-route", b.model)
      out = H.sh(string.format("%s -s -N -X POST --data-binary %s %s", H.curl(10),
        H.q('{"model":"m","stream":true,"stream_options":{"include_usage":false,"x_keep":1},"messages":[{"role":"user","content":"hi"}]}'),
        H.q(pt.url .. "/v1/chat/completions")))
      assert.truthy(out:find("data: [DONE]", 1, true), out)
      assert.is_nil(out:find('"choices":[]', 1, true), "a usage chunk the caller did not ask for: " .. out)
      b = last_body()
      assert.is_true(b.stream_options.include_usage)
      assert.equals(1, b.stream_options.x_keep)
    end)

    it("refuses what the tree path refuses, naming the field, and forwards nothing", function()
      local before = counts().pa or 0
      local cases = {
        { '{"model":"a","model":"b","messages":[{"role":"user","content":"hi"}]}', "not valid JSON" },
        { '{"messages":[]}', "'messages'" },
        { '{"messages":[{"content":"hi"}]}', "'messages'" },
        { '{"messages":[{"role":1}]}', "'messages'" },
        { '{"messages":[{"role":"user"}],"stream":"yes"}', "'stream'" },
        { '{"messages":[{"role":"user"}],"model":7}', "'model'" },
        { '{"messages":[{"role":"user","content":"\\ud800"}]}', "not valid JSON" },
        { '{"messages":[{"role":"user"}]} x', "not valid JSON" },
        { '[{"messages":[]}]', "a JSON object" },
      }
      for _, case in ipairs(cases) do
        local st, body = post(case[1])
        assert.equals(400, st, case[1] .. " -> " .. body)
        assert.truthy(body:find(case[2], 1, true), case[1] .. " -> " .. body)
      end
      assert.equals(before, counts().pa or 0, "a refused request reached the provider")
    end)
  end)

  describe("streaming", function()
    local function stream(agent)
      local out = H.sh(string.format(
        "%s -s -N -X POST -H 'x-openmesh-agent: %s' --data-binary %s %s",
        H.curl(10), agent, H.q(cjson.encode({ model = "x", stream = true,
          messages = { { role = "user", content = "hi" } } })), H.q(gw.url .. "/v1/chat/completions")))
      return H.parse_sse(out), out
    end

    it("passes an OpenAI route's stream through as sent; its usage chunk only when the caller asked", function()
      local function run(extra)
        local body = { model = "x", stream = true, messages = { { role = "user", content = "hi" } } }
        for k, v in pairs(extra or {}) do body[k] = v end
        local out = H.sh(string.format(
          "%s -s -N -X POST -H 'x-openmesh-agent: t50_solo' --data-binary %s %s",
          H.curl(10), H.q(cjson.encode(body)), H.q(gw.url .. "/v1/chat/completions")))
        local chunks, usage, done = {}, 0, 0
        for _, e in ipairs(H.parse_sse(out)) do
          if e.data == "[DONE]" then
            done = done + 1
          else
            local j = cjson.decode(e.data)
            chunks[#chunks + 1] = j
            if j.usage then usage = usage + 1 end
          end
        end
        return chunks, usage, done, out
      end
      local chunks, usage, done, out = run()
      assert.equals(1, done, out)
      assert.equals(0, usage, out)
      -- the provider's own chunks: its id and model, its role chunk first
      for _, j in ipairs(chunks) do
        assert.equals("chatcmpl-fake", j.id, out)
        assert.equals("gpt-fake", j.model, out)
      end
      assert.equals("assistant", chunks[1].choices[1].delta.role, out)
      assert.equals("stop", chunks[#chunks].choices[1].finish_reason, out)
      -- the gateway asked the provider for usage either way
      local _, last = H.request(dir, "GET", fake.url .. "/_last")
      assert.is_true(H.json(last).body.stream_options.include_usage, last)
      chunks, usage, done, out = run({ stream_options = { include_usage = true } })
      assert.equals(1, done, out)
      assert.equals(1, usage, out)
      assert.equals(0, #chunks[#chunks].choices, out)
      assert.is_true(chunks[#chunks].usage.completion_tokens > 0, out)
    end)

    it("stops reading the provider while a caller does not read the stream", function()
      -- a long stream (about 10 MB of events) to a caller that reads
      -- nothing: the gateway may hold a few hundred KiB for it, not the
      -- stream (without the pause it grows by more than the stream)
      script("t51_a", { "ok:repeat=20000" })
      local client = dir .. "/never_reads.py"
      H.writefile(client, [[
import socket, sys, time
pid, port = sys.argv[1], int(sys.argv[2])
def rss():
    for line in open("/proc/%s/status" % pid):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
body = b'{"model":"x","stream":true,"messages":[{"role":"user","content":"hi"}]}'
s = socket.create_connection(("127.0.0.1", port))
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
before = rss()
s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-openmesh-agent: t51_solo\r\n"
          b"Content-Length: %d\r\n\r\n" % len(body) + body)
time.sleep(1.0)
print("grew_kib", rss() - before)
s.close()
]])
      local out = H.sh(string.format("python3 %s %d %s", H.q(client), gw.pid, gw.url:match(":(%d+)$")))
      local grew = tonumber(out:match("grew_kib (%-?%d+)"))
      assert(grew, out)
      print(("# a never-reading stream caller: gateway RSS grew %d KiB"):format(grew))
      assert.is_true(grew < 4096, "the gateway held " .. grew .. " KiB for a caller that reads nothing")
      -- and the gateway still serves, once the fake provider (one loop,
      -- busy writing that stream) answers again
      local st = H.wait_for(function()
        local code = chat("t51")
        if code == 200 then return code end
      end, 20)
      assert.equals(200, st)
    end)

    it("holds the response until the first content delta: a stream that dies before it is retried", function()
      script("t18_a", { "die_before", "ok" })
      local events, raw = stream("t18")
      local text = {}
      for _, e in ipairs(events) do
        if e.data ~= "[DONE]" then
          local j = cjson.decode(e.data)
          assert.is_nil(j.error)
          text[#text + 1] = j.choices[1].delta.content or ""
        end
      end
      assert.matches("^Reply %d+ from t18_a%.$", table.concat(text))
      assert.equals("[DONE]", events[#events].data, raw)
      assert.equals(2, counts().t18_a)
    end)

    it("falls back to the Anthropic stream when the first route cannot start one", function()
      script("t19_a", { "503", "503", "503" })
      local events = stream("t19")
      local text = {}
      for _, e in ipairs(events) do
        if e.data ~= "[DONE]" then
          text[#text + 1] = cjson.decode(e.data).choices[1].delta.content or ""
        end
      end
      assert.matches("from t19_b", table.concat(text))
    end)

    it("never replays a committed stream: a failure after the first delta ends it with an error event", function()
      script("t20_a", { "die_after", "ok" })
      local events = stream("t20")
      local last = events[#events]
      assert.equals("error", last.type)
      assert.equals("stream_interrupted", cjson.decode(last.data).error.type)
      for _, e in ipairs(events) do
        assert.is_not.equals("[DONE]", e.data)
      end
      assert.equals(1, counts().t20_a)
      assert.is_nil(counts().t20_b)
    end)

    -- The tool calls the caller rebuilt from the chunks (OpenAI streaming:
    -- the first delta of a call has id, type, name; later ones argument
    -- fragments), the content, the finish reason and whether [DONE] came.
    local function rebuild(events)
      local calls, text, finish, done = {}, {}, nil, false
      for _, e in ipairs(events) do
        if e.data == "[DONE]" then
          done = true
        elseif e.type == "message" then
          local j = cjson.decode(e.data)
          assert.equals("chat.completion.chunk", j.object)
          local choice = j.choices[1]
          local d = choice.delta
          if type(d.content) == "string" then text[#text + 1] = d.content end
          for _, tc in ipairs(d.tool_calls or {}) do
            assert.is_number(tc.index)
            local c = calls[tc.index + 1]
            if not c then
              -- the first delta of a call introduces it, in order
              assert.equals(#calls, tc.index)
              assert.is_string(tc.id)
              assert.equals("function", tc.type)
              assert.is_string(tc["function"].name)
              c = { id = tc.id, name = tc["function"].name, args = {} }
              calls[tc.index + 1] = c
            else
              assert.is_nil(tc.id)
            end
            if tc["function"] and type(tc["function"].arguments) == "string" then
              c.args[#c.args + 1] = tc["function"].arguments
            end
          end
          if type(choice.finish_reason) == "string" then finish = choice.finish_reason end
        end
      end
      for _, c in ipairs(calls) do
        c.pieces = #c.args
        c.args = table.concat(c.args)
      end
      return calls, table.concat(text), finish, done
    end

    it("passes an OpenAI route's streamed tool calls through, chunk by chunk", function()
      script("t35_a", { "tool" })
      local events, raw = stream("t35")
      local calls, text, finish, done = rebuild(events)
      assert.is_true(done, raw)
      assert.equals("tool_calls", finish)
      assert.equals("", text)
      assert.equals(2, #calls, raw)
      assert.same({ "call_1", "lookup_order" }, { calls[1].id, calls[1].name })
      assert.same({ order_id = 12 }, cjson.decode(calls[1].args))
      assert.is_true(calls[1].pieces >= 2) -- fragments are forwarded, not buffered
      assert.same({ "call_2", "get_status" }, { calls[2].id, calls[2].name })
      assert.same({ ticket = "A-7" }, cjson.decode(calls[2].args))
      assert.equals(1, counts().t35_a)
    end)

    it("translates an Anthropic route's tool_use stream into OpenAI tool_calls deltas", function()
      script("t36_a", { "503", "503", "503" })
      script("t36_b", { "tool" })
      local events, raw = stream("t36")
      local calls, text, finish, done = rebuild(events)
      assert.is_true(done, raw)
      assert.equals("tool_calls", finish) -- from stop_reason tool_use
      assert.equals("Let me check.", text)
      assert.equals(2, #calls, raw) -- content blocks 1 and 2 are tool calls 0 and 1
      assert.same({ "toolu_1", "lookup_order" }, { calls[1].id, calls[1].name })
      assert.same({ order_id = 12 }, cjson.decode(calls[1].args))
      assert.same({ "toolu_2", "get_status" }, { calls[2].id, calls[2].name })
      assert.same({ ticket = "A-7" }, cjson.decode(calls[2].args))
      assert.is_nil(raw:find("input_json_delta", 1, true))
      assert.is_nil(raw:find("content_block", 1, true))
      assert.equals(1, counts().t36_b)
    end)

    it("a tool-call delta commits the stream: a failure after it is never replayed (both providers)", function()
      script("t37_a", { "tool_die", "ok" })
      local events, raw = stream("t37")
      local calls, _, _, done = rebuild(events)
      assert.is_false(done, raw)
      assert.equals(1, #calls)
      assert.equals("lookup_order", calls[1].name)
      assert.equals("error", events[#events].type)
      assert.equals("stream_interrupted", cjson.decode(events[#events].data).error.type)
      assert.equals(1, counts().t37_a)
      assert.is_nil(counts().t37_b)

      script("t38_a", { "503", "503", "503" })
      script("t38_b", { "tool_die", "ok" })
      events, raw = stream("t38")
      calls, _, _, done = rebuild(events)
      assert.is_false(done, raw)
      assert.equals(1, #calls)
      assert.equals("toolu_1", calls[1].id)
      assert.equals("error", events[#events].type)
      assert.equals(1, counts().t38_b)
    end)
  end)

  describe("route cooldown from the fallback policy", function()
    it("a policy's shorter cooldown takes effect: one failure cools the route, 1 s later it is tried again", function()
      -- defaults (3 failures, 2 s) would try t27_a on the second call and
      -- skip it on the third. The second call must come within the 1 s
      -- cooldown of the first failure: 1 s leaves room for a loaded,
      -- sanitized run (300 ms did not).
      local cgw = start_gateway(fallback_policy(fake.url, { max_attempts = 1,
        extra = "cooldown_after_failures = 1, cooldown_ms = 1000, cooldown_max_ms = 1000," }))
      local function call()
        local st, body = H.request(dir, "POST", cgw.url .. "/v1/chat/completions",
          { body = cjson.encode({ model = "x", messages = { { role = "user", content = "hi" } } }),
            headers = { "x-openmesh-agent: t27" }, max_time = 10 })
        assert.equals(200, st, body)
        return H.json(body).choices[1].message.content
      end
      script("t27_a", { "503" })
      assert.matches("from t27_b", call())
      assert.equals(1, counts().t27_a)
      assert.matches("from t27_b", call()) -- t27_a cooling after one failure
      assert.equals(1, counts().t27_a)
      local _, metrics = H.request(dir, "GET", cgw.url .. "/metrics")
      assert.matches("openmesh_egress_cooldown_skips_total 1", metrics, 1, true)
      H.sleep(1.2)
      assert.matches("from t27_a", call()) -- the 1 s is over
      assert.equals(2, counts().t27_a)
      H.stop(cgw)
    end)
  end)

  describe("POST /v1/turns (Layer B, Layer C)", function()
    it("delivers the reply to the channel and says so, with the attempts", function()
      local st, body = turn({ agent = "t21", conversation = "conv-21", run_id = "run-21", context = "interactive" })
      assert.equals(200, st)
      local j = H.json(body)
      assert.equals("delivered", j.outcome)
      assert.equals(1, #j.attempts)
      assert.equals("t21_a", j.attempts[1].route)
      assert.equals(cjson.null, j.error_id)
      local msgs = H.wait_for(function()
        local m = for_conversation("conv-21")
        return #m > 0 and m
      end, 5)
      assert.same({ msgs[1] }, msgs)
      assert.matches("^Reply %d+ from t21_a%.$", msgs[1])
    end)

    it("never delivers a POSTed turn twice (same run, or same Idempotency-Key)", function()
      local f = { agent = "t22", conversation = "conv-22", run_id = "run-22", context = "interactive" }
      local _, b1 = turn(f)
      local _, b2 = turn(f)
      assert.equals(H.json(b1).turn_id, H.json(b2).turn_id)
      assert.is_true(H.json(b2).replayed)
      local g = { agent = "t22", conversation = "conv-22b", context = "async" }
      turn(g, { "Idempotency-Key: k-22" })
      turn(g, { "Idempotency-Key: k-22" })
      H.sleep(0.5)
      assert.equals(1, #for_conversation("conv-22"))
      assert.equals(1, #for_conversation("conv-22b"))
      assert.equals(2, counts().t22_a)
    end)

    it("async: nothing is sent, the turn is pending and retried on the next cycle", function()
      local fail = {}
      for i = 1, 6 do fail[i] = "500" end
      script("t23_a", fail)
      script("t23_b", { "500", "500", "500" })
      local st, body = turn({ agent = "t23", conversation = "conv-23", run_id = "run-23", context = "async" })
      assert.equals(200, st)
      local j = H.json(body)
      assert.equals("silent", j.outcome)
      assert.is_string(j.error_id)
      assert.equals(0, #for_conversation("conv-23"))
      local _, pend = H.request(dir, "GET", gw.url .. "/v1/pending")
      local found
      for _, p in ipairs(H.json(pend).pending) do
        if p.turn_id == j.turn_id then found = p end
      end
      assert.is_table(found)
      assert.equals("run-23", found.run_id)
      -- the provider recovers: the next cycle delivers, exactly once
      local msgs = H.wait_for(function()
        local m = for_conversation("conv-23")
        return #m > 0 and m
      end, 8)
      assert.is_table(msgs)
      H.sleep(0.4)
      assert.equals(1, #for_conversation("conv-23"))
      -- first silent, later delivered: the turn's end is in the log (with
      -- its id) and in the metric
      local ended = H.wait_for(function()
        for l in H.readfile(gw.out):gmatch("[^\n]+") do
          if l:find('"event":"egress_turn_end","turn_id":"' .. j.turn_id .. '"', 1, true) then
            return cjson.decode(l)
          end
        end
      end, 5)
      assert.is_table(ended)
      assert.equals("silent", ended.first)
      assert.equals("delivered", ended["end"])
      assert.equals("async", ended.context)
      local _, metrics = H.request(dir, "GET", gw.url .. "/metrics")
      local n = tonumber(metrics:match('openmesh_egress_turn_ends_total{first="silent",end="delivered"} (%d+)'))
      assert.is_true((n or 0) >= 1, "silent->delivered turn ends: " .. tostring(n))
      -- the errors file has the cause, attributed, with every attempt
      local line
      for l in H.readfile(errfile):gmatch("[^\n]+") do
        local e = cjson.decode(l)
        if e.error_id == j.error_id then line = e end
      end
      assert.is_table(line)
      assert.equals("t23", line.agent)
      assert.equals("conv-23", line.conversation)
      assert.equals("run-23", line.run_id)
      assert.equals(6, #line.attempts)
      assert.matches("HTTP 500", line.cause, 1, true)
    end)

    it("interactive: a holding line, then the real answer from the background retry", function()
      local fail = {}
      for i = 1, 6 do fail[i] = "503" end
      script("t24_a", fail)
      script("t24_b", { "529", "529", "529" })
      local st, body = turn({ agent = "t24", conversation = "conv-24", context = "interactive" })
      assert.equals(200, st)
      assert.equals("held", H.json(body).outcome)
      local msgs = H.wait_for(function()
        local m = for_conversation("conv-24")
        return #m >= 2 and m
      end, 8)
      assert.is_table(msgs)
      assert.equals(HOLDING, msgs[1])
      assert.matches("^Reply %d+ from t24_", msgs[2])
      H.sleep(0.5)
      assert.equals(2, #for_conversation("conv-24"))
    end)

    it("interactive: the handoff message when the commitment runs out, never the error", function()
      local fail = {}
      for i = 1, 200 do fail[i] = "500" end
      script("t25_a", fail)
      script("t25_b", fail)
      local st, body = turn({ agent = "t25", conversation = "conv-25", context = "interactive" })
      assert.equals("held", H.json(body).outcome)
      local msgs = H.wait_for(function()
        local m = for_conversation("conv-25")
        return #m >= 2 and m
      end, 10)
      assert.same({ HOLDING, HANDOFF }, msgs)
      -- a terminal failure hands off at once
      script("t26_a", { "400" })
      st, body = turn({ agent = "t26", conversation = "conv-26", context = "interactive" })
      assert.equals("handed_off", H.json(body).outcome)
      msgs = H.wait_for(function()
        local m = for_conversation("conv-26")
        return #m >= 1 and m
      end, 5)
      assert.same({ HANDOFF }, msgs)
    end)

    it("refuses malformed turns naming the field", function()
      local cases = {
        { {}, "agent" },
        { { agent = "a" }, "conversation" },
        { { agent = "a", conversation = "c", context = "later" }, "context" },
        { { agent = "a", conversation = "c", context = "async", channel = "nowhere" }, "channel" },
        { { agent = "a", conversation = "c", context = "async", channel = "user", request = {} }, "request" },
        { { agent = string.rep("a", 300), conversation = "c" }, "agent" },
        { { agent = "a\1b", conversation = "c" }, "agent" },
        { { agent = "a", conversation = "c", run_id = 5, context = "async" }, "run_id" },
      }
      for _, c in ipairs(cases) do
        local st, body = H.request(dir, "POST", gw.url .. "/v1/turns", { body = cjson.encode(c[1]) })
        assert.equals(400, st)
        assert.matches(c[2], H.json(body).error.message, 1, true)
      end
      local st = H.request(dir, "POST", gw.url .. "/v1/turns", { body = "{{{" })
      assert.equals(400, st)
    end)
  end)

  describe("the quality gate (agents t30..t34 opted in)", function()
    it("sends an unflagged reply without asking the judge", function()
      local st, body = turn({ agent = "t30", conversation = "conv-30", context = "interactive" })
      assert.equals("delivered", H.json(body).outcome)
      assert.is_nil(counts().judge)
    end)

    it("high confidence + judge failure: never sent as is; the sanitized remainder is", function()
      script("t31_a", { "ok:text=<thinking>the secret plan</thinking>Your order shipped today." })
      script("judge", { "500" })
      local st, body = turn({ agent = "t31", conversation = "conv-31", context = "interactive" })
      assert.equals("delivered", H.json(body).outcome)
      local msgs = H.wait_for(function()
        local m = for_conversation("conv-31")
        return #m >= 1 and m
      end, 5)
      assert.same({ "Your order shipped today." }, msgs)
    end)

    it("high confidence with nothing left after sanitizing goes to Layer C, and the judge's failure is not a second error", function()
      script("t32_a", { "ok:text=%22error%22%3A 503", "ok" })
      script("judge", { "stall:ms=3000" })
      local st, body = turn({ agent = "t32", conversation = "conv-32", context = "interactive" })
      local j = H.json(body)
      assert.equals("held", j.outcome)
      local msgs = H.wait_for(function()
        local m = for_conversation("conv-32")
        return #m >= 2 and m
      end, 8)
      assert.equals(HOLDING, msgs[1])
      assert.matches("^Reply %d+ from t32_a%.$", msgs[2])
      for _, m in ipairs(msgs) do
        assert.is_nil(m:find("error", 1, true))
      end
    end)

    it("low confidence + judge failure: sent and marked for review; the judge may block", function()
      script("t33_a", { "ok:text=As an AI language model%2C I think it shipped." })
      script("judge", { "reset" })
      local _, body = turn({ agent = "t33", conversation = "conv-33", context = "interactive" })
      local j = H.json(body)
      assert.equals("delivered", j.outcome)
      assert.is_true(j.review)
      script("t34_a", { "ok:text=As an AI language model I cannot say.", "ok" })
      script("judge", { "ok:text=BLOCK" })
      _, body = turn({ agent = "t34", conversation = "conv-34", context = "async" })
      assert.equals("silent", H.json(body).outcome)
      local msgs = H.wait_for(function()
        local m = for_conversation("conv-34")
        return #m >= 1 and m
      end, 8)
      assert.matches("^Reply %d+ from t34_a%.$", msgs[1])
    end)
  end)

  describe("translation to Anthropic messages (agents t41..t48)", function()
    local TOOLS = {
      { type = "function", ["function"] = { name = "lookup_order", description = "Find an order by id.",
        parameters = { type = "object", properties = { order_id = { type = "integer" } }, required = { "order_id" } } } },
      { type = "function", ["function"] = { name = "get_status",
        parameters = { type = "object", properties = { ticket = { type = "string" } } } } },
    }

    local function last_request()
      local _, last = H.request(dir, "GET", fake.url .. "/_last")
      return H.json(last)
    end

    it("a two-turn tool loop falls back from an OpenAI route to an Anthropic route on turn 2", function()
      script("t41_a", { "tool", "401" })
      local msgs = { { role = "system", content = "You look orders up." },
        { role = "user", content = "Where is order 12?" } }
      local st, body = chat("t41", { model = "x", messages = msgs, tools = TOOLS })
      assert.equals(200, st, body)
      local m1 = H.json(body).choices[1].message
      assert.equals("call_1", m1.tool_calls[1].id)
      -- turn 2: the assistant turn with its tool call, the tool's result
      msgs[#msgs + 1] = m1
      msgs[#msgs + 1] = { role = "tool", tool_call_id = "call_1", content = '{"status":"shipped"}' }
      st, body = chat("t41", { model = "x", messages = msgs, tools = TOOLS })
      assert.equals(200, st, body)
      assert.matches("^Reply %d+ from t41_b%.$", H.json(body).choices[1].message.content)
      local last = last_request()
      assert.equals("t41_b", last.route)
      local b = last.body
      assert.equals("You look orders up.", b.system)
      assert.equals(3, #b.messages)
      assert.same({ "user", "assistant", "user" }, { b.messages[1].role, b.messages[2].role, b.messages[3].role })
      assert.same({ { type = "tool_use", id = "call_1", name = "lookup_order", input = { order_id = 12 } } },
        b.messages[2].content)
      assert.same({ { type = "tool_result", tool_use_id = "call_1", content = '{"status":"shipped"}' } },
        b.messages[3].content)
      assert.equals("Find an order by id.", b.tools[1].description)
      assert.is_nil(b.tools[2].description) -- omitted, not null
      assert.same(TOOLS[1]["function"].parameters, b.tools[1].input_schema)
      assert.equals(1024, b.max_tokens) -- the default
    end)

    it("merges tool results and the next user text into one user turn and drops an empty assistant turn", function()
      script("t41_a", { "401" })
      local st, body = chat("t41", { model = "x", tools = TOOLS, messages = {
        { role = "user", content = "Check both." },
        { role = "assistant", content = "", tool_calls = {
          { id = "c1", type = "function", ["function"] = { name = "lookup_order", arguments = '{"order_id":1}' } },
          { id = "c2", type = "function", ["function"] = { name = "get_status", arguments = '{"ticket":"A"}' } } } },
        { role = "tool", tool_call_id = "c1", content = "one" },
        { role = "tool", tool_call_id = "c2", content = { { type = "text", text = "two" } } },
        { role = "user", content = "And?" },
        { role = "assistant", content = "" },
        { role = "user", content = "Well?" } } })
      assert.equals(200, st, body)
      local b = last_request().body
      assert.equals(3, #b.messages)
      local u = b.messages[3].content
      assert.same({ "tool_result", "tool_result", "text", "text" }, { u[1].type, u[2].type, u[3].type, u[4].type })
      assert.equals("c2", u[2].tool_use_id)
      assert.equals("two", u[2].content)
      assert.equals("Well?", u[4].text)
    end)

    it("translates images: a data: URL to a base64 source, an https URL to a url source", function()
      script("t42_a", { "401" })
      local st, body = chat("t42", { model = "x", messages = { { role = "user", content = {
        { type = "text", text = "What is in these?" },
        { type = "image_url", image_url = { url = "data:image/png;base64,iVBORw0KGgo=" } },
        { type = "image_url", image_url = { url = "https://example.com/cat.jpg", detail = "low" } } } } } })
      assert.equals(200, st, body)
      local c = last_request().body.messages[1].content
      assert.same({ type = "text", text = "What is in these?" }, c[1])
      assert.same({ type = "image", source = { type = "base64", media_type = "image/png", data = "iVBORw0KGgo=" } }, c[2])
      assert.same({ type = "image", source = { type = "url", url = "https://example.com/cat.jpg" } }, c[3])
      -- usage back: Anthropic's input_tokens leaves cache reads out, OpenAI's prompt_tokens counts them
      local u = H.json(body).usage
      assert.equals(16, u.prompt_tokens)
      assert.equals(4, u.prompt_tokens_details.cached_tokens)
    end)

    it("passes image parts to an OpenAI route as they are", function()
      local parts = { { type = "text", text = "Look" },
        { type = "image_url", image_url = { url = "https://example.com/cat.jpg" } } }
      local st = chat("t43", { model = "x", messages = { { role = "user", content = parts } } })
      assert.equals(200, st)
      assert.same(parts, last_request().body.messages[1].content)
    end)

    it("translates stop, top_p, tool_choice, parallel_tool_calls, user and response_format", function()
      script("t45_a", { "401", "401", "401", "401" })
      local st, body = chat("t45", { model = "x", messages = { { role = "user", content = "hi" } },
        tools = TOOLS, stop = { "END", "STOP" }, top_p = 0.5, temperature = 0.2, max_tokens = 77,
        tool_choice = { type = "function", ["function"] = { name = "get_status" } },
        parallel_tool_calls = false, user = "u-1", response_format = { type = "json_object" } })
      assert.equals(200, st, body)
      local b = last_request().body
      assert.same({ "END", "STOP" }, b.stop_sequences)
      assert.equals(0.5, b.top_p)
      assert.equals(77, b.max_tokens)
      assert.same({ type = "tool", name = "get_status", disable_parallel_tool_use = true }, b.tool_choice)
      assert.same({ user_id = "u-1" }, b.metadata)
      assert.matches("one JSON object", b.system, 1, true)
      for choice, want in pairs({ auto = "auto", none = "none", required = "any" }) do
        st = chat("t45", { model = "x", messages = { { role = "user", content = "hi" } },
          tools = TOOLS, tool_choice = choice, stop = "END",
          response_format = { type = "json_schema", json_schema = { name = "o", schema = { type = "object" } } } })
        assert.equals(200, st)
        b = last_request().body
        assert.equals(want, b.tool_choice.type)
        assert.same({ "END" }, b.stop_sequences)
        assert.matches('{"type":"object"}', b.system, 1, true)
      end
    end)

    it("refuses with 400 naming the field what has no Anthropic equivalent, and sends nothing", function()
      local base = function() return { model = "x", messages = { { role = "user", content = "hi" } } } end
      local cases = {
        { "n", function(r) r.n = 2 end },
        { "logprobs", function(r) r.logprobs = true end },
        { "seed", function(r) r.seed = 7 end },
        { "frequency_penalty", function(r) r.frequency_penalty = 0.5 end },
        { "presence_penalty", function(r) r.presence_penalty = -1 end },
        { "top_logprobs", function(r) r.top_logprobs = 2 end },
        { "logit_bias", function(r) r.logit_bias = { ["50256"] = -100 } end },
        { "temperature", function(r) r.temperature = 1.5 end },
        { "temperature", function(r) r.temperature = "hot" end },
        { "top_p", function(r) r.top_p = 2 end },
        { "stop", function(r) r.stop = 5 end },
        { "max_tokens", function(r) r.max_tokens = -1 end },
        { "tools[0].type", function(r) r.tools = { { type = "retrieval" } } end },
        { "tools[0].function.description", function(r)
          r.tools = { { type = "function", ["function"] = { name = "f", description = 5 } } } end },
        { "tool_choice", function(r) r.tool_choice = "sometimes" end },
        { "response_format.type", function(r) r.response_format = { type = "xml" } end },
        { "messages[0].content[0].type", function(r)
          r.messages[1].content = { { type = "input_audio", input_audio = { data = "x", format = "wav" } } } end },
        { "messages[0].content[0].image_url.url", function(r)
          r.messages[1].content = { { type = "image_url", image_url = { url = "ftp://x/y.png" } } } end },
        { "messages[0].role", function(r) r.messages[1].role = "function" end },
        { "messages[1].tool_calls[0].function.arguments", function(r)
          r.messages[2] = { role = "assistant", tool_calls = { { id = "c", type = "function",
            ["function"] = { name = "f", arguments = "{not json" } } } } end },
      }
      for _, case in ipairs(cases) do
        local req = base()
        case[2](req)
        local st, body = chat("t44", req)
        assert.equals(400, st, case[1] .. ": " .. body)
        local e = H.json(body).error
        assert.equals("invalid_request", e.type)
        assert.matches("field '" .. case[1] .. "'", e.message, 1, true)
      end
      -- a turn's request is checked the same way, before the turn exists
      local st, body = turn({ agent = "t44", conversation = "conv-44", context = "interactive",
        request = { messages = { { role = "user", content = "hi" } }, seed = 3 } })
      assert.equals(400, st, body)
      assert.matches("field 'seed'", H.json(body).error.message, 1, true)
      assert.is_nil(counts().t44_a)
      assert.is_nil(counts().t44_b)
      -- the same fields are accepted at their "not used" values
      local req = base()
      req.n, req.logprobs, req.presence_penalty, req.frequency_penalty = 1, false, 0, 0
      assert.equals(200, (chat("t44", req)))
    end)

    it("puts the answering attempt's token usage on the turn record", function()
      script("t49_a", { "401" })
      local st, body = turn({ agent = "t49", conversation = "conv-49", run_id = "run-49", context = "interactive" })
      assert.equals(200, st, body)
      local j = H.json(body)
      assert.equals("t49_b", j.attempts[#j.attempts].route)
      local u = j.attempts[#j.attempts].usage
      assert.equals(16, u.prompt_tokens)
      assert.equals(4, u.prompt_tokens_details.cached_tokens)
      assert.is_true(u.completion_tokens > 0)
      assert.is_nil(j.attempts[1].usage) -- the refused attempt has none
    end)

    it("the fake provider refuses what the real Anthropic API refuses", function()
      local function post(body)
        return H.request(dir, "POST", fake.url .. "/t48_b/v1/messages", { body = cjson.encode(body) })
      end
      for _, bad in ipairs({
        { model = "m", max_tokens = 5, messages = { { role = "user", content = "a" },
          { role = "assistant", content = "" }, { role = "user", content = "b" } } },
        { model = "m", max_tokens = 5, messages = { { role = "user", content = "a" }, { role = "user", content = "b" } } },
        { model = "m", messages = { { role = "user", content = "a" } } },
        { model = "m", max_tokens = 5, seed = 1, messages = { { role = "user", content = "a" } } },
        { model = "m", max_tokens = 5, messages = { { role = "user", content = {
          { type = "tool_result", tool_use_id = "nope", content = "x" } } } } },
      }) do
        local st, body = post(bad)
        assert.equals(400, st, body)
        local j = H.json(body)
        assert.equals("error", j.type)
        assert.equals("invalid_request_error", j.error.type)
      end
      local st = H.request(dir, "POST", fake.url .. "/t48_a/v1/chat/completions", { body = cjson.encode({
        model = "m", messages = { { role = "user", content = "a" }, { role = "tool", tool_call_id = "x", content = "r" } } }) })
      assert.equals(400, st)
    end)
  end)

  describe("usage on streams (agents t46, t47)", function()
    local function stream(agent, extra)
      local req = { model = "x", stream = true, messages = { { role = "user", content = "hi" } } }
      for k, v in pairs(extra or {}) do req[k] = v end
      local out = H.sh(string.format(
        "%s -s -N -X POST -H 'x-openmesh-agent: %s' --data-binary %s %s",
        H.curl(10), agent, H.q(cjson.encode(req)), H.q(gw.url .. "/v1/chat/completions")))
      return H.parse_sse(out), out
    end

    local function usage_chunk(events)
      assert.equals("[DONE]", events[#events].data)
      local j = cjson.decode(events[#events - 1].data)
      return j, events
    end

    it("stream_options.include_usage gives the final usage chunk on an OpenAI route", function()
      local j, events = usage_chunk(stream("t46", { stream_options = { include_usage = true } }))
      assert.same({}, j.choices)
      assert.equals(12, j.usage.prompt_tokens)
      assert.equals(5, j.usage.completion_tokens)
      assert.equals(17, j.usage.total_tokens)
      assert.equals(4, j.usage.prompt_tokens_details.cached_tokens)
      assert.equals("stop", cjson.decode(events[#events - 2].data).choices[1].finish_reason)
      -- not asked for: no usage chunk, but the route was still asked for it
      j = usage_chunk(stream("t46"))
      assert.is_nil(j.usage)
      assert.equals(1, #j.choices)
      assert.is_true(H.json(select(2, H.request(dir, "GET", fake.url .. "/_last"))).body.stream_options.include_usage)
    end)

    it("on an Anthropic route message_start and message_delta usage become the final usage chunk", function()
      script("t47_a", { "401" })
      local j = usage_chunk(stream("t47", { stream_options = { include_usage = true } }))
      assert.same({}, j.choices)
      assert.equals(12, j.usage.prompt_tokens)
      assert.equals(5, j.usage.completion_tokens)
      local _, last = H.request(dir, "GET", fake.url .. "/_last")
      assert.is_nil(H.json(last).body.stream_options) -- not an Anthropic field
    end)

    it("counts a stream's tokens in /metrics by route, model and kind", function()
      local _, before = H.request(dir, "GET", gw.url .. "/metrics")
      local function value(text, route, kind)
        return tonumber(text:match('openmesh_egress_tokens_total{route="' .. route ..
          '",model="claude%-fake",kind="' .. kind .. '"} (%d+)')) or 0
      end
      local p0, c0 = value(before, "t47_b", "prompt"), value(before, "t47_b", "completion")
      script("t47_a", { "401" })
      usage_chunk(stream("t47"))
      local _, after = H.request(dir, "GET", gw.url .. "/metrics")
      assert.equals(p0 + 12, value(after, "t47_b", "prompt"))
      assert.equals(c0 + 5, value(after, "t47_b", "completion"))
      assert.matches('"event":"egress_call","route":"t47_b"', H.readfile(gw.out), 1, true)
    end)
  end)

  describe("retry budgets in tokens and cost", function()
    local bgw
    local function budget_policy()
      return string.format([[
return {
  kind = "fallback",
  routes = {
    { name = "bud_a", provider = "openai", base_url = "%s/bud_a/v1", model = "gpt-fake",
      attempt_timeout_ms = 1500, first_byte_timeout_ms = 400,
      retry_budget = { unit = "tokens", ratio = 0.5, min_per_s = 0, window_ms = 60000 } },
    { name = "bud_b", provider = "anthropic", base_url = "%s/bud_b/v1", model = "claude-fake",
      attempt_timeout_ms = 1500, first_byte_timeout_ms = 400 },
    { name = "cost_a", provider = "openai", base_url = "%s/cost_a/v1", model = "gpt-cost",
      attempt_timeout_ms = 1500, first_byte_timeout_ms = 400,
      retry_budget = { unit = "cost", ratio = 1, min_per_s = 0, window_ms = 60000 } },
    { name = "solo", provider = "openai", base_url = "%s/solo/v1", model = "gpt-fake",
      attempt_timeout_ms = 1500, first_byte_timeout_ms = 400 },
  },
  -- every route without its own: an attempts budget with no reserve and
  -- no share, so it never affords a retry
  retry_budget = { unit = "attempts", ratio = 0, min_per_s = 0 },
  prices = { ["gpt-cost"] = { input = 1000, output = 3000 } },
  order = function(ctx)
    if ctx.agent == "tok" then return { "bud_a", "bud_b" } end
    if ctx.agent == "cost" then return { "cost_a", "bud_b" } end
    return { "solo" }
  end,
  max_attempts = 3, per_wait_ceiling_ms = 100, deadline_ms = 4000,
  backoff_base_ms = 10, backoff_cap_ms = 20,
}
]], fake.url, fake.url, fake.url, fake.url)
    end
    local function metric(name, labels)
      local _, text = H.request(dir, "GET", bgw.url .. "/metrics")
      local v = text:match(name .. "{" .. labels:gsub("%p", "%%%0") .. "} ([%d.e+-]+)")
      return tonumber(v) or 0
    end
    local function call(agent)
      local st, body, headers = H.request(dir, "POST", bgw.url .. "/v1/chat/completions",
        { body = cjson.encode({ model = "x", messages = { { role = "user", content = "Where is my order?" } } }),
          headers = { "x-openmesh-agent: " .. agent }, max_time = 10 })
      return st, body, headers
    end
    setup(function()
      bgw = start_gateway(budget_policy())
    end)
    teardown(function()
      if bgw then H.stop(bgw) end
    end)

    it("an empty tokens budget skips the retry and still falls back", function()
      local before = counts()
      script("bud_a", { "503", "503" })
      local st, body = call("tok")
      assert.equals(200, st, body)
      assert.matches("from bud_b", H.json(body).choices[1].message.content)
      local after = counts()
      assert.equals((before.bud_a or 0) + 1, after.bud_a) -- no retry on bud_a
      assert.equals((before.bud_b or 0) + 1, after.bud_b)
      assert.equals(1, metric("openmesh_egress_retry_budget_exhausted_total", 'route="bud_a"'))
    end)

    it("successful calls earn tokens for retries: then the same route is retried", function()
      script("bud_a", {})
      for _ = 1, 4 do -- 4 x (12 + completion) tokens x 0.5 covers one ~21-token retry
        local st, body = call("tok")
        assert.equals(200, st, body)
        assert.matches("from bud_a", H.json(body).choices[1].message.content)
      end
      local before = counts()
      script("bud_a", { "503" })
      local st, body = call("tok")
      assert.equals(200, st, body)
      assert.matches("from bud_a", H.json(body).choices[1].message.content)
      local after = counts()
      assert.equals(before.bud_a + 2, after.bud_a)
      assert.equals(before.bud_b, after.bud_b)
      assert.equals(1, metric("openmesh_egress_retry_budget_exhausted_total", 'route="bud_a"'))
    end)

    it("counts cost by the policy's prices and spends it on retries", function()
      local before = counts()
      script("cost_a", { "503" })
      local st, body = call("cost")
      assert.equals(200, st, body) -- nothing earned yet: fell back
      assert.equals((before.cost_a or 0) + 1, counts().cost_a)
      assert.equals(1, metric("openmesh_egress_retry_budget_exhausted_total", 'route="cost_a"'))
      st, body = call("cost")
      assert.equals(200, st, body)
      local u = H.json(body).usage
      local want = (u.prompt_tokens * 1000 + u.completion_tokens * 3000) / 1e6
      local got = metric("openmesh_egress_cost_usd_total", 'route="cost_a",model="gpt-cost"')
      assert.is_true(math.abs(got - want) < 1e-9, ("cost metric %s, usage says %s"):format(got, want))
      local logged
      for line in H.readfile(bgw.out):gmatch("[^\n]+") do
        if line:find('"route":"cost_a","model":"gpt-cost"', 1, true) then
          logged = line:match('"cost_usd":"([^"]*)"')
        end
      end
      assert.equals(("%.6f"):format(want), logged)
      -- one success (about 0.024 USD at ratio 1) covers a retry of about
      -- 21 prompt tokens (0.021 USD)
      before = counts()
      script("cost_a", { "503" })
      st, body = call("cost")
      assert.equals(200, st, body)
      assert.matches("from cost_a", H.json(body).choices[1].message.content)
      assert.equals(before.cost_a + 2, counts().cost_a)
    end)

    it("a spent budget on the last route stops: the caller is told not to retry", function()
      local before = counts()
      script("solo", { "503", "503", "503" })
      local st, body, headers = call("solo")
      assert.equals(502, st, body)
      assert.equals("all_routes_failed", H.json(body).error.type)
      assert.equals("false", headers["x-should-retry"])
      assert.equals((before.solo or 0) + 1, counts().solo)
      assert.equals(1, metric("openmesh_egress_retry_budget_exhausted_total", 'route="solo"'))
    end)
  end)

  describe("admin", function()
    it("serves /metrics, /status and /v1/pending", function()
      local st, body = H.request(dir, "GET", gw.url .. "/metrics")
      assert.equals(200, st)
      assert.matches('openmesh_egress_attempts_total{class="server_error"}', body, 1, true)
      assert.matches('openmesh_egress_turns_total{outcome="held"}', body, 1, true)
      st, body = H.request(dir, "GET", gw.url .. "/status")
      assert.equals(200, st)
      local j = H.json(body)
      assert.equals(1, j.policies.fallback.version)
      -- each policy says where it came from and when it loaded, as the
      -- proxy's /status does
      for _, name in ipairs({ "fallback", "egress_heuristics" }) do
        local pol = j.policies[name]
        assert.matches("^file:", pol.source)
        assert.equals(0, pol.revision)
        assert.matches("^%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%d%.%d%d%dZ$", pol.loaded_at)
        assert.equals("", pol.previous_error)
      end
      assert.is_true(#j.routes > 2)
      st = H.request(dir, "GET", gw.url .. "/v1/pending")
      assert.equals(200, st)
    end)
  end)

  describe("the gateway's own time (openmesh_egress_overhead_seconds)", function()
    -- the count and sum of one API's series
    local function overhead(api)
      local _, text = H.request(dir, "GET", gw.url .. "/metrics")
      local sel = ('{api="' .. api .. '"} '):gsub("%p", "%%%0")
      local n = text:match("openmesh_egress_overhead_seconds_count" .. sel .. "(%S+)")
      local s = text:match("openmesh_egress_overhead_seconds_sum" .. sel .. "(%S+)")
      assert.is_not_nil(n, "no overhead series for api " .. api)
      return tonumber(n), tonumber(s)
    end

    -- since (n0, s0), one more chat call whose own time is above 0 and
    -- below limit seconds of its elapsed ones
    local function one_more(n0, s0, elapsed, limit)
      local n1, s1 = overhead("chat")
      assert.equals(n0 + 1, n1)
      local own = s1 - s0
      assert.is_true(own > 0 and own < limit,
        string.format("own time %.6f s of a %.3f s call", own, elapsed))
    end

    it("has a series per inbound API", function()
      for _, api in ipairs({ "chat", "messages", "responses" }) do
        assert.is_number(overhead(api))
      end
    end)

    it("counts its own time, not the provider's answer or the backoff before a retry", function()
      local n0, s0 = overhead("chat")
      -- a 503 asking for 150 ms, then an answer 300 ms late: the call
      -- takes more than 450 ms, of which the gateway's own is a sliver
      script("t55_a", { "503:ram=150", "ok:delay=300" })
      local st, _, elapsed = chat("t55_solo")
      assert.equals(200, st)
      assert.equals(2, counts().t55_a)
      assert.is_true(elapsed > 0.45, "the call took " .. elapsed .. " s")
      one_more(n0, s0, elapsed, 0.05)
    end)

    it("counts a stream's relay, not the provider's wait", function()
      local n0, s0 = overhead("chat")
      script("t56_a", { "ok:delay=250:repeat=200" })
      local t0 = H.now()
      local st, body = H.request(dir, "POST", gw.url .. "/v1/chat/completions", {
        body = cjson.encode({ model = "any", stream = true,
          messages = { { role = "user", content = "Where is my order?" } } }),
        headers = { "x-openmesh-agent: t56_solo" }, max_time = 10 })
      local elapsed = H.now() - t0
      assert.equals(200, st)
      assert.matches("data: [DONE]", body, 1, true)
      assert.is_true(elapsed > 0.25, "the call took " .. elapsed .. " s")
      one_more(n0, s0, elapsed, 0.1)
    end)
  end)

  describe("the randomized fault campaign", function()
    it("1,000 turns: the user channel never receives an error string, nothing twice", function()
      local cdir = dir .. "/campaign"
      os.execute("mkdir -p " .. H.q(cdir))
      local cfake = start_fixture("fake_provider", "--random " .. os.time())
      local csinkfile = cdir .. "/sink.jsonl"
      local csink = start_fixture("webhook_sink", "--out " .. H.q(csinkfile) .. " --fail-rate 0.05 --seed 7")
      H.writefile(dir .. "/channels.json", cjson.encode({
        user = { kind = "webhook", target = csink.url .. "/hook", max_retries = 5, timeout_ms = 2000 } }))
      local cgw = start_gateway(fallback_policy(cfake.url, { attempt = 400, first_byte = 150,
        max_attempts = 2, ceiling = 60, deadline = 900, pending_interval = 150, max_age = 1200,
        commitment = 1200 }))
      local N = 1000
      local cfg = {}
      local fields = {}
      for i = 1, N do
        local f = { agent = "t" .. (i % 5), conversation = "camp-" .. i, run_id = "run-" .. i,
          context = (i % 3 == 0) and "async" or "interactive", channel = "user",
          request = { messages = { { role = "user", content = "Question " .. i } } } }
        fields[i] = f
        H.writefile(cdir .. "/t" .. i .. ".json", cjson.encode(f))
        cfg[#cfg + 1] = table.concat({
          'url = "' .. cgw.url .. '/v1/turns"', 'request = "POST"',
          'header = "Content-Type: application/json"', "max-time = 20",
          'data-binary = "@' .. cdir .. "/t" .. i .. '.json"',
          'output = "' .. cdir .. "/a" .. i .. '.json"' }, "\n")
      end
      H.writefile(cdir .. "/curl.cfg", table.concat(cfg, "\nnext\n") .. "\n")
      local t0 = H.now()
      H.sh("timeout -k 1 120 curl -s --no-progress-meter --parallel --parallel-max 48 -K " .. H.q(cdir .. "/curl.cfg"))
      -- background work (holding lines' retries, pending cycles) drains
      assert.is_truthy(H.wait_for(function()
        local _, b = H.request(cdir, "GET", cgw.url .. "/status")
        local ok, j = pcall(cjson.decode, b)
        return ok and j.active_turns == 0
      end, 30, 0.2))
      H.sleep(0.3)
      local elapsed = H.now() - t0
      local outcomes = { delivered = 0, held = 0, silent = 0, handed_off = 0 }
      for i = 1, N do
        local j = cjson.decode(H.readfile(cdir .. "/a" .. i .. ".json"))
        assert.is_not_nil(outcomes[j.outcome], "turn " .. i .. ": " .. tostring(j.outcome))
        outcomes[j.outcome] = outcomes[j.outcome] + 1
        assert.is_nil(H.readfile(cdir .. "/a" .. i .. ".json"):find("server had an error", 1, true))
      end
      local by_conv, leaks, duplicates, parts_seen = {}, 0, 0, {}
      local replies, holds, handoffs = 0, 0, 0
      for line in H.readfile(csinkfile):gmatch("[^\n]+") do
        local m = cjson.decode(line)
        local key = m.delivery .. "/" .. m.part
        if parts_seen[key] then duplicates = duplicates + 1 end
        parts_seen[key] = true
        local c = by_conv[m.conversation] or { final = 0, hold = 0 }
        by_conv[m.conversation] = c
        if m.text == HOLDING then
          c.hold = c.hold + 1
          holds = holds + 1
        elseif m.text == HANDOFF then
          c.final = c.final + 1
          handoffs = handoffs + 1
        elseif m.text:match("^Reply %d+ from t%d_[ab]%.$") then
          c.final = c.final + 1
          replies = replies + 1
        else
          leaks = leaks + 1
          print("LEAK: " .. m.text)
        end
      end
      local unanswered = 0
      for i = 1, N do
        local c = by_conv["camp-" .. i] or { final = 0, hold = 0 }
        if c.final > 1 or c.hold > 1 then duplicates = duplicates + 1 end
        -- every interactive turn ends with exactly one answer or handoff
        if fields[i].context == "interactive" and c.final ~= 1 then unanswered = unanswered + 1 end
      end
      local _, cnt = H.request(cdir, "GET", cfake.url .. "/_count")
      print(string.format(
        "\n# campaign: %d turns in %.1f s, %d provider requests: delivered %d, held %d, silent %d, handed_off %d;"
          .. " channel got %d replies, %d holding lines, %d handoffs; duplicates %d, leaks %d, interactive without an answer %d",
        N, elapsed, H.json(cnt).total, outcomes.delivered, outcomes.held, outcomes.silent, outcomes.handed_off,
        replies, holds, handoffs, duplicates, leaks, unanswered))
      assert.equals(N, outcomes.delivered + outcomes.held + outcomes.silent + outcomes.handed_off)
      assert.equals(0, duplicates)
      assert.equals(0, leaks)
      assert.equals(0, unanswered)
      assert.is_true(outcomes.delivered > 0 and outcomes.held + outcomes.silent + outcomes.handed_off > 0)
    end)
  end)
end)
