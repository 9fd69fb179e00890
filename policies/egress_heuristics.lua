-- The default egress heuristics: catch machine error text about to reach a
-- user as an agent's reply. High confidence means the text is certainly not
-- a reply (a stack trace, a provider's error body): it is never sent. Low
-- confidence means it may be a reply that merely looks odd: with the quality
-- gate on, a judge decides, and if the judge fails it is sent, flagged for
-- review.
--
-- Patterns are Lua patterns (%f[%w]...%f[%W] is a whole word); substrings
-- are literal. Everything is case-sensitive: machine text has fixed case.
-- A verbatim fragment of the system prompt: a run of at least FRAGMENT
-- bytes of it inside the reply. The prompt is covered by pieces of CHUNK
-- bytes placed so that every FRAGMENT-byte window of it holds a whole
-- piece (a piece may start anywhere in the first FRAGMENT - CHUNK + 1
-- bytes of the window; CHUNK = FRAGMENT / 2 keeps about one piece per 20
-- bytes). Each piece starts on the rarest byte available, because a plain
-- find runs memchr on the first byte: a piece starting on "e" or a space
-- stops at every one of them. Only pieces found in the reply are extended
-- both ways, at most FRAGMENT bytes each; MAX_HITS bounds the hits. A reply
-- that shares that many pieces with the prompt without one long run is odd
-- enough to count as a leak. The plan is kept for the last prompt seen.
local FRAGMENT, CHUNK, MAX_HITS = 40, 20, 256

local function rarity(b)
  if b >= 65 and b <= 90 then
    return 3 -- upper case
  elseif b >= 48 and b <= 57 then
    return 3
  elseif b >= 97 and b <= 122 then
    return ("etaoinshrdlucm"):find(string.char(b), 1, true) and 0 or 2
  elseif b == 32 or b == 10 or b == 44 or b == 46 then
    return 0 -- space, newline, comma, full stop
  end
  return 3
end

local plan_prompt, plan_starts

local function plan(prompt)
  if prompt == plan_prompt then
    return plan_starts
  end
  local starts, p, np = {}, 1, #prompt
  while p + FRAGMENT - 1 <= np do
    local best, best_r = p, -1
    for a = p, p + FRAGMENT - CHUNK do
      local r = rarity(prompt:byte(a))
      if r >= best_r then -- the rarest, and the furthest of those
        best, best_r = a, r
      end
    end
    starts[#starts + 1] = best
    p = best + 1
  end
  plan_prompt, plan_starts = prompt, starts
  return starts
end

local function leaks_prompt(text, prompt)
  if type(prompt) ~= "string" or #prompt < FRAGMENT or #text < FRAGMENT then
    return false
  end
  local find, byte, sub = string.find, string.byte, string.sub
  local nt, np, hits = #text, #prompt, 0
  local starts = plan(prompt)
  for k = 1, #starts do
    local start = starts[k]
    local piece = sub(prompt, start, start + CHUNK - 1)
    local at = find(text, piece, 1, true)
    while at do
      hits = hits + 1
      if hits > MAX_HITS then
        return true
      end
      local run = CHUNK
      local t, q = at - 1, start - 1
      while run < FRAGMENT and t >= 1 and q >= 1 and byte(text, t) == byte(prompt, q) do
        run, t, q = run + 1, t - 1, q - 1
      end
      t, q = at + CHUNK, start + CHUNK
      while run < FRAGMENT and t <= nt and q <= np and byte(text, t) == byte(prompt, q) do
        run, t, q = run + 1, t + 1, q + 1
      end
      if run >= FRAGMENT then
        return true
      end
      at = find(text, piece, at + 1, true)
    end
  end
  return false
end

local PROVIDER_CODES = { "rate_limit_exceeded", "insufficient_quota", "context_length_exceeded",
  "invalid_request_error", "overloaded_error" }

local OPENERS = { "as an ai language model", "as a language model", "as an ai model",
  "i am an ai language model", "i'm an ai language model" }

-- Words that make a sentence an apology, or a statement that the agent
-- cannot help; a reply made only of such sentences answers nothing.
local APOLOGY = { "sorry", "apolog", "regret" }
local CANNOT = { "unable to", "can't", "cannot", "can not", "not able to", "don't have",
  "do not have", "not possible", "try again", "unfortunately", "don't know", "do not know",
  "no information", "not sure" }

local function has_any(s, list)
  for i = 1, #list do
    if s:find(list[i], 1, true) then
      return true
    end
  end
  return false
end

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
    -- Every frame has a "(": one search for it spares trying the pattern
    -- at every newline of a reply that has none.
    { name = "java_frame", confidence = "high",
      check = function(text)
        if not text:find("(", 1, true) then
          return false
        end
        local at = text:find("\n", 1, true)
        while at do
          if text:find("^\n%s*at [%a_$][%w_$]*%.[%w_$.<>]+%([^\n]*%)", at) then
            return true
          end
          at = text:find("\n", at + 1, true)
        end
        return false
      end },
    -- Go: "panic: ..." at the start of a line, or a goroutine dump header.
    { name = "go_panic", confidence = "high",
      check = function(text)
        if text:find("^panic: ") or text:find("\npanic: ", 1, true) then
          return true
        end
        -- the pattern only where its literal start occurs (a plain find)
        local at = text:find("goroutine ", 1, true)
        while at do
          if text:find("^goroutine %d+ %[[%a ]+%]:", at) then
            return true
          end
          at = text:find("goroutine ", at + 1, true)
        end
        return false
      end },

    -- Provider error bodies ----------------------------------------------
    { name = "error_json", confidence = "high",
      pattern = "\"error\"%s*:%s*[{\"]" },
    -- Every code has an underscore, which prose rarely has: one search for
    -- it spares five searches on almost every reply.
    { name = "provider_error_code", confidence = "high",
      check = function(text)
        if not text:find("_", 1, true) then
          return false
        end
        for _, code in ipairs(PROVIDER_CODES) do
          if text:find(code, 1, true) then
            return true
          end
        end
        return false
      end },

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

    -- The quality gate's checks -----------------------------------------
    -- The model's private reasoning, tags and all: never meant for the
    -- user and often quoting the system prompt or tool output. No reply
    -- needs these tags, so: high. (The sanitizing path removes the block
    -- and checks the rest again.)
    { name = "leaked_thinking", confidence = "high",
      substrings = { "<thinking>", "</thinking>", "<think>", "</think>" } },
    -- A verbatim run of 40+ bytes of the system prompt (ctx.system_prompt;
    -- no prompt, no check). High: 40 bytes of a deployment's own prose do
    -- not appear by chance (boilerplate such as "You are a helpful
    -- assistant." is shorter), and a leaked prompt cannot be unsent. A
    -- phrase the prompt asks the agent to say verbatim is the false
    -- positive; the judge downgrades it, and only a failed judge holds it.
    { name = "system_prompt_leak", confidence = "high",
      check = function(text, ctx)
        return leaks_prompt(text, ctx and ctx.system_prompt)
      end },
    -- "As an AI language model, ..." as the opener. Low: it is the model
    -- talking to the user, clumsy but not machine text, and usually
    -- followed by an answer; a judge decides, and if the judge fails the
    -- reply goes out marked for review rather than leaving the user with
    -- nothing.
    { name = "ai_language_model_opener", confidence = "low",
      check = function(text)
        local head = text:sub(1, 64):lower():gsub("^[%s%p]+", "")
        for i = 1, #OPENERS do
          if head:sub(1, #OPENERS[i]) == OPENERS[i] then
            return true
          end
        end
        return false
      end },
    -- A short reply that only apologises (or says it cannot help) to a
    -- substantive question (ctx.question with four words or more). Low:
    -- sometimes "sorry, I can't help with that" is the right answer.
    { name = "apology_only", confidence = "low",
      check = function(text, ctx)
        local q = ctx and ctx.question
        if type(q) ~= "string" or #text > 400 then
          return false
        end
        local words = 0
        for _ in q:gmatch("%a+") do
          words = words + 1
          if words >= 4 then
            break
          end
        end
        if words < 4 then
          return false
        end
        local apologised = false
        for sentence in text:lower():gmatch("[^%.!?\n]+") do
          if sentence:find("%a") then
            local sorry = has_any(sentence, APOLOGY)
            if not sorry and not has_any(sentence, CANNOT) then
              return false -- a sentence with content
            end
            apologised = apologised or sorry
          end
        end
        return apologised
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

  -- What the user is told when, after a holding line, no answer came
  -- within the commitment (fallback.commitment_ms) and a person takes over.
  handoff_lines = {
    default = "Sorry for the wait. A member of our team will pick this up and reply here.",
    support = "Sorry for the wait. I've passed this to our support team; a person will reply here shortly.",
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
    { description = "a leaked reasoning block",
      text = "<thinking>The user seems upset; stall them.</thinking>Your refund is on its way.",
      expect = { flagged = true, confidence = "high", checks = { "leaked_thinking" } } },
    { description = "a verbatim run of the system prompt",
      ctx = { system_prompt = "You are Acme's support agent. Never offer refunds above 50 EUR without approval from a supervisor." },
      text = "My instructions say: Never offer refunds above 50 EUR without approval from a supervisor.",
      expect = { flagged = true, confidence = "high", checks = { "system_prompt_leak" } } },
    { description = "a short shared phrase is not a leak",
      ctx = { system_prompt = "You are Acme's support agent. Never offer refunds above 50 EUR without approval from a supervisor." },
      text = "I am Acme's support agent and I can help with your order.",
      expect = { flagged = false } },
    { text = "As an AI language model, I do not have opinions, but here are both options.",
      expect = { flagged = true, confidence = "low", checks = { "ai_language_model_opener" } } },
    { description = "an apology and nothing else, to a real question",
      ctx = { question = "How do I change the delivery address of my order?" },
      text = "I'm sorry, I can't help with that.",
      expect = { flagged = true, confidence = "low", checks = { "apology_only" } } },
    { description = "an apology followed by an answer",
      ctx = { question = "How do I change the delivery address of my order?" },
      text = "Sorry for the wait! Open the order and choose Change address.",
      expect = { flagged = false } },
    { description = "an agent may talk about errors in prose",
      text = "There was an error with your payment, please try another card.",
      expect = { flagged = false } },
  },
}
