-- policies/egress_heuristics.lua: machine error text must not reach a user.
local testing = require "openmesh.testing"
local contract = require "openmesh.contract"

describe("policies/egress_heuristics.lua", function()
  local p = assert(testing.load("policies/egress_heuristics.lua"))

  local function flags(text, confidence, check)
    local r = testing.evaluate(p, text)
    assert.is_true(r.flagged, ("not flagged: %q"):format(text))
    assert.equal(confidence, r.confidence, text)
    if check then
      assert.truthy(table.concat(r.checks, ","):find(check, 1, true),
        ("%q matched %s, not %s"):format(text, table.concat(r.checks, ","), check))
    end
  end

  it("loads through the validator", function()
    assert.equal("egress_heuristics", p:kind())
  end)

  it("flags stack traces with high confidence", function()
    flags("Traceback (most recent call last):\n  File \"x.py\", line 1", "high", "python_traceback")
    flags("Exception in thread \"main\" java.lang.IllegalStateException: boom", "high", "java_exception")
    flags("Error: boom\n    at com.acme.billing.Invoice.total(Invoice.java:88)\n", "high", "java_frame")
    flags("java.lang.NullPointerException\n\tat org.example.App.main(App.java)", "high", "java_frame")
    flags("panic: assignment to entry in nil map", "high", "go_panic")
    flags("log line\npanic: runtime error: invalid memory address", "high", "go_panic")
    flags("goroutine 17 [running]:\nmain.handler()", "high", "go_panic")
  end)

  it("flags provider error bodies with high confidence", function()
    flags("{\"error\":{\"message\":\"Rate limit reached\",\"type\":\"requests\"}}", "high", "error_json")
    flags("{\"error\": \"overloaded\"}", "high", "error_json")
    for _, code in ipairs { "rate_limit_exceeded", "insufficient_quota", "context_length_exceeded",
      "invalid_request_error", "overloaded_error" } do
      flags("type: " .. code, "high", "provider_error_code")
    end
  end)

  it("flags HTTP error status lines and server error pages", function()
    flags("HTTP/1.1 502 Bad Gateway", "high", "http_status_line")
    flags("upstream said HTTP/2 429", "high", "http_status_line")
    flags("<h1>Internal Server Error</h1>", "high", "internal_server_error")
  end)

  it("flags values a template rendered from nothing", function()
    flags("Hello [object Object]!", "high", "object_object")
    flags("Total: NaN EUR.", "high", "nan")
    flags("Your ticket id is undefined.", "low", "undefined")
  end)

  it("flags empty and cut-off replies with low confidence", function()
    flags("", "low", "empty")
    flags(" \n\t  ", "low", "empty")
    flags("I have reviewed your account and the charge from last week was refunded to your car", "low",
      "truncated")
  end)

  it("is high when a high and a low check both match", function()
    local r = testing.evaluate(p, "Traceback (most recent call last): value undefined.")
    assert.same({ flagged = true, confidence = "high", checks = { "python_traceback", "undefined" } }, r)
  end)

  it("lets ordinary replies through", function()
    for _, text in ipairs {
      "Your order shipped yesterday and should arrive on Friday.",
      "Sure! Here is the summary you asked for:\n- item one\n- item two\n\nAnything else?",
      "Thanks, Nancy.",
      "Ok",
      "There was an error processing your card; could you try another one?",
      "Our servers had an issue earlier today, but everything is running again.",
      "I looked at the HTTP headers you sent and they look fine.",
      "Banana bread recipe: 2 bananas, 1 cup flour, and a pinch of salt (optional).",
      "Don't panic: your data is safe.",
      "The meeting is at 3pm (see the invite).",
    } do
      local r = testing.evaluate(p, text)
      assert.is_false(r.flagged, ("%q flagged by %s"):format(text, table.concat(r.checks, ",")))
      assert.is_nil(r.confidence)
    end
  end)

  describe("quality gate checks", function()
    local PROMPT = "You are the billing agent of Acme Corp. Never reveal internal discount codes such as STAFF-40 to customers."

    local function eval(text, ctx)
      return testing.evaluate(p, text, ctx)
    end

    it("flags a leaked reasoning block with high confidence", function()
      flags("<thinking>The user is angry, offer a coupon.</thinking>Here is your coupon.", "high", "leaked_thinking")
      flags("Sure.\n<think>\nplan\n</think>", "high", "leaked_thinking")
      flags("</thinking>Done.", "high", "leaked_thinking")
      assert.is_false(eval("We think the parcel arrives Monday; thinking of you.").flagged)
    end)

    it("flags a verbatim run of 40+ bytes of the system prompt, only when one is given", function()
      local leak = "My rules: Never reveal internal discount codes such as STAFF-40 to customers."
      local r = eval(leak, { system_prompt = PROMPT })
      assert.same({ flagged = true, confidence = "high", checks = { "system_prompt_leak" } }, r)
      assert.is_false(eval(leak).flagged) -- no prompt: no check
      -- exactly 40 bytes of the prompt, at any alignment
      for start = 1, #PROMPT - 40 do
        local piece = PROMPT:sub(start, start + 39)
        local got = eval("Quote: " .. piece .. ". End of quote.", { system_prompt = PROMPT })
        assert.is_true(got.flagged, piece)
      end
      -- 39 bytes is not a fragment
      local short = PROMPT:sub(5, 43)
      assert.is_false(eval("Quote:[" .. short .. "]. End.", { system_prompt = PROMPT }).flagged, short)
      -- a short prompt cannot leak by this rule
      assert.is_false(eval("You are helpful.", { system_prompt = "You are helpful." }).flagged)
    end)

    it("stays bounded on a reply made of prompt pieces", function()
      local prompt = ("abcdefghijklmnopqrst"):rep(20)
      local r = eval(("abcdefghijklmnopqrsX"):rep(200) .. ".", { system_prompt = prompt })
      assert.is_false(r.flagged)
      r = eval(("abcdefghijklmnopqrstX"):rep(300) .. ".", { system_prompt = prompt })
      assert.is_false(r.flagged) -- 20-byte runs everywhere, never 40
      r = eval(("abcdefghijklmnopqrstX"):rep(300) .. prompt:sub(3, 45) .. ".", { system_prompt = prompt })
      assert.is_true(r.flagged) -- one real run among the noise
    end)

    it("flags an 'As an AI language model' opener with low confidence", function()
      flags("As an AI language model, I cannot browse the web. Here is what I know.", "low",
        "ai_language_model_opener")
      flags("  as an AI language model I think both are fine.", "low", "ai_language_model_opener")
      flags("I'm an AI language model; here is the summary.", "low", "ai_language_model_opener")
      assert.is_false(eval("Here is the summary. As an AI language model would say, it depends.").flagged)
    end)

    it("flags an apology-only reply to a substantive question with low confidence", function()
      local q = { question = "How do I export my invoices as PDF from the dashboard?" }
      local r = eval("I'm sorry, but I can't help with that.", q)
      assert.same({ flagged = true, confidence = "low", checks = { "apology_only" } }, r)
      r = eval("Sorry! Unfortunately I am unable to do that. I apologize.", q)
      assert.is_true(r.flagged)
      -- an apology followed by content is a reply
      assert.is_false(eval("Sorry for the delay. Open Billing, then click Export PDF.", q).flagged)
      -- no apology at all: not this check
      assert.is_false(eval("I cannot export it.", q).flagged)
      -- not a substantive question
      assert.is_false(eval("Sorry, I can't help with that.", { question = "hi" }).flagged)
      assert.is_false(eval("Sorry, I can't help with that.").flagged)
    end)

    it("accepts the new context fields in examples and refuses wrong types", function()
      local err = contract.check_ctx({ system_prompt = 42 })
      assert.matches("ctx.system_prompt", err, 1, true)
      err = contract.check_ctx({ question = false })
      assert.matches("ctx.question", err, 1, true)
      assert.is_nil(contract.check_ctx({ system_prompt = "x", question = "y" }))
    end)
  end)

  it("matches patterns exactly like string.find (the literal-prefix fast path)", function()
    assert.equal("NaN", contract.literal_prefix("%f[%w]NaN%f[%W]"))
    assert.equal("\"error\"", contract.literal_prefix("\"error\"%s*:"))
    assert.equal("HTTP/", contract.literal_prefix("HTTP/%d"))
    assert.equal("ab", contract.literal_prefix("abc?d"))
    assert.equal("abc", contract.literal_prefix("abc+d"))
    assert.equal("a.b", contract.literal_prefix("a%.b"))
    assert.equal("", contract.literal_prefix("^abc"))
    assert.equal("", contract.literal_prefix("[ab]c"))
    local patterns = { "%f[%w]NaN%f[%W]", "ab+c", "a%.b", "x?y", "%f[%a]an%f[%A]", "an%s+d",
      "(a)%1", "aa-b", "\n%s*at ", "b$" }
    local texts = { "", "NaN", "aNaN", "NaN!", "abbbc", "ac", "a.b", "axb", "y", "xy", "an and", "band",
      "aab", "ab", "aa", "x\n  at y", "NaNa NaN", "b", "ab\nb" }
    for _, pat in ipairs(patterns) do
      for _, t in ipairs(texts) do
        assert.equal(string.find(t, pat) ~= nil, contract.pattern_found(t, pat), pat .. " on " .. t)
      end
    end
  end)

  it("has handoff lines with a default", function()
    local s = p:settings()
    assert.is_string(s.handoff_lines.default)
    assert.is_string(s.handoff_lines.support)
    for agent, line in pairs(s.handoff_lines) do
      assert.is_nil(testing.evaluate(p, line).confidence, agent)
    end
  end)

  it("has a default holding line, per-agent ones and a handoff for support", function()
    local s = p:settings()
    assert.is_string(s.holding_lines.default)
    assert.equal(s.holding_lines.support, contract.holding_line(s, "support"))
    assert.equal(s.holding_lines.default, contract.holding_line(s, "unknown-agent"))
    assert.equal("human-queue", contract.handoff(s, "support"))
    assert.is_nil(contract.handoff(s, "sales"))
    for agent, line in pairs(s.holding_lines) do
      assert.is_nil(testing.evaluate(p, line).confidence, agent) -- our own lines pass our own checks
    end
  end)
end)
