-- egress_inbound_spec.lua: bad input on the inbound APIs of the real
-- `openmesh egress` (/v1/chat/completions, /v1/messages, /v1/responses):
-- each is a 400 in the API's own error shape naming the field, counted in
-- openmesh_egress_requests_refused_total{api}, and nothing reaches the
-- provider (the fake's request count does not move).
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../support/?.lua;" .. package.path

local H = require "control_helper"
local cjson = require "cjson"

describe("egress inbound APIs: bad input", function()
  if not H.bin or H.bin == "" then
    it("runs against OPENMESH_BIN", function()
      pending("OPENMESH_BIN is not set (make check sets it to build/bin/openmesh)")
    end)
    return
  end
  local dir, fake, gw

  setup(function()
    dir = H.tmpdir()
    fake = H.start_fixture(dir, "fake_provider", "")
    H.writefile(dir .. "/fallback.lua", string.format([[
return {
  kind = "fallback",
  routes = {
    { name = "a", provider = "openai", base_url = "%s/a/v1", model = "gpt-fake" },
    { name = "b", provider = "anthropic", base_url = "%s/b/v1", model = "claude-fake" },
  },
  models = { fast = { "a", "b" } },
}
]], fake.url, fake.url))
    gw = H.start_egress(dir, "egress", string.format("--fallback %s --heuristics %s",
      H.q(dir .. "/fallback.lua"), H.q(here .. "../../policies/egress_heuristics.lua")))
  end)

  teardown(function()
    H.kill_all()
    if dir then os.execute("rm -rf " .. H.q(dir)) end
  end)

  local function total()
    local _, body = H.request(dir, "GET", fake.url .. "/_count")
    return H.json(body).total
  end

  local function refused(api)
    local _, body = H.request(dir, "GET", gw.url .. "/metrics")
    return tonumber(body:match('openmesh_egress_requests_refused_total{api="' .. api .. '"} (%d+)'))
  end

  local cases = {
    { "chat", "/v1/chat/completions", { model = "fast", messages = "hi" }, "field 'messages'" },
    { "chat", "/v1/chat/completions", { model = 3, messages = { { role = "user", content = "x" } } }, "field 'model'" },
    { "messages", "/v1/messages", { model = "fast", max_tokens = 8, top_k = 2,
        messages = { { role = "user", content = "x" } } }, "field 'top_k'" },
    { "messages", "/v1/messages", { model = "fast", max_tokens = "8",
        messages = { { role = "user", content = "x" } } }, "field 'max_tokens'" },
    { "messages", "/v1/messages", { model = "fast", max_tokens = 8,
        messages = { { role = "user", content = { { type = "document" } } } } }, "field 'messages[0].content[0].type'" },
    { "messages", "/v1/messages", { model = "fast", max_tokens = 8, stop_sequences = { string.rep("s", 300) },
        messages = { { role = "user", content = "x" } } }, "field 'stop_sequences[0]'" },
    { "responses", "/v1/responses", { model = "fast", input = "x", reasoning = { effort = "low" } }, "field 'reasoning'" },
    { "responses", "/v1/responses", { model = "fast", input = { { type = "function_call_output", call_id = "c" } } },
      "field 'input[0].output'" },
    { "responses", "/v1/responses", { model = string.rep("m", 300), input = "x" }, "field 'model'" },
  }

  for i, c in ipairs(cases) do
    local api, path, req, want = c[1], c[2], c[3], c[4]
    it(("%s #%d: 400 naming %s, nothing forwarded"):format(api, i, want), function()
      local before, refused_before = total(), refused(api)
      local st, body = H.request(dir, "POST", gw.url .. path, { body = cjson.encode(req) })
      assert.equals(400, st, body)
      local j = H.json(body)
      local err = j.error
      if api == "messages" then
        assert.equals("error", j.type, body)
        assert.equals("invalid_request_error", err.type, body)
        assert.equals("invalid_request", err.reason, body)
      else
        assert.equals("invalid_request", err.type, body)
      end
      assert.equals(want, err.message:sub(1, #want), body)
      assert.equals(before, total())
      assert.equals(refused_before + 1, refused(api))
    end)
  end

  it("an unknown model is 404 model_not_found on each API, nothing forwarded", function()
    local before = total()
    for _, c in ipairs({
      { "/v1/chat/completions", { model = "nope", messages = { { role = "user", content = "x" } } } },
      { "/v1/messages", { model = "nope", max_tokens = 8, messages = { { role = "user", content = "x" } } } },
      { "/v1/responses", { model = "nope", input = "x" } },
    }) do
      local st, body = H.request(dir, "POST", gw.url .. c[1], { body = cjson.encode(c[2]) })
      assert.equals(404, st, body)
      local err = H.json(body).error
      assert.equals("model_not_found", err.code, body)
    end
    assert.equals(before, total())
  end)

  it("a good request on each API reaches the provider with the route's model", function()
    for _, c in ipairs({
      { "/v1/messages", { model = "fast", max_tokens = 8, messages = { { role = "user", content = "x" } } }, "content" },
      { "/v1/responses", { model = "fast", input = "x" }, "output" },
    }) do
      local st, body = H.request(dir, "POST", gw.url .. c[1], { body = cjson.encode(c[2]) })
      assert.equals(200, st, body)
      assert.is_not_nil(H.json(body)[c[3]], body)
      local _, last = H.request(dir, "GET", fake.url .. "/_last")
      assert.equals("gpt-fake", H.json(last).body.model)
    end
  end)

  it("per-route metrics: attempts by route, class and status, durations by route", function()
    local function metric(pattern)
      local _, body = H.request(dir, "GET", gw.url .. "/metrics")
      return tonumber(body:match(pattern)) or 0
    end
    local ok_before = metric('openmesh_egress_route_attempts_total{route="a",class="ok",status="200"} (%d+)')
    local n_before = metric('openmesh_egress_route_attempt_duration_seconds_count{route="a"} (%d+)')
    local fail_before = metric('openmesh_egress_route_attempts_total{route="a",class="server_error",status="500"} (%d+)')
    assert.equals(200, H.request(dir, "POST", fake.url .. "/_script",
      { body = cjson.encode({ route = "a", steps = { "500" } }) }))
    local st, body = H.request(dir, "POST", gw.url .. "/v1/responses",
      { body = cjson.encode({ model = "fast", input = "x" }) })
    assert.equals(200, st, body)
    assert.equals(ok_before + 1, metric('openmesh_egress_route_attempts_total{route="a",class="ok",status="200"} (%d+)'))
    assert.equals(fail_before + 1, metric('openmesh_egress_route_attempts_total{route="a",class="server_error",status="500"} (%d+)'))
    assert.equals(n_before + 2, metric('openmesh_egress_route_attempt_duration_seconds_count{route="a"} (%d+)'))
    assert.equals(0, metric('openmesh_egress_route_series_dropped_total (%d+)'))
  end)
end)
