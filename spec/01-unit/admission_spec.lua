-- admission_spec.lua: admission control, the adaptive limiter and the call
-- deadline, as a policy author uses them.
--
-- API (see bindings/l_admission.c for the full contract):
--   om.deadline(budget_ms, now_ms)   d:remaining(now) d:attempt_timeout(now, per_try)
--     d:can_start_attempt(now [, min_useful]) d:expired(now) d:at()
--   om.admission{max_inflight = n, max_queue = m}
--     a:acquire(now [, deadline]) -> "admitted" | "queued", ticket | nil, msg, code
--     a:release(now) -> admitted, expired     a:set_limit(n, now) -> admitted, expired
--     a:expire(now) -> expired   a:next_deadline() -> ms | nil
--     a:cancel(ticket) -> bool   a:stats() -> {...}   a:close()
--   om.limiter{min_limit, max_limit, initial, tolerance, smoothing, backoff,
--              window_ms, window_samples, long_window}
--     l:sample(rtt_ms, now_ms [, dropped [, inflight]]) -> limit   l:limit()  l:stats()
local om = require "openmesh"

describe("om.deadline", function()
  it("counts the budget down to zero", function()
    local d = om.deadline(250, 1000)
    assert.equal(1250, d:at())
    assert.equal(250, d:remaining(1000))
    assert.equal(100, d:remaining(1150))
    assert.equal(0, d:remaining(1250))
    assert.equal(0, d:remaining(5000))
    assert.is_false(d:expired(1249))
    assert.is_true(d:expired(1250))
  end)

  it("keeps fractions of a millisecond", function()
    local d = om.deadline(1.5, 0)
    assert.equal(1.5, d:remaining(0))
    assert.equal(0.5, d:remaining(1))
  end)

  it("gives each attempt min(per_try, remaining)", function()
    local d = om.deadline(1000, 0)
    assert.equal(300, d:attempt_timeout(0, 300))
    assert.equal(200, d:attempt_timeout(800, 300))
    assert.equal(1000, d:attempt_timeout(0, math.huge))
    assert.equal(0, d:attempt_timeout(1000, 300))
  end)

  it("only starts an attempt that has a useful budget", function()
    local d = om.deadline(100, 0)
    assert.is_true(d:can_start_attempt(50, 50))
    assert.is_false(d:can_start_attempt(51, 50))
    assert.is_true(d:can_start_attempt(99))
    assert.is_false(d:can_start_attempt(100))
  end)

  it("has no deadline with math.huge, and saturates", function()
    local d = om.deadline(math.huge, 0)
    assert.equal(math.huge, d:at())
    assert.equal(math.huge, d:remaining(1e12))
    assert.is_false(d:expired(1e15))
    assert.equal(300, d:attempt_timeout(5, 300))
    assert.equal(math.huge, d:attempt_timeout(5, math.huge))
    assert.is_true(d:can_start_attempt(1e15, 1e9))
    -- a sum past the end of the clock is "never", not a wrap-around
    assert.equal(math.huge, om.deadline(1e300, 1e12):remaining(0))
    assert.matches("never", tostring(d))
  end)

  it("is expired at once with a zero budget", function()
    local d = om.deadline(0, 10)
    assert.is_true(d:expired(10))
    assert.is_false(d:can_start_attempt(10))
  end)

  it("raises on negative or malformed budgets and times", function()
    assert.has_error(function() om.deadline(-1, 0) end,
      "bad argument #1 to 'deadline' (budget_ms must be a number >= 0 (math.huge for none))")
    assert.has_error(function() om.deadline(0 / 0, 0) end,
      "bad argument #1 to 'deadline' (budget_ms must be a number >= 0 (math.huge for none))")
    assert.has_error(function() om.deadline(100, -5) end,
      "bad argument #2 to 'deadline' (now_ms must be a finite number >= 0)")
    assert.has_error(function() om.deadline("soon", 0) end)
    local d = om.deadline(100, 0)
    assert.has_error(function() d:remaining(-1) end,
      "bad argument #1 to 'remaining' (now_ms must be a finite number >= 0)")
    assert.has_error(function() d:attempt_timeout(0, -1) end,
      "bad argument #2 to 'attempt_timeout' (per_try_ms must be a number >= 0 (math.huge for none))")
    assert.has_error(function() d:can_start_attempt(0, -1) end)
  end)
end)

describe("om.admission", function()
  it("admits up to max_inflight, queues up to max_queue, then rejects", function()
    local a = om.admission{max_inflight = 2, max_queue = 1}
    assert.equal("admitted", a:acquire(0))
    assert.equal("admitted", a:acquire(0))
    local st, t = a:acquire(0)
    assert.equal("queued", st)
    assert.is_number(t)
    local ok, msg, code = a:acquire(0)
    assert.is_nil(ok)
    assert.equal("EOVERLOAD", code)
    assert.matches("^EOVERLOAD: ", msg)
    assert.same({inflight = 2, queued = 1, limit = 2, max_queue = 1,
                 admitted = 2, rejected = 1, expired = 0, cancelled = 0},
                a:stats())
  end)

  it("rejects at once without a queue (the default)", function()
    local a = om.admission{max_inflight = 1}
    assert.equal("admitted", a:acquire(0))
    assert.same({nil, "EOVERLOAD: overloaded: in-flight limit and queue are full",
                 "EOVERLOAD"}, {a:acquire(0)})
  end)

  it("hands released slots to the queue in FIFO order", function()
    local a = om.admission{max_inflight = 1, max_queue = 8}
    assert.equal("admitted", a:acquire(0))
    local tickets = {}
    for i = 1, 4 do
      -- deadlines out of order: the queue is still first come, first served
      local _, t = a:acquire(0, 100 - i)
      tickets[i] = t
    end
    for i = 1, 4 do
      local admitted, expired = a:release(1)
      assert.same({tickets[i]}, admitted)
      assert.same({}, expired)
      assert.equal(1, a:stats().inflight)
    end
    local admitted = a:release(1)
    assert.same({}, admitted)
    assert.equal(0, a:stats().inflight)
    assert.has_error(function() a:release(1) end,
      "release without an admitted request in flight")
  end)

  it("fails queued tickets whose deadline passes, and never admits them", function()
    local a = om.admission{max_inflight = 1, max_queue = 8}
    assert.equal("admitted", a:acquire(0))
    local _, late = a:acquire(0, om.deadline(300, 0))
    local _, soon = a:acquire(0, om.deadline(100, 0))
    local _, never = a:acquire(0)
    assert.equal(100, a:next_deadline())
    assert.same({}, a:expire(99))
    assert.same({soon}, a:expire(100))
    assert.equal(300, a:next_deadline())
    assert.same({late}, (a:release(150)))
    assert.same({never}, (a:release(400)))
    assert.is_nil(a:next_deadline())
    assert.equal(1, a:stats().expired)
  end)

  it("fails an overdue head on release even before the timer fired", function()
    local a = om.admission{max_inflight = 1, max_queue = 4}
    a:acquire(0)
    local _, t1 = a:acquire(0, 10)
    local _, t2 = a:acquire(0, 50)
    local admitted, expired = a:release(20)
    assert.same({t2}, admitted)
    assert.same({t1}, expired)
  end)

  it("refuses to start a request whose deadline already passed", function()
    local a = om.admission{max_inflight = 4}
    local ok, msg, code = a:acquire(100, om.deadline(50, 0))
    assert.is_nil(ok)
    assert.equal("EDEADLINE", code)
    assert.equal("EDEADLINE: deadline exceeded", msg)
    assert.equal(0, a:stats().inflight)
  end)

  it("lets a waiter that gives up cancel its ticket", function()
    local a = om.admission{max_inflight = 1, max_queue = 4}
    a:acquire(0)
    local _, t1 = a:acquire(0, 100)
    local _, t2 = a:acquire(0, 200)
    assert.is_true(a:cancel(t1))
    assert.is_false(a:cancel(t1)) -- twice
    assert.is_false(a:cancel(999)) -- never issued
    assert.equal(200, a:next_deadline())
    assert.same({t2}, (a:release(0)))
    assert.is_false(a:cancel(t2)) -- already admitted
    assert.equal(1, a:stats().cancelled)
    assert.has_error(function() a:cancel("t1") end)
  end)

  it("never reuses a ticket, so a stale one cannot cancel a newer request", function()
    local a = om.admission{max_inflight = 1, max_queue = 1}
    a:acquire(0)
    local _, old = a:acquire(0)
    assert.is_true(a:cancel(old))
    local _, new = a:acquire(0)
    assert.are_not.equal(old, new)
    assert.is_false(a:cancel(old))
    assert.equal(1, a:stats().queued)
    assert.is_true(a:cancel(new))
  end)

  it("admits queued tickets when the limit is raised", function()
    local a = om.admission{max_inflight = 1, max_queue = 8}
    a:acquire(0)
    local t = {}
    for i = 1, 4 do
      local _, ticket = a:acquire(0)
      t[i] = ticket
    end
    local admitted, expired = a:set_limit(3, 0)
    assert.same({t[1], t[2]}, admitted)
    assert.same({}, expired)
    assert.equal(3, a:stats().limit)
    -- lowering revokes nothing and admits nobody
    assert.same({}, (a:set_limit(1, 0)))
    assert.equal(3, a:stats().inflight)
    assert.same({}, (a:release(0)))
    assert.same({}, (a:release(0)))
    assert.same({t[3]}, (a:release(0)))
  end)

  it("counts admissions, rejections, expiries and cancellations", function()
    local a = om.admission{max_inflight = 1, max_queue = 2}
    a:acquire(0)
    local _, t1 = a:acquire(0, 5)
    a:acquire(0)
    a:acquire(0) -- rejected
    a:acquire(10, 5) -- already expired
    a:expire(5)
    local s = a:stats()
    assert.same({inflight = 1, queued = 1, limit = 1, max_queue = 2,
                 admitted = 1, rejected = 1, expired = 2, cancelled = 0}, s)
    assert.is_false(a:cancel(t1))
  end)

  it("is closed by close(), __close and the collector, idempotently", function()
    local a = om.admission{max_inflight = 1, max_queue = 2}
    a:acquire(0)
    a:acquire(0)
    a:close()
    a:close()
    assert.has_error(function() a:acquire(0) end,
      "calling 'acquire' on bad self (admission is closed)")
    assert.matches("closed", tostring(a))
    do
      local b <close> = om.admission{max_inflight = 1, max_queue = 1}
      b:acquire(0)
      b:acquire(0)
    end
    for _ = 1, 50 do
      local c = om.admission{max_inflight = 1, max_queue = 64}
      c:acquire(0)
      c:acquire(0, 10)
    end
    collectgarbage()
    collectgarbage()
  end)

  it("raises on bad options", function()
    assert.has_error(function() om.admission{max_inflight = 0} end,
      "bad argument #1 to 'admission' (field 'max_inflight': must be in [1, 4294967295], got 0)")
    assert.has_error(function() om.admission{max_inflight = 2.5} end,
      "bad argument #1 to 'admission' (field 'max_inflight': integer expected)")
    assert.has_error(function() om.admission{max_queue = 4} end,
      "bad argument #1 to 'admission' (field 'max_inflight': required)")
    assert.has_error(function() om.admission{max_inflight = 1, max_queue = -1} end,
      "bad argument #1 to 'admission' (field 'max_queue': must be in [0, 65536], got -1)")
    assert.has_error(function() om.admission{max_inflight = 1, max_queu = 4} end,
      "bad argument #1 to 'admission' (unknown field 'max_queu')")
    assert.has_error(function() om.admission() end)
    local a = om.admission{max_inflight = 1}
    assert.has_error(function() a:set_limit(0, 0) end,
      "bad argument #1 to 'set_limit' (limit must be an integer in [1, 4294967295])")
    assert.has_error(function() a:acquire(-1) end,
      "bad argument #1 to 'acquire' (now_ms must be a finite number >= 0)")
    assert.has_error(function() a:acquire(0, -5) end,
      "bad argument #2 to 'acquire' (deadline must be a number >= 0 (math.huge for none))")
    assert.has_error(function() a:acquire(0, {}) end)
  end)
end)

describe("om.limiter", function()
  -- One request every 10 ms, the pool saturated, until n windows closed.
  local function run(l, clock, rtt_ms, windows)
    local target = l:stats().windows + windows
    while l:stats().windows < target do
      clock.now = clock.now + 10
      l:sample(rtt_ms, clock.now, false, l:limit())
    end
    return l:limit()
  end

  it("has sane defaults", function()
    local l = om.limiter()
    assert.equal(20, l:limit())
    assert.same({limit = 20, estimate = 20, long_rtt_ms = 0, short_rtt_ms = 0,
                 windows = 0, drop_windows = 0}, l:stats())
  end)

  it("falls when latency doubles and recovers when it returns", function()
    local l = om.limiter{min_limit = 5, max_limit = 100, initial = 50}
    local clock = {now = 0}
    local base = run(l, clock, 10, 100)
    assert.equal(100, base)
    local slow = run(l, clock, 20, 40)
    assert.is_true(slow <= 60, "limit after latency doubled: " .. slow)
    local back = run(l, clock, 10, 150)
    assert.equal(100, back)
    assert.is_true(math.abs(l:stats().long_rtt_ms - 10) < 2)
  end)

  it("backs off multiplicatively on drops, down to min_limit", function()
    local l = om.limiter{initial = 100, min_limit = 10, window_ms = 0,
                         window_samples = 1}
    assert.equal(90, l:sample(5, 0, true))
    assert.equal(81, l:sample(5, 0, true))
    for _ = 1, 100 do l:sample(5, 0, true) end
    assert.equal(10, l:limit())
    assert.equal(102, l:stats().drop_windows)
  end)

  it("stays within its bounds", function()
    local l = om.limiter{min_limit = 3, max_limit = 8, initial = 5,
                         window_ms = 0, window_samples = 1}
    for i = 1, 500 do
      local lim = l:sample((i * 7919) % 300, i, i % 13 == 0, 8)
      assert.is_true(lim >= 3 and lim <= 8)
    end
  end)

  it("drives an admission through set_limit", function()
    local l = om.limiter{initial = 1, max_limit = 4, window_ms = 0,
                         window_samples = 1}
    local a = om.admission{max_inflight = l:limit(), max_queue = 4}
    a:acquire(0)
    local _, t = a:acquire(0)
    for i = 1, 10 do l:sample(10, i, false, 1) end
    assert.is_true(l:limit() > 1)
    assert.same({t}, (a:set_limit(l:limit(), 10)))
  end)

  it("raises on bad options and samples", function()
    assert.has_error(function() om.limiter{min_limit = 0} end,
      "bad argument #1 to 'limiter' (field 'min_limit': must be in [1, 4294967295], got 0)")
    assert.has_error(function() om.limiter{min_limit = 10, max_limit = 5} end,
      "bad argument #1 to 'limiter' (field 'max_limit': must be >= min_limit)")
    assert.has_error(function() om.limiter{min_limit = 10, initial = 5} end,
      "bad argument #1 to 'limiter' (field 'initial': must be in [10, 1000], got 5)")
    assert.has_error(function() om.limiter{smoothing = 0} end,
      "bad argument #1 to 'limiter' (field 'smoothing': must be > 0)")
    assert.has_error(function() om.limiter{backoff = 1} end,
      "bad argument #1 to 'limiter' (field 'backoff': must be in (0, 1))")
    assert.has_error(function() om.limiter{tolerance = 0.5} end)
    assert.has_error(function() om.limiter{tolerance = 0 / 0} end)
    assert.has_error(function() om.limiter{window_ms = -1} end,
      "bad argument #1 to 'limiter' (field 'window_ms': must be a finite number >= 0)")
    assert.has_error(function() om.limiter{intial = 5} end,
      "bad argument #1 to 'limiter' (unknown field 'intial')")
    -- a default initial limit follows the chosen bounds
    assert.equal(50, om.limiter{min_limit = 50}:limit())
    local l = om.limiter()
    assert.has_error(function() l:sample(-1, 0) end,
      "bad argument #1 to 'sample' (rtt_ms must be a finite number >= 0)")
    assert.has_error(function() l:sample(1, 0, "yes") end)
    assert.has_error(function() l:sample(1, 0, false, -1) end,
      "bad argument #4 to 'sample' (inflight must be >= 0)")
    l:close()
    l:close()
    assert.has_error(function() l:limit() end,
      "calling 'limit' on bad self (limiter is closed)")
  end)
end)
