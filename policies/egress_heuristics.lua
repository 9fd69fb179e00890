-- The default egress heuristics: catch machine error text about to reach a
-- user as an agent's reply. High confidence means the text is certainly not
-- a reply (a stack trace, a provider's error body): it is never sent. Low
-- confidence means it may be a reply that merely looks odd: with the quality
-- gate on, a judge decides, and if the judge fails it is sent, flagged for
-- review.
--
-- Patterns are Lua patterns (%f[%w]...%f[%W] is a whole word); substrings
-- are literal. Everything is case-sensitive: machine text has fixed case.
return {
  kind = "egress_heuristics",
  description = "Stack traces, provider error bodies, HTTP error lines, leaked null/undefined/NaN, empty or cut-off replies.",

  checks = {
    -- Stack traces -----------------------------------------------------
    { name = "python_traceback", confidence = "high",
      substrings = { "Traceback (most recent call last)" } },
    { name = "java_exception", confidence = "high",
      substrings = { "Exception in thread \"" } },
    -- A Java frame on a line of its own: "\tat com.acme.Foo.bar(Foo.java:42)".
    { name = "java_frame", confidence = "high",
      pattern = "\n%s*at [%a_$][%w_$]*%.[%w_$.<>]+%([^\n]*%)" },
    -- Go: "panic: ..." at the start of a line, or a goroutine dump header.
    { name = "go_panic", confidence = "high",
      check = function(text)
        return text:find("^panic: ") ~= nil or text:find("\npanic: ", 1, true) ~= nil
          or text:find("goroutine %d+ %[[%a ]+%]:") ~= nil
      end },

    -- Provider error bodies ----------------------------------------------
    { name = "error_json", confidence = "high",
      pattern = "\"error\"%s*:%s*[{\"]" },
    { name = "provider_error_code", confidence = "high",
      substrings = { "rate_limit_exceeded", "insufficient_quota", "context_length_exceeded",
        "invalid_request_error", "overloaded_error" } },

    -- HTTP --------------------------------------------------------------
    { name = "http_status_line", confidence = "high",
      pattern = "HTTP/%d[%.%d]* [45]%d%d" },
    { name = "internal_server_error", confidence = "high",
      substrings = { "Internal Server Error" } },

    -- Values a template rendered from nothing -----------------------------
    { name = "object_object", confidence = "high",
      substrings = { "[object Object]" } },
    { name = "nan", confidence = "high",
      pattern = "%f[%w]NaN%f[%W]" },
    -- "undefined" is also an English word ("undefined behaviour"): low.
    { name = "undefined", confidence = "low",
      pattern = "%f[%w]undefined%f[%W]" },

    -- Shape of the reply ----------------------------------------------------
    { name = "empty", confidence = "low",
      check = function(text)
        return text:find("%S") == nil
      end },
    -- A reply of some length that stops on a letter or digit, with no
    -- closing punctuation: likely cut off mid-word or mid-sentence.
    { name = "truncated", confidence = "low",
      check = function(text)
        local last = #text
        while last > 0 and text:find("^%s", last) do
          last = last - 1
        end
        return last >= 40 and text:find("^[%w]", last) ~= nil
      end },
  },

  holding_lines = {
    default = "Thanks for your patience, I'm looking into this and will get back to you shortly.",
    support = "One moment, a teammate will follow up with you shortly.",
    sales = "Thanks for your interest! Someone from our team will get back to you shortly.",
  },

  handoff = {
    support = "human-queue",
  },

  examples = {
    { text = "Traceback (most recent call last):\n  File \"app.py\", line 3, in <module>\nKeyError: 'id'",
      expect = { flagged = true, confidence = "high", checks = { "python_traceback" } } },
    { text = "Exception in thread \"main\" java.lang.NullPointerException\n\tat com.acme.Orders.find(Orders.java:42)",
      expect = { flagged = true, confidence = "high", checks = { "java_exception", "java_frame" } } },
    { text = "panic: runtime error: index out of range\n\ngoroutine 1 [running]:\nmain.main()",
      expect = { flagged = true, confidence = "high", checks = { "go_panic" } } },
    { text = "{\"error\": {\"type\": \"rate_limit_exceeded\", \"message\": \"slow down\"}}",
      expect = { flagged = true, confidence = "high", checks = { "error_json", "provider_error_code" } } },
    { text = "HTTP/1.1 503 Service Unavailable",
      expect = { flagged = true, confidence = "high", checks = { "http_status_line" } } },
    { text = "500 Internal Server Error.",
      expect = { flagged = true, confidence = "high", checks = { "internal_server_error" } } },
    { text = "Hi [object Object], your total is NaN.",
      expect = { flagged = true, confidence = "high", checks = { "object_object", "nan" } } },
    { text = "Your order number is undefined.",
      expect = { flagged = true, confidence = "low", checks = { "undefined" } } },
    { text = "  \n\t ",
      expect = { flagged = true, confidence = "low", checks = { "empty" } } },
    { text = "Your refund was approved and the money should reach your acco",
      expect = { flagged = true, confidence = "low", checks = { "truncated" } } },
    { description = "an ordinary reply",
      text = "Your order shipped yesterday and should arrive on Friday. Anything else?",
      expect = { flagged = false } },
    { description = "short replies without punctuation are fine; 'nan' and 'Nancy' are words",
      text = "Thanks Nancy, see you soon",
      expect = { flagged = false } },
    { description = "an agent may talk about errors in prose",
      text = "There was an error with your payment, please try another card.",
      expect = { flagged = false } },
  },
}
