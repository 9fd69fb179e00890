-- Server-sent events, as a policy author or a watch client uses them:
-- om.sse.parser follows WHATWG HTML 9.2.5 "Parsing an event stream" and
-- 9.2.6 "Interpreting an event stream"; every rule below is checked with the
-- stream fed whole, byte by byte and at random split points, which must all
-- give the same events and the same final state.
local om = require "openmesh"

local FFFD = "\xEF\xBF\xBD" -- U+FFFD REPLACEMENT CHARACTER in UTF-8

-- The call fails and its message contains `needle` (plain text).
local function raises(needle, fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "expected an error containing: " .. needle)
  err = tostring(err)
  assert(err:find(needle, 1, true),
         ("error %q does not contain %q"):format(err, needle))
end

-- Three ways to cut a stream into chunks.
local function whole(s)
  return {s}
end

local function byte_by_byte(s)
  local t = {}
  for i = 1, #s do
    t[i] = s:sub(i, i)
  end
  return t
end

local function random_splits(seed)
  return function(s)
    math.randomseed(seed)
    local t, i = {}, 1
    while i <= #s do
      local n = math.random(1, 17)
      t[#t + 1] = s:sub(i, i + n - 1)
      i = i + n
    end
    return t
  end
end

-- Feed the chunks; collect events, the final state and a failure. A
-- failure that follows events in the same chunk is reported by the next
-- feed, so a last feed("") surfaces it.
local function run(cut, stream, opts)
  local sp = om.sse.parser(opts)
  local events, err = {}, nil
  local chunks = cut(stream)
  chunks[#chunks + 1] = ""
  for _, chunk in ipairs(chunks) do
    local evs, msg, code = sp:feed(chunk)
    if not evs then
      assert.is_string(msg)
      assert.equal(code, msg:match("^(%u+):"))
      err = code
      break
    end
    for _, ev in ipairs(evs) do
      events[#events + 1] = ev
    end
  end
  local r = {events = events, last_event_id = sp:last_event_id(),
             retry = sp:retry(), err = err}
  sp:close()
  return r
end

-- The helper every rule goes through: whole, byte by byte and 6 random
-- chunkings must agree; returns that one result.
local function parse(stream, opts)
  local ref = run(whole, stream, opts)
  assert.same(ref, run(byte_by_byte, stream, opts))
  for seed = 1, 6 do
    assert.same(ref, run(random_splits(seed), stream, opts))
  end
  return ref
end

-- Shorthand for the expected events.
local function ev(data, type_, id)
  return {type = type_ or "message", data = data, id = id or ""}
end

describe("om.sse.parser: the WHATWG 9.2.6 examples", function()
  it("joins data lines with LF: YHOO +2 10", function()
    local r = parse("data: YHOO\ndata: +2\ndata: 10\n\n")
    assert.same({ev("YHOO\n+2\n10")}, r.events)
  end)

  it("first event / second event / third event, with ids", function()
    local r = parse(": test stream\n\ndata: first event\nid: 1\n\n" ..
                    "data:second event\nid\n\ndata:  third event\n\n")
    assert.same({ev("first event", nil, "1"), ev("second event", nil, ""),
                 ev(" third event", nil, "")}, r.events)
    assert.equal("", r.last_event_id)
  end)

  it("data / data data / data: gives \"\" and \"\\n\", the last block discarded", function()
    local r = parse("data\n\ndata\ndata\n\ndata:")
    assert.same({ev(""), ev("\n")}, r.events)
  end)

  it("data:test and data: test are two identical events", function()
    local r = parse("data:test\n\ndata: test\n\n")
    assert.same({ev("test"), ev("test")}, r.events)
  end)

  it("event types from the event field (9.2.5's add/remove example)", function()
    local r = parse("event: add\ndata: 73857293\n\nevent: remove\ndata: 2153\n\n" ..
                    "event: add\ndata: 113411\n\n")
    assert.same({ev("73857293", "add"), ev("2153", "remove"),
                 ev("113411", "add")}, r.events)
  end)
end)

describe("om.sse.parser: each rule", function()
  it("strips one leading BOM, only at the start of the stream", function()
    assert.same({ev("a")}, parse("\xEF\xBB\xBFdata: a\n\n").events)
    -- a second BOM belongs to the field name "\u{FEFF}data": ignored
    assert.same({ev("b")},
                parse("\xEF\xBB\xBF\xEF\xBB\xBFdata: a\n\ndata: b\n\n").events)
    -- inside a value it is data
    assert.same({ev("\xEF\xBB\xBFa")}, parse("data: \xEF\xBB\xBFa\n\n").events)
    -- half a BOM is ordinary (invalid) input
    assert.same({ev("b")}, parse("\xEF\xBBdata: a\n\ndata: b\n\n").events)
  end)

  it("ends lines at CR, LF and CRLF; CRLF split across chunks is one line end", function()
    assert.same({ev("a\nb\nc\nd")},
                parse("data: a\rdata: b\r\ndata: c\ndata: d\r\r").events)
    assert.same({ev("a\nb")}, parse("data: a\r\ndata: b\r\n\r\n").events)
    assert.same({ev("a"), ev("b")}, parse("data: a\n\rdata: b\n\n").events)
    -- explicitly: CR ends one chunk, LF starts the next
    local sp = om.sse.parser()
    assert.same({}, sp:feed("data: a\r"))
    assert.same({}, sp:feed("\ndata: b\r"))
    assert.same({}, sp:feed("\n"))
    assert.same({ev("a\nb")}, sp:feed("\r\n"))
  end)

  it("ignores comment lines (starting with a colon)", function()
    assert.same({ev("a")}, parse(":x\n: y\ndata: a\n:c: d\n\n").events)
    assert.same({}, parse(": ping\n\n:\n\n").events)
    assert.same({ev(":a")}, parse("data: :a\n\n").events)
  end)

  it("takes a line without a colon as a field name with an empty value", function()
    assert.same({ev("")}, parse("data\n\n").events)
    assert.same({ev("y")}, parse("event: x\nevent\ndata: y\n\n").events)
    assert.same({ev("y", nil, "")}, parse("id: 1\nid\ndata: y\n\n").events)
    assert.equal(5, parse("retry: 5\nretry\n").retry)
  end)

  it("removes exactly one leading space after the colon", function()
    assert.same({ev("a")}, parse("data:a\n\n").events)
    assert.same({ev("a")}, parse("data: a\n\n").events)
    assert.same({ev(" a")}, parse("data:  a\n\n").events)
    assert.same({ev("\ta")}, parse("data:\ta\n\n").events)
    assert.same({ev("a", " t", " 7")}, parse("event:  t\nid:  7\ndata: a\n\n").events)
    -- the field name runs to the first colon: "data " is not "data"
    assert.same({ev("a:b")}, parse("data : a\n\ndata:a:b\n\n").events)
  end)

  it("appends value + LF per data line and removes only the final LF", function()
    assert.same({ev("a\n\nb")}, parse("data: a\ndata:\ndata: b\n\n").events)
    assert.same({ev("a\n")}, parse("data: a\ndata:\n\n").events)
    assert.same({ev("a\0b")}, parse("data: a\0b\n\n").events)
  end)

  it("uses type \"message\" by default and resets the event type at every blank line", function()
    assert.same({ev("1", "add"), ev("2")}, parse("event: add\ndata: 1\n\ndata: 2\n\n").events)
    assert.same({ev("1")}, parse("event:\ndata: 1\n\n").events)
    -- reset even when the block dispatched nothing
    assert.same({ev("y")}, parse("event: x\n\ndata: y\n\n").events)
  end)

  it("dispatches nothing when the data buffer is empty", function()
    local r = parse("\n\n\nevent: e\n\nfoo: bar\n\n")
    assert.same({}, r.events)
  end)

  it("keeps the last event ID across events; empty resets; NUL voids the field", function()
    local r = parse("id: 1\ndata: a\n\ndata: b\n\nid: 2\0x\ndata: c\n\nid:\ndata: d\n\n")
    assert.same({ev("a", nil, "1"), ev("b", nil, "1"), ev("c", nil, "1"),
                 ev("d", nil, "")}, r.events)
    assert.equal("", r.last_event_id)
  end)

  it("sets the last event ID string at a blank line even without data (step 1 before step 2)", function()
    assert.equal("5", parse("id: 5\n\n").last_event_id)
    -- and only at a blank line
    assert.equal("1", parse("id: 1\ndata: a\n\nid: 2\ndata: b\n").last_event_id)
    local sp = om.sse.parser()
    sp:feed("id: 9\n")
    assert.equal("", sp:last_event_id())
    sp:feed("\n")
    assert.equal("9", sp:last_event_id())
  end)

  it("sets the reconnection time from retry only when the value is all ASCII digits", function()
    assert.is_nil(parse("data: a\n\n").retry)
    assert.equal(1000, parse("retry: 1000\n").retry)
    assert.equal(7, parse("retry: 007\n").retry)
    assert.equal(10, parse("retry: 10\nretry: 10a\nretry: -1\nretry: 1.5\n" ..
                           "retry:  5\nretry:\nretry: \xD9\xA3\n").retry)
    -- too large for an integer: saturates instead of wrapping
    assert.equal(math.maxinteger, parse("retry: 99999999999999999999999\n").retry)
  end)

  it("ignores unknown fields and compares names case-sensitively", function()
    local r = parse("Data: a\nDATA: b\nEvent: e\nID: 1\nRetry: 5\nfoo: x\n" ..
                    "dataa: y\ndata: ok\n\n")
    assert.same({ev("ok")}, r.events)
    assert.is_nil(r.retry)
    assert.equal("", r.last_event_id)
  end)

  it("does not dispatch data at the end of the stream without a blank line", function()
    assert.same({}, parse("data: x\n").events)
    assert.same({}, parse("data: x").events)
    assert.same({ev("a")}, parse("data: a\n\ndata: x\n").events)
  end)

  it("replaces invalid UTF-8 with U+FFFD per maximal subpart (WHATWG Encoding)", function()
    assert.same({ev("é€𝄞")}, parse("data: é€𝄞\n\n").events)
    assert.same({ev(FFFD)}, parse("data: \x80\n\n").events)
    assert.same({ev(FFFD:rep(2))}, parse("data: \xC0\xAF\n\n").events)
    assert.same({ev(FFFD:rep(3))}, parse("data: \xED\xA0\x80\n\n").events)
    assert.same({ev(FFFD .. "A")}, parse("data: \xE2\x82A\n\n").events)
    assert.same({ev(FFFD)}, parse("data: \xF0\x9F\x98\n\n").events)
    -- Unicode table 3-8: 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64
    assert.same({ev("a" .. FFFD:rep(3) .. "b" .. FFFD .. "c" .. FFFD:rep(2) .. "d")},
                parse("data: a\xF1\x80\x80\xE1\x80\xC2b\x80c\x80\xBFd\n\n").events)
    assert.same({ev("x", FFFD, FFFD)}, parse("event: \xFF\nid: \xC3\ndata: x\n\n").events)
  end)
end)

describe("om.sse.parser: bounds and failures", function()
  it("fails with ETOOBIG when an event needs more than max_event_bytes", function()
    local sp = om.sse.parser{max_event_bytes = 16}
    assert.same({ev("0123456789abcde")}, sp:feed("data: 0123456789abcde\n\n"))
    local evs, msg, code = sp:feed("data: 0123456789abcdef\n\n")
    assert.is_nil(evs)
    assert.equal("ETOOBIG", code)
    assert.matches("^ETOOBIG: ", msg)
    -- the failure sticks until reset
    assert.same({nil, msg, code}, {sp:feed("data: x\n\n")})
    sp:reset()
    assert.same({ev("x")}, sp:feed("data: x\n\n"))
  end)

  it("reports the failure the same way whatever the chunking", function()
    local r = parse("id: 1\ndata: a\n\ndata: 0123456789abcdef\n\n", {max_event_bytes = 16})
    assert.same({ev("a", nil, "1")}, r.events)
    assert.equal("ETOOBIG", r.err)
    assert.equal("1", r.last_event_id)
  end)

  it("returns events completed before a failure, and the failure on the next feed", function()
    local sp = om.sse.parser{max_event_bytes = 8}
    local evs = sp:feed("id: 7\ndata: ok\n\ndata: far too long\n\n")
    assert.same({ev("ok", nil, "7")}, evs)
    assert.equal("7", sp:last_event_id())
    local none, _, code = sp:feed("")
    assert.is_nil(none)
    assert.equal("ETOOBIG", code)
  end)

  it("does not cap lines it does not buffer (comments, unknown fields, retry)", function()
    local big = ("x"):rep(100000)
    local r = parse(":" .. big .. "\nfoo: " .. big .. "\nretry: 000" .. "42\ndata: ok\n\n",
                    {max_event_bytes = 8})
    assert.same({ev("ok")}, r.events)
    assert.equal(42, r.retry)
    assert.is_nil(r.err)
  end)

  it("reset starts a new stream: BOM stripped again, partial event dropped, state kept", function()
    local sp = om.sse.parser()
    sp:feed("retry: 300\nid: 4\ndata: a\n\ndata: partial\n")
    sp:reset()
    assert.equal("4", sp:last_event_id())
    assert.equal(300, sp:retry())
    assert.same({ev("b", nil, "")}, sp:feed("\xEF\xBB\xBFdata: b\n\n"))
  end)

  it("parses a large event fed in small chunks", function()
    local n = 4 * 1024 * 1024
    local sp = om.sse.parser{max_event_bytes = n + 16}
    local payload = ("0123456789abcdef"):rep(n // 16)
    local stream = "data: " .. payload .. "\n\n"
    local got = {}
    for i = 1, #stream, 4096 do
      for _, e in ipairs(assert(sp:feed(stream:sub(i, i + 4095)))) do
        got[#got + 1] = e
      end
    end
    assert.equal(1, #got)
    assert.equal(n, #got[1].data)
    assert.is_true(got[1].data == payload)
  end)
end)

describe("om.sse.parser: the object", function()
  it("rejects bad options and arguments, naming them", function()
    raises("field 'max_event_bytes'", om.sse.parser, {max_event_bytes = 0})
    raises("field 'max_event_bytes'", om.sse.parser, {max_event_bytes = -5})
    raises("field 'max_event_bytes': integer expected", om.sse.parser,
           {max_event_bytes = 1.5})
    raises("unknown field 'max_bytes'", om.sse.parser, {max_bytes = 10})
    raises("table expected", om.sse.parser, 42)
    local sp = om.sse.parser()
    raises("string expected", sp.feed, sp, {})
    raises("openmesh.SseParser expected", sp.feed, {}, "data: x\n\n")
  end)

  it("close, __close and __gc are one idempotent function", function()
    local sp = om.sse.parser()
    assert.matches("%(open%)", tostring(sp))
    sp:close()
    sp:close()
    assert.matches("%(closed%)", tostring(sp))
    raises("closed SSE parser", sp.feed, sp, "data: x\n\n")
    raises("closed SSE parser", sp.last_event_id, sp)
    do
      local scoped <close> = om.sse.parser()
      scoped:feed("data: x\n")
    end
    collectgarbage()
    collectgarbage()
  end)
end)

describe("om.sse.encode", function()
  it("writes event, id, retry and one data line per line", function()
    assert.equal("event: update\nid: 42\nretry: 1500\ndata: a\ndata: b\n\n",
                 om.sse.encode{type = "update", id = "42", retry = 1500, data = "a\nb"})
    assert.equal("data: x\n\n", om.sse.encode{data = "x"})
    assert.equal("data:\n\n", om.sse.encode{data = ""})
    assert.equal("id:\n\n", om.sse.encode{id = ""})
    assert.equal("retry: 0\n\n", om.sse.encode{retry = 0})
    -- a leading space survives the receiver removing one
    assert.equal("data:  x\n\n", om.sse.encode{data = " x"})
    -- CR and CRLF become line breaks: the receiver reads LF
    assert.equal("data: a\ndata: b\ndata: c\ndata:\n\n",
                 om.sse.encode{data = "a\rb\r\nc\n"})
  end)

  it("refuses what would break the stream, naming the field", function()
    raises("field 'type': must not contain CR or LF", om.sse.encode, {type = "a\nb", data = "x"})
    raises("field 'type': must not contain CR or LF", om.sse.encode, {type = "a\rb", data = "x"})
    raises("field 'id': must not contain CR, LF or NUL", om.sse.encode, {id = "1\n", data = "x"})
    raises("field 'id': must not contain CR, LF or NUL", om.sse.encode, {id = "1\0", data = "x"})
    raises("field 'data': invalid UTF-8", om.sse.encode, {data = "\xFF"})
    raises("field 'type': invalid UTF-8", om.sse.encode, {type = "\xC3", data = "x"})
    raises("field 'id': invalid UTF-8", om.sse.encode, {id = "\xED\xA0\x80"})
    raises("field 'type': an event without data is never dispatched", om.sse.encode,
           {type = "t"})
    raises("field 'data': string expected, got table", om.sse.encode, {data = {}})
    raises("field 'retry': integer expected", om.sse.encode, {data = "x", retry = 1.5})
    raises("field 'retry'", om.sse.encode, {data = "x", retry = -1})
    raises("unknown field 'event'", om.sse.encode, {event = "x", data = "y"})
    raises("table expected", om.sse.encode, "data")
  end)

  it("round-trips random events through the parser, fed every way", function()
    local pieces = {"a", "Z", " ", ":", "data: ", "id", "é", "€", "😀",
                    "\xEF\xBB\xBF", "\t", "\0", "\n", "\r", "\r\n"}
    math.randomseed(1234)
    local function text(allow_breaks, allow_nul)
      local t = {}
      for _ = 1, math.random(0, 10) do
        local p = pieces[math.random(#pieces)]
        local is_break = p:find("[\r\n]") ~= nil
        if (allow_breaks or not is_break) and (allow_nul or p ~= "\0") then
          t[#t + 1] = p
        end
      end
      return table.concat(t)
    end
    for _ = 1, 60 do
      local stream, want, last = {}, {}, ""
      for _ = 1, 4 do
        local e = {type = text(false, true), data = text(true, true)}
        if math.random() < 0.5 then
          e.id = text(false, false)
          last = e.id
        end
        stream[#stream + 1] = om.sse.encode(e)
        local data = e.data:gsub("\r\n", "\n"):gsub("\r", "\n")
        want[#want + 1] = ev(data, e.type ~= "" and e.type or nil, last)
      end
      local r = parse(table.concat(stream))
      assert.same(want, r.events)
    end
  end)
end)
