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
