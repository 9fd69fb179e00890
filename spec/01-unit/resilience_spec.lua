-- Circuit breaker, backoff, Retry-After, retry rules and the retry budget,
-- as a policy author uses them (times in milliseconds, epoch seconds for
-- Retry-After's HTTP-date).
local om = require "openmesh"

-- The call fails and its message contains `needle` (plain text).
local function raises(needle, fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "expected an error containing: " .. needle)
  err = tostring(err)
  assert(err:find(needle, 1, true),
         ("error %q does not contain %q"):format(err, needle))
end

local S = 1000 -- ms per second

describe("om.circuit", function()
  local function fail(c, now, n)
    for _ = 1, n do
      assert.is_true(c:allow(now))
      c:record(now, false)
    end
  end

  it("opens after 5 consecutive failures and reports half_open after the cooldown", function()
    local c = om.circuit{failures = 5, cooldown_ms = 30000}
    assert.equal("closed", c:state(0))
    fail(c, 1000, 4)
    assert.equal("closed", c:state(1000))
    assert.is_true(c:allow(1000))
    assert.equal("open", c:record(1000, false))
    assert.equal("open", c:state(1000))
    assert.is_false(c:allow(1000))
    assert.is_false(c:allow(30999))
    -- the cooldown has passed: half_open before anyone calls allow()
    assert.equal("half_open", c:state(31000))
    assert.is_true(c:peek(31000))
    assert.equal("half_open", c:state(31000))
  end)

  it("a success in between resets the consecutive count", function()
    local c = om.circuit{failures = 3, window_ms = 0}
    for i = 1, 20 do
      c:record(i, i % 3 == 0)
    end
    assert.equal("closed", c:state(21))
  end)

  it("admits exactly one probe in half_open; its success closes", function()
    local c = om.circuit{failures = 5, cooldown_ms = 30000}
    fail(c, 0, 5)
    assert.is_true(c:allow(30000))   -- the probe
    assert.is_false(c:allow(30000))  -- nobody else
    assert.is_false(c:allow(90000))
    assert.is_false(c:peek(90000))
    assert.equal("half_open", c:state(90000))
    assert.equal("closed", c:record(90500, true))
    assert.is_true(c:allow(90500))
    assert.equal(1, c:trips(90500))
    -- healthy for reset_ms (default 300 s): the trip count is forgiven
    assert.equal(0, c:trips(90500 + 300000))
  end)

  it("a failed probe reopens with a longer cooldown: 30, 60, 90 s ... capped at 300 s", function()
    local c = om.circuit{failures = 5, cooldown_ms = 30000}
    local now = 0
    fail(c, now, 5)
    for trip = 1, 12 do
      local cooldown = math.min(30000 * trip, 300000)
      assert.equal(trip, c:trips(now))
      assert.equal("open", c:state(now + cooldown - 1))
      assert.equal("half_open", c:state(now + cooldown))
      now = now + cooldown
      assert.is_true(c:allow(now))
      assert.equal("open", c:record(now, false))
    end
  end)

  it("trips on the failure ratio over the window", function()
    local c = om.circuit{failures = 0, window_ms = 10000, min_requests = 20,
                         failure_ratio = 0.5}
    for _ = 1, 10 do c:record(100, true) end
    for _ = 1, 9 do c:record(100, false) end
    assert.equal("closed", c:state(100))
    assert.equal("open", c:record(200, false)) -- 10 of 20
  end)

  it("forgets failures that left the window", function()
    local c = om.circuit{failures = 0, window_ms = 10000, min_requests = 4,
                         failure_ratio = 0.5}
    for _ = 1, 3 do c:record(0, false) end
    -- 10 s later those three are gone: 1 of 1 is under min_requests
    assert.equal("closed", c:record(10000, false))
    assert.equal("closed", c:record(10000, true))
    assert.equal("closed", c:record(10000, true))
    assert.equal("open", c:record(10000, false)) -- 2 of 4
  end)

  it("can be closed, also by a to-be-closed variable; methods then raise", function()
    local c = om.circuit()
    assert.matches("^openmesh%.Circuit", tostring(c))
    c:close()
    c:close() -- idempotent
    assert.equal("openmesh.Circuit (closed)", tostring(c))
    raises("circuit is closed", c.allow, c, 0)
    do
      local d <close> = om.circuit{failures = 1}
      assert.is_true(d:allow(0))
    end
  end)

  it("rejects bad options, naming the field", function()
    raises("field 'failures': must be in [0, 4294967295], got -1", om.circuit, {failures = -1})
    raises("field 'failures': integer expected", om.circuit, {failures = 2.5})
    raises("field 'failures': integer expected", om.circuit, {failures = 0 / 0})
    raises("field 'failures': integer expected", om.circuit, {failures = "5"})
    raises("field 'cooldown_ms': must be > 0", om.circuit, {cooldown_ms = 0})
    raises("field 'cooldown_ms': must be a finite number >= 0", om.circuit, {cooldown_ms = -5})
    raises("field 'cooldown_ms': must be a finite number >= 0", om.circuit, {cooldown_ms = 0 / 0})
    raises("field 'cooldown_ms': number of milliseconds expected", om.circuit, {cooldown_ms = "30s"})
    raises("field 'max_cooldown_ms': must be >= cooldown_ms", om.circuit,
           {cooldown_ms = 60000, max_cooldown_ms = 30000})
    raises("field 'window_ms': must be 0 (off) or >= 1", om.circuit, {window_ms = 0.5})
    raises("field 'window_ms': must be a finite number >= 0", om.circuit, {window_ms = math.huge})
    raises("field 'min_requests': must be in [1, 4294967295], got 0", om.circuit, {min_requests = 0})
    raises("field 'failure_ratio': must be > 0", om.circuit, {failure_ratio = 0})
    raises("field 'failure_ratio': must be in", om.circuit, {failure_ratio = 1.5})
    raises("field 'failure_ratio': must be in", om.circuit, {failure_ratio = 0 / 0})
    raises("field 'failure_ratio': number expected", om.circuit, {failure_ratio = "half"})
    raises("field 'failures': 0 (off) needs the ratio rule", om.circuit, {failures = 0, window_ms = 0})
    raises("unknown field 'failure'", om.circuit, {failure = 3})
    raises("table expected, got string", om.circuit, "failures=5")
  end)

  it("rejects bad arguments to its methods", function()
    local c = om.circuit()
    raises("number expected, got no value", c.allow, c)
    raises("now_ms must be a finite number >= 0", c.allow, c, -1)
    raises("now_ms must be a finite number >= 0", c.state, c, 0 / 0)
    raises("boolean expected, got string", c.record, c, 0, "ok")
    raises("boolean expected, got no value", c.record, c, 0)
    raises("openmesh.Circuit expected", c.allow, {}, 0)
  end)
end)

describe("om.backoff", function()
  it("waits up to base_ms on the first retry, doubling up to cap_ms", function()
    local function ceiling(attempt)
      -- random just below 1 gives (almost) the ceiling of the interval
      return om.backoff{attempt = attempt, base_ms = 100, cap_ms = 5000,
                        random = 0.9999999999}
    end
    assert.near(100, ceiling(1), 1e-3)
    assert.near(200, ceiling(2), 1e-3)
    assert.near(400, ceiling(3), 1e-3)
    assert.near(3200, ceiling(6), 1e-3)
    assert.near(5000, ceiling(7), 1e-3)
    assert.near(5000, ceiling(1000), 1e-3) -- no overflow, just the cap
  end)

  it("is full jitter: random x the ceiling", function()
    assert.equal(0, om.backoff{attempt = 3, base_ms = 100, cap_ms = 5000, random = 0})
    assert.equal(200, om.backoff{attempt = 3, base_ms = 100, cap_ms = 5000, random = 0.5})
    assert.equal(100, om.backoff{attempt = 3, base_ms = 100, cap_ms = 5000, random = 0.25})
    -- defaults: base 100 ms, cap 10 s
    assert.equal(5000, om.backoff{attempt = 20, random = 0.5})
    for _ = 1, 200 do
      local v = om.backoff{attempt = 4, base_ms = 50, cap_ms = 10000, random = math.random()}
      assert.is_true(v >= 0 and v < 400)
    end
  end)

  it("rejects bad options, naming the field", function()
    raises("field 'attempt': required", om.backoff, {random = 0.5})
    raises("field 'attempt': must be in [1, 4294967295], got 0", om.backoff, {attempt = 0, random = 0.5})
    raises("field 'attempt': integer expected", om.backoff, {attempt = 1.5, random = 0.5})
    raises("field 'attempt': integer expected", om.backoff, {attempt = "2", random = 0.5})
    raises("field 'random': required", om.backoff, {attempt = 1})
    raises("field 'random': must be in [0, 1)", om.backoff, {attempt = 1, random = 1})
    raises("field 'random': must be in", om.backoff, {attempt = 1, random = -0.1})
    raises("field 'random': must be in", om.backoff, {attempt = 1, random = 0 / 0})
    raises("field 'random': number expected", om.backoff, {attempt = 1, random = "0.5"})
    raises("field 'base_ms': must be a finite number >= 0", om.backoff,
           {attempt = 1, random = 0.5, base_ms = -1})
    raises("field 'cap_ms': number of milliseconds expected", om.backoff,
           {attempt = 1, random = 0.5, cap_ms = "10s"})
    raises("unknown field 'jitter'", om.backoff, {attempt = 1, random = 0.5, jitter = true})
    raises("table expected, got number", om.backoff, 3)
  end)
end)

describe("om.retry_after", function()
  local date_s = 784111777 -- Sun, 06 Nov 1994 08:49:37 GMT

  it("reads delay-seconds", function()
    assert.equal(120 * S, om.retry_after("120", 0, 300000))
    assert.equal(0, om.retry_after("0", 0))
    assert.equal(5 * S, om.retry_after("  5\t", 0)) -- OWS trimmed
    assert.is_true(math.type(om.retry_after("5", 0)) == "integer")
  end)

  it("reads all three HTTP-date formats (RFC 9110 section 5.6.7)", function()
    assert.equal(10 * S, om.retry_after("Sun, 06 Nov 1994 08:49:37 GMT", date_s - 10))
    assert.equal(10 * S, om.retry_after("Sunday, 06-Nov-94 08:49:37 GMT", date_s - 10))
    assert.equal(10 * S, om.retry_after("Sun Nov  6 08:49:37 1994", date_s - 10))
    -- a fractional now is floored: never wait less than the date says
    assert.equal(10 * S, om.retry_after("Sun, 06 Nov 1994 08:49:37 GMT", date_s - 9.5))
  end)

  it("turns a date in the past into 0", function()
    assert.equal(0, om.retry_after("Sun, 06 Nov 1994 08:49:37 GMT", date_s))
    assert.equal(0, om.retry_after("Sun, 06 Nov 1994 08:49:37 GMT", os.time()))
  end)

  it("clamps to the ceiling (default 60 s)", function()
    assert.equal(60 * S, om.retry_after("3600", 0))
    assert.equal(60 * S, om.retry_after("99999999999999999999999", 0))
    assert.equal(5 * S, om.retry_after("3600", 0, 5000))
    assert.equal(60 * S, om.retry_after("Sun, 06 Nov 1994 08:49:37 GMT", date_s - 3600))
    assert.equal(0, om.retry_after("3600", 0, 0))
  end)

  it("treats a malformed value as absent (nil), never trusting it", function()
    local bad = {"", " ", "-1", "+5", "1.5", "12abc", "abc", "1e3", "0x10",
                 "Sun, 31 Feb 1994 08:49:37 GMT", "Sun, 06 Nov 1994 25:00:00 GMT",
                 "Sun, 06 nov 1994 08:49:37 GMT", "Sun, 06 Nov 1994 08:49:37",
                 "Mon, 06 Nov 1994 08:49:37 GMT", "Sun Nov 6 08:49:37 1994",
                 "Sun, 06 Nov 1994 08:49:37 GMT trailing", "120 seconds"}
    for _, v in ipairs(bad) do
      assert.is_nil(om.retry_after(v, date_s - 10), v)
    end
    assert.is_nil(om.retry_after(nil, 0)) -- the header was not there
  end)

  it("rejects bad arguments", function()
    raises("string or nil expected, got table", om.retry_after, {}, 0)
    raises("string or nil expected, got number", om.retry_after, 120, 0)
    raises("number expected, got no value", om.retry_after, "120")
    raises("now_s must be a finite number of epoch seconds >= 0", om.retry_after, "120", -1)
    raises("now_s must be a finite number of epoch seconds >= 0", om.retry_after, "120", 0 / 0)
    raises("ceiling_ms must be a finite number >= 0", om.retry_after, "120", 0, -1)
    raises("ceiling_ms must be a finite number >= 0", om.retry_after, "120", 0, 0 / 0)
  end)
end)

describe("om.retry_after_ms", function()
  it("reads milliseconds, rounding a fraction up", function()
    assert.equal(1500, om.retry_after_ms("1500"))
    assert.equal(2, om.retry_after_ms("1.5"))
    assert.equal(0, om.retry_after_ms("0"))
    assert.equal(60000, om.retry_after_ms("9000000"))
    assert.equal(100, om.retry_after_ms("9000000", 100))
    assert.is_nil(om.retry_after_ms(nil))
  end)

  it("treats malformed values as absent", function()
    for _, v in ipairs{"", "-1", ".5", "5.", "1e3", "abc", "12ms", "1,5"} do
      assert.is_nil(om.retry_after_ms(v), v)
    end
  end)

  it("rejects bad arguments", function()
    raises("string or nil expected, got boolean", om.retry_after_ms, true)
    raises("ceiling_ms must be a finite number >= 0", om.retry_after_ms, "5", -3)
  end)
end)

describe("om.retryable", function()
  it("retries idempotent methods on 502/503/504", function()
    for _, m in ipairs{"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"} do
      for _, st in ipairs{502, 503, 504} do
        local ok, why = om.retryable{method = m, status = st}
        assert.is_true(ok)
        assert.equal("idempotent_method", why)
      end
    end
  end)

  it("does not retry POST/PATCH without a key or an opt-in", function()
    for _, m in ipairs{"POST", "PATCH", "get", "Get"} do -- methods are case-sensitive
      local ok, why = om.retryable{method = m, status = 503}
      assert.is_false(ok)
      assert.equal("non_idempotent", why)
    end
  end)

  it("retries POST with a non-empty Idempotency-Key", function()
    local ok, why = om.retryable{method = "POST", status = 503,
                                 headers = {["idempotency-key"] = "a1b2"}}
    assert.is_true(ok)
    assert.equal("idempotency_key", why)
    -- header names are case-insensitive
    ok, why = om.retryable{method = "POST", status = 503,
                           headers = {["Idempotency-Key"] = "a1b2"}}
    assert.is_true(ok)
    assert.equal("idempotency_key", why)
    -- an empty key is no key
    ok, why = om.retryable{method = "POST", status = 503,
                           headers = {["idempotency-key"] = ""}}
    assert.is_false(ok)
    assert.equal("non_idempotent", why)
    ok = om.retryable{method = "POST", status = 503, headers = {["idempotency-key"] = "  "}}
    assert.is_false(ok)
    ok = om.retryable{method = "POST", status = 503, headers = {["x-other"] = "k"}}
    assert.is_false(ok)
  end)

  it("retries POST when the policy opts in", function()
    local ok, why = om.retryable{method = "POST", status = 502, opt_in = true}
    assert.is_true(ok)
    assert.equal("opt_in", why)
    ok, why = om.retryable{method = "POST", status = 502, opt_in = false}
    assert.is_false(ok)
    assert.equal("non_idempotent", why)
  end)

  it("does not retry other statuses, whatever the method", function()
    for _, st in ipairs{200, 400, 404, 429, 500, 501} do
      local ok, why = om.retryable{method = "GET", status = st}
      assert.is_false(ok)
      assert.equal("status_not_retryable", why)
    end
  end)

  it("takes a custom status set (429 opt-in)", function()
    local ok, why = om.retryable{method = "GET", status = 429, statuses = {429, 503}}
    assert.is_true(ok)
    assert.equal("idempotent_method", why)
    ok, why = om.retryable{method = "GET", status = 502, statuses = {429, 503}}
    assert.is_false(ok)
    assert.equal("status_not_retryable", why)
  end)

  it("retries any method when nothing of the request was sent", function()
    for _, e in ipairs{"timeout", "connect", "reset"} do
      local ok, why = om.retryable{method = "POST", error = e, sent = false}
      assert.is_true(ok)
      assert.equal("not_sent", why)
      ok, why = om.retryable{method = "POST", error = e, sent = true}
      assert.is_false(ok)
      assert.equal("non_idempotent", why)
    end
    local ok, why = om.retryable{method = "GET", error = "connect", sent = false}
    assert.is_true(ok)
    assert.equal("idempotent_method", why)
    ok, why = om.retryable{method = "POST", error = "connect", sent = false, errors = {"reset"}}
    assert.is_false(ok)
    assert.equal("error_not_retryable", why)
    assert.has_error(function() om.retryable{method = "GET", status = 503, sent = false} end)
    assert.has_error(function() om.retryable{method = "GET", error = "reset", sent = 0} end)
  end)

  it("classifies transport errors without a status", function()
    for _, e in ipairs{"timeout", "connect", "reset"} do
      assert.is_true((om.retryable{method = "GET", error = e}))
      local ok, why = om.retryable{method = "POST", error = e}
      assert.is_false(ok)
      assert.equal("non_idempotent", why)
    end
    local ok, why = om.retryable{method = "GET", error = "reset", errors = {"timeout"}}
    assert.is_false(ok)
    assert.equal("error_not_retryable", why)
  end)

  it("rejects bad requests, naming the field", function()
    raises("field 'method': string expected", om.retryable, {status = 503})
    raises("field 'method': string expected", om.retryable, {method = 1, status = 503})
    raises("field 'status': required (or 'error')", om.retryable, {method = "GET"})
    raises("give either 'status' or 'error', not both", om.retryable,
           {method = "GET", status = 503, error = "timeout"})
    raises("field 'status': must be in [100, 599], got 99", om.retryable, {method = "GET", status = 99})
    raises("field 'status': integer expected", om.retryable, {method = "GET", status = "503"})
    raises("field 'error': unknown error class 'dns'", om.retryable, {method = "GET", error = "dns"})
    raises("field 'error': \"connect\", \"timeout\" or \"reset\" expected", om.retryable,
           {method = "GET", error = 7})
    raises("field 'opt_in': boolean expected", om.retryable, {method = "POST", status = 503, opt_in = "yes"})
    raises("field 'headers': table expected", om.retryable, {method = "POST", status = 503, headers = "k"})
    raises("field 'headers': 'idempotency-key' must be a string", om.retryable,
           {method = "POST", status = 503, headers = {["idempotency-key"] = {"a"}}})
    raises("field 'statuses': entries must be integers in [100, 599]", om.retryable,
           {method = "GET", status = 503, statuses = {600}})
    raises("field 'statuses': array of status codes expected", om.retryable,
           {method = "GET", status = 503, statuses = 503})
    raises("field 'errors': unknown error class 'dns'", om.retryable,
           {method = "GET", status = 503, errors = {"dns"}})
    raises("unknown field 'idempotency_key'", om.retryable,
           {method = "POST", status = 503, idempotency_key = "k"})
    raises("table expected, got no value", om.retryable)
    raises("table expected, got nil", om.retryable, nil)
  end)
end)

describe("om.retry_budget", function()
  local function drain(b, now)
    local n = 0
    while b:withdraw(now) do n = n + 1 end
    return n
  end

  it("always allows the floor: 10 retries/s over the 10 s window", function()
    local b = om.retry_budget{ratio = 0.2, window_ms = 10000, min_per_s = 10}
    assert.equal(100, b:balance(0))
    assert.equal(100, drain(b, 0))
    assert.is_false(b:withdraw(5000))
    -- those retries leave the window, the floor is back
    assert.equal(100, drain(b, 10000))
  end)

  it("adds 20% of requests on top of the floor", function()
    local b = om.retry_budget{ratio = 0.2, window_ms = 10000, min_per_s = 10}
    for _ = 1, 1000 do b:request(1000) end
    assert.equal(300, drain(b, 1000))
    local c = om.retry_budget{ratio = 0.2, window_ms = 10000, min_per_s = 0}
    for _ = 1, 4 do c:request(0) end
    assert.is_false(c:withdraw(0))
    c:request(0)
    assert.is_true(c:withdraw(0)) -- 5 x 20% = 1
    assert.is_false(c:withdraw(0))
  end)

  it("slides: requests older than the window stop earning retries", function()
    local b = om.retry_budget{ratio = 0.5, window_ms = 10000, min_per_s = 0}
    for _ = 1, 10 do b:request(0) end
    assert.equal(5, b:balance(9999))
    assert.equal(0, b:balance(10000))
  end)

  it("uses defaults (20%, 10 s, 10/s) and closes", function()
    local b = om.retry_budget()
    assert.equal(100, b:balance(0))
    b:close()
    b:close()
    raises("retry budget is closed", b.withdraw, b, 0)
  end)

  it("rejects bad options, naming the field", function()
    raises("field 'ratio': must be in", om.retry_budget, {ratio = -0.1})
    raises("field 'ratio': must be in", om.retry_budget, {ratio = 0 / 0})
    raises("field 'ratio': number expected", om.retry_budget, {ratio = "20%"})
    raises("field 'window_ms': must be in [1, 3600000]", om.retry_budget, {window_ms = 0})
    raises("field 'window_ms': must be a finite number >= 0", om.retry_budget, {window_ms = -10})
    raises("field 'min_per_s': must be in", om.retry_budget, {min_per_s = -1})
    raises("field 'min_per_s': must be in", om.retry_budget, {min_per_s = math.huge})
    raises("unknown field 'ttl_ms'", om.retry_budget, {ttl_ms = 10000})
    local b = om.retry_budget()
    raises("now_ms must be a finite number >= 0", b.request, b, -1)
    raises("number expected, got string", b.withdraw, b, "now")
  end)
end)
