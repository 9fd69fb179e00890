-- The sandbox escape suite, as a policy author (or attacker) would write
-- it: every attempt ends in a clear error within its budget, whether it
-- runs at load time or inside a call, and the loaded policy keeps serving.
local om = require "openmesh"

local PEERS = { { id = "a" }, { id = "b" } }

local function load(src, opts)
  local args = { source = src, name = "escape.lua", instr_limit = 2000000,
    mem_limit = 16 * 1024 * 1024, wall_limit_ms = 20000 }
  for k, v in pairs(opts or {}) do args[k] = v end
  return om.policy.load(args)
end

-- A traffic policy whose subset() runs `body` when the path is /attack.
local function policy_with(body)
  return ([[
return { kind = "traffic",
  subset = function(req, peers)
    if req.path == "/attack" then %s end
    return peers
  end }]]):format(body)
end

local attacks = {
  { "infinite loop", "while true do end", "budget: instruction limit" },
  { "loop inside pcall", "while true do pcall(function() while true do end end) end",
    "budget: instruction limit" },
  { "pcall swallowing the budget error", "for i = 1, 1e9 do pcall(error, 'x') end",
    "budget: instruction limit" },
  { "coroutine loop", "local co = coroutine.wrap(function() while true do end end) co()",
    "budget: instruction limit" },
  { "xpcall handler loop", "xpcall(error, function() while true do end end)",
    "budget: instruction limit" },
  { "string.rep bomb", "local s = ('x'):rep(2^40)", "memory" },
  { "concatenation bomb", "local s = 'x' while true do s = s .. s end", "budget" },
  { "huge table", "local t = {} for i = 1, 1e9 do t[i] = i end", "budget" },
  { "pattern blow-up", "string.find(('a'):rep(40), ('a*'):rep(30) .. 'b')",
    "pattern too complex" },
  { "gsub blow-up", "(('a'):rep(40)):gsub(('a-'):rep(30) .. 'b', '')",
    "pattern too complex" },
  { "string.dump", "local d = string.dump(function() end)", "attempt to call a nil value" },
  { "bytecode load", "local f, e = load('\\27Lua') error(e)", "binary chunk" },
  { "binary mode", "load('return 1', 'x', 'b')", "only text chunks" },
  { "io", "io.open('/etc/passwd')", "attempt to index a nil value" },
  { "os.execute", "os.execute('true')", "attempt to call a nil value" },
  { "debug", "debug.sethook()", "attempt to index a nil value" },
  { "package", "package.loadlib('x', 'y')", "attempt to index a nil value" },
  { "require outside openmesh", "require('io')", "may only require" },
  { "__gc finalizer", "setmetatable({}, {__gc = function() while true do end end})",
    "__gc metamethods are not allowed" },
  { "table.move spin", "table.move({}, 1, 2^50, 2)", "range longer" },
}

describe("sandbox escapes inside a call", function()
  for _, case in ipairs(attacks) do
    local name, body, want = case[1], case[2], case[3]
    it(name .. " ends in a clear error, and the policy keeps serving", function()
      local p = assert(load(policy_with(body)))
      local got, err = p:subset({ path = "/attack" }, PEERS)
      assert.is_nil(got)
      assert.truthy(err:find(want, 1, true), err)
      assert.same({ "a", "b" }, p:subset({ path = "/" }, PEERS))
    end)
  end
end)

describe("sandbox escapes at load time", function()
  for _, case in ipairs(attacks) do
    local name, body, want = case[1], case[2], case[3]
    it(name .. " is rejected with a clear error", function()
      local p, err, code = load(body .. "\nreturn {kind = 'traffic', subset = function(r, p) return p end}")
      assert.is_nil(p)
      assert.equal("EPOLICY", code)
      assert.truthy(err:find(want, 1, true), err)
    end)
  end
end)

describe("the string metatable", function()
  it("cannot be reached or poisoned", function()
    local p = assert(load(policy_with([[
      assert(getmetatable('') == false, 'metatable reachable')
      string.upper = function() return 'pwned' end
      if ('a'):upper() ~= 'A' then error('poisoned') end
      error('ok')]])))
    local _, err = p:subset({ path = "/attack" }, PEERS)
    assert.truthy(err:find("ok", 1, true), err)
  end)

  it("poisoning in one policy does not reach another", function()
    local a = assert(load("string.rep = nil\nreturn {kind = 'traffic', subset = function(r, p) return p end}"))
    local b = assert(load(policy_with("error(('x'):rep(3))")))
    local _, err = b:subset({ path = "/attack" }, PEERS)
    assert.truthy(err:find("xxx", 1, true), err)
    assert.is_not_nil(a)
  end)
end)

describe("the openmesh module inside a policy", function()
  it("offers only functions without lasting C memory", function()
    local p = assert(load(policy_with([[
      local om = require 'openmesh'
      assert(om.hash and om.select_metadata and om.retry_after)
      assert(om.policy == nil and om.sse == nil and om.admission == nil and om.p2c == nil)
      error('ok')]])))
    local _, err = p:subset({ path = "/attack" }, PEERS)
    assert.truthy(err:find("ok", 1, true), err)
  end)
end)

describe("the request a policy receives", function()
  it("carries the caller's metadata, and an empty one cannot be written to", function()
    local p = assert(load([[
      return { kind = "traffic", subset = function(req, peers)
        if req.path == "/read" then
          return req.metadata.zone == "eu" and peers or {}
        end
        req.metadata.sneaky = "x" -- shared between requests: refused
        return peers
      end }]]))
    assert.same({ "a", "b" }, p:subset({ path = "/read", metadata = { zone = "eu" } }, PEERS))
    local ids, err = p:subset({ path = "/write" }, PEERS)
    assert.is_nil(ids)
    assert.truthy(err:find("req.metadata is read-only", 1, true), err)
  end)
end)
