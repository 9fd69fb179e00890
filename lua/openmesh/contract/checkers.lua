-- openmesh.contract.checkers: the field checkers: function(value, path) -> nil
-- when fine, else a message. One part of openmesh.contract (the facade,
-- lua/openmesh/contract.lua, says what the whole does); like it, it uses only
-- what the sandbox _ENV offers.

local checks = require("openmesh").checks -- bindings/l_checks.c
local messages = require "openmesh.contract.messages"

local quote = messages.quote
local show = messages.show
local join = messages.join
local field_error = messages.field_error
local expected = messages.expected
local sequence_length = messages.sequence_length
local set_of = messages.set_of
local suggestion = messages.suggestion

local M = {}

---------------------------------------------------------------------------
-- Checkers: function(value, path) -> nil when fine, else a message
---------------------------------------------------------------------------

local function expect(what, ok)
  return function(v, path)
    if not ok(v) then
      return expected(path, what, v)
    end
  end
end

local function is_finite(v)
  return type(v) == "number" and v == v and v > -math.huge and v < math.huge
end

-- 3 and 3.0 are integers; "3", 3.5, NaN and 2^70 are not.
local function as_integer(v)
  return type(v) == "number" and math.tointeger(v) or nil
end

local function integer_at_least(min)
  return expect(("integer >= %d"):format(min), function(v)
    local i = as_integer(v)
    return i ~= nil and i >= min
  end)
end

local function number_above(min)
  return expect(("number > %s"):format(show(min)), function(v)
    return is_finite(v) and v > min
  end)
end

-- A bounded number: min < v <= max (a budget that must be positive and
-- has a ceiling).
local function number_within(min, max)
  return expect(("number > %s and <= %s"):format(show(min), show(max)), function(v)
    return is_finite(v) and v > min and v <= max
  end)
end

-- A closed range: min <= v <= max (a share or a price that may be 0).
local function number_from(min, max)
  return expect(("number >= %s and <= %s"):format(show(min), show(max)), function(v)
    return is_finite(v) and v >= min and v <= max
  end)
end

local boolean = expect("boolean", function(v)
  return type(v) == "boolean"
end)

local func = expect("function", function(v)
  return type(v) == "function"
end)

local text = expect("string", function(v)
  return type(v) == "string"
end)

local nonempty = expect("non-empty string", function(v)
  return type(v) == "string" and v ~= ""
end)

local string_or_false = expect("string or false", function(v)
  return type(v) == "string" or v == false
end)

local function one_of(names)
  local quoted = {}
  for i, name in ipairs(names) do
    quoted[i] = quote(name)
  end
  local what = #quoted == 2 and quoted[1] .. " or " .. quoted[2]
    or "one of " .. table.concat(quoted, ", ")
  local allowed = set_of(names)
  return expect(what, function(v)
    return allowed[v] == true
  end)
end

local http_url = expect("http:// or https:// URL", function(v)
  return type(v) == "string" and v:find("^https?://[^%s/]") ~= nil
    and not v:find("%s")
end)

local env_name = expect("environment variable name", function(v)
  return type(v) == "string" and v:find("^[%a_][%w_]*$") ~= nil
end)

local function lua_pattern(v, path)
  if type(v) ~= "string" then
    return expected(path, "Lua pattern (string)", v)
  end
  -- the budgeted matcher's own grammar (bindings/om_lpattern.c): Lua
  -- compiles a pattern while it matches, so a bad one could pass a test
  -- on some text and raise later on other text
  local err = checks.pattern(v)
  if err then
    return field_error(path, "invalid Lua pattern: " .. err)
  end
end

-- An array (keys exactly 1..n) of values accepted by `elem`.
-- opts.min: the least length; opts.unique: a field of the elements whose
-- values must be unique, opts.what naming them in the message.
local function array_of(elem, opts)
  opts = opts or {}
  return function(v, path)
    if type(v) ~= "table" then
      return expected(path, "array", v)
    end
    local n, why = sequence_length(v)
    if not n then
      return field_error(path, "array expected, got a table with " .. why)
    end
    if n < (opts.min or 0) then
      return field_error(path, "non-empty array expected, got an empty one")
    end
    local seen = {}
    for i = 1, n do
      local item = rawget(v, i)
      local err = elem(item, join(path, i))
      if err then
        return err
      end
      if opts.unique then
        local name = rawget(item, opts.unique)
        if seen[name] then
          return field_error(join(join(path, i), opts.unique),
            ("duplicate %s %s"):format(opts.what, quote(name)))
        end
        seen[name] = true
      end
    end
  end
end

-- `vary`: the request fields a traffic policy's decision depends on, as
-- HTTP's Vary names them: lower-case header names (RFC 9110 5.1: field
-- names are tokens; the proxy gives them lower-case), ":method" and
-- ":path" (HTTP/2's pseudo-header spelling), and ":identity" (the
-- caller's verified client certificate, req.identity). Each at most once.
local function vary_list(v, path)
  if type(v) ~= "table" then
    return expected(path, "array of header names", v)
  end
  local n, why = sequence_length(v)
  if not n then
    return field_error(path, "array expected, got a table with " .. why)
  end
  local seen = {}
  for i = 1, n do
    local name = rawget(v, i)
    local at = join(path, i)
    if type(name) ~= "string" then
      return expected(at, "header name", name)
    end
    if name ~= ":method" and name ~= ":path" and name ~= ":identity" and
      (name == "" or name:find("[^%l%d!#$%%&'*+%-.^_`|~]")) then
      return field_error(at, ("%s is not a lower-case header name, \":method\", \":path\" or \":identity\"")
        :format(quote(name)))
    end
    if seen[name] then
      return field_error(at, ("duplicate name %s"):format(quote(name)))
    end
    seen[name] = true
  end
end

-- A table with non-empty string keys (each also passing `key_rule`, which
-- returns nil or a message) and values accepted by `value`.
local function map_of(value, key_rule)
  return function(v, path)
    if type(v) ~= "table" then
      return expected(path, "table", v)
    end
    for k, item in next, v do
      if type(k) ~= "string" or k == "" then
        return field_error(join(path, k), "keys must be non-empty strings")
      end
      local err = key_rule and key_rule(k)
      if err then
        return field_error(join(path, k), err)
      end
      err = value(item, join(path, k))
      if err then
        return err
      end
    end
  end
end

-- A table with the given fields and no others. fields: an array of
-- { name, checker, required = bool }; `rule(v, path)`, when given, runs
-- after every field passed (for constraints across fields).
local function record(fields, rule)
  local known, names = {}, {}
  for i, f in ipairs(fields) do
    known[f[1]] = true
    names[i] = f[1]
  end
  return function(v, path)
    if type(v) ~= "table" then
      return expected(path, "table", v)
    end
    local unknown = {}
    for k in next, v do
      if not known[k] then
        unknown[#unknown + 1] = k
      end
    end
    if #unknown > 0 then
      table.sort(unknown, function(a, b)
        return tostring(a) < tostring(b)
      end)
      return ("unknown field '%s'%s"):format(join(path, unknown[1]),
        suggestion(unknown[1], names))
    end
    for _, f in ipairs(fields) do
      local value = rawget(v, f[1])
      if value ~= nil or f.required then
        local err = f[2](value, join(path, f[1]))
        if err then
          return err
        end
      end
    end
    return rule and rule(v, path)
  end
end

-- What the other parts use.
M.integer_at_least = integer_at_least
M.number_above = number_above
M.number_within = number_within
M.number_from = number_from
M.boolean = boolean
M.func = func
M.text = text
M.nonempty = nonempty
M.string_or_false = string_or_false
M.one_of = one_of
M.http_url = http_url
M.env_name = env_name
M.lua_pattern = lua_pattern
M.array_of = array_of
M.vary_list = vary_list
M.map_of = map_of
M.record = record

return M
