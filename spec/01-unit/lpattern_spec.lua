-- Patterns inside policies: the sandbox's string.find / match / gmatch /
-- gsub answer like stock Lua 5.4, and a pattern that would backtrack forever
-- ends in a clear error within the policy's budget instead of hanging the
-- host. (The exhaustive stock-vs-ours comparison is tests/test_lpattern.c.)
local om = require "openmesh"
local testing = require "openmesh.testing"

local BOMB_PATH = ("a"):rep(40)
local BOMB = ("a*"):rep(30) .. "b"

local function traffic(body)
  return "return { kind = 'traffic', subset = function(req, peers) " .. body .. " end }"
end

local function load(src, opts)
  -- A generous wall clock: the budgets under test are the pattern steps and
  -- the instruction count, which must trip first even on a loaded machine.
  local args = { source = src, name = "pattern_policy.lua", wall_limit_ms = 20000 }
  for k, v in pairs(opts or {}) do
    args[k] = v
  end
  return om.policy.load(args)
end

describe("patterns in policies", function()
  it("answer like the stock string library", function()
    local p = assert(load(traffic [[
      local out = {}
      for _, peer in ipairs(peers) do
        local n = peer.id:match("^web%-(%d+)$")
        if n and tonumber(n) % 2 == 0 and not peer.id:find(".", 1, true) then
          out[#out + 1] = peer
        end
      end
      local k, v = req.path:match("^/(%w+)=(%w+)$")
      local n = select(2, ("a,b,,c"):gsub(",", ";"))
      local words = 0
      for _ in ("the quick  brown fox"):gmatch("%a+") do words = words + 1 end
      if k ~= "key" or v ~= "value" or n ~= 3 or words ~= 4 then return {} end
      return out
    ]]))
    local ids = assert(p:subset(testing.req { path = "/key=value" },
      testing.peers { "web-1", "web-2", "web-10", "db-2", "web-x" }))
    assert.same({ "web-2", "web-10" }, ids)
  end)

  it("end a blow-up in 'pattern too complex' quickly, and keep working", function()
    local p = assert(load(traffic [[
      if req.path:find(("a*"):rep(30) .. "b") then return {} end
      return peers
    ]]))
    local ids, err, code = p:subset(testing.req { path = BOMB_PATH }, testing.peers { "a" })
    assert.is_nil(ids)
    assert.equal("EPOLICY", code)
    assert.matches("pattern too complex: step budget exceeded", err, 1, true)
    assert.same({ "a" }, p:subset(testing.req { path = "/ok" }, testing.peers { "a" }))
  end)

  it("bound gmatch and gsub as well as find and match", function()
    for _, body in ipairs {
      "for w in req.path:gmatch(" .. ("%q"):format(BOMB) .. ") do end return peers",
      "req.path:gsub(" .. ("%q"):format(BOMB) .. ", '') return peers",
      "string.match(req.path, " .. ("%q"):format(BOMB) .. ") return peers",
      "('xy'):gsub('.', function() req.path:find(" .. ("%q"):format(BOMB) .. ") end) return peers",
    } do
      local p = assert(load(traffic(body)))
      local ids, err = p:subset(testing.req { path = BOMB_PATH }, testing.peers { "a" })
      assert.is_nil(ids)
      assert.matches("pattern too complex", err, 1, true)
    end
  end)

  it("count matching toward the instruction budget when errors are caught", function()
    local p = assert(load(traffic([[
      while true do pcall(string.find, req.path, ]] .. ("%q"):format(BOMB) .. [[) end
    ]])))
    local ids, err = p:subset(testing.req { path = BOMB_PATH }, testing.peers { "a" })
    assert.is_nil(ids)
    assert.matches("budget: ", err, 1, true)
  end)

  it("refuse a policy whose top level blows up", function()
    local p, err = load("local _ = (" .. ("%q"):format(BOMB_PATH) .. "):match(" .. ("%q"):format(BOMB) ..
      ") return { kind = 'traffic', subset = function(_, peers) return peers end }")
    assert.is_nil(p)
    assert.matches("pattern too complex", err, 1, true)
  end)
end)
