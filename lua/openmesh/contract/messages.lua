-- openmesh.contract.messages: how values, field paths and lists appear in
-- messages, and the raw-access table helpers the checkers share. One part of
-- openmesh.contract (the facade, lua/openmesh/contract.lua, says what the
-- whole does); like it, it uses only what the sandbox _ENV offers.


local M = {}

---------------------------------------------------------------------------
-- Showing values and paths in messages
---------------------------------------------------------------------------

-- A string in single quotes, control characters escaped, long ones cut.
local function quote(s)
  if #s > 60 then
    s = s:sub(1, 57) .. "..."
  end
  s = s:gsub("[%c'\\]", function(c)
    return ("\\%d"):format(c:byte())
  end)
  return "'" .. s .. "'"
end

-- How a value appears after "got": numbers and strings by value (NaN and
-- the infinities spelled the same on every platform), the rest by type.
local function show(v)
  local t = type(v)
  if t == "string" then
    return quote(v)
  elseif t == "number" then
    if v ~= v then
      return "nan"
    elseif v == math.huge then
      return "inf"
    elseif v == -math.huge then
      return "-inf"
    end
    return tostring(v)
  elseif t == "nil" or t == "boolean" then
    return tostring(v)
  end
  return t
end

-- "{a, b}": a list of names or ids as the messages print them.
local function show_list(names)
  local parts = {}
  for i = 1, #names do
    parts[i] = tostring(names[i])
  end
  return "{" .. table.concat(parts, ", ") .. "}"
end

local function is_identifier(k)
  return type(k) == "string" and k:find("^[%a_][%w_]*$") ~= nil
end

-- The path of field `key` inside `path` ("" is the policy table itself).
local function join(path, key)
  if math.type(key) == "integer" then
    return path .. "[" .. key .. "]"
  elseif is_identifier(key) then
    return path == "" and key or path .. "." .. key
  end
  return path .. "[" .. show(key) .. "]"
end

local function field_error(path, msg)
  return ("field '%s': %s"):format(path, msg)
end

local function expected(path, what, v)
  return field_error(path, ("%s expected, got %s"):format(what, show(v)))
end

---------------------------------------------------------------------------
-- Small table helpers (raw access only: validation never runs policy code
-- hidden behind __index or __pairs)
---------------------------------------------------------------------------

-- The first key of t that cannot be in an array, in a stable order.
local function first_non_array_key(t)
  local bad = {}
  for k in next, t do
    if math.type(k) ~= "integer" or k < 1 then
      bad[#bad + 1] = k
    end
  end
  table.sort(bad, function(a, b)
    return show(a) < show(b)
  end)
  return bad[1]
end

-- The length n of t when its keys are exactly 1..n; else nil and a reason.
local function sequence_length(t)
  local count, max = 0, 0
  for k in next, t do
    if math.type(k) ~= "integer" or k < 1 then
      return nil, "non-array key " .. show(first_non_array_key(t))
    end
    count = count + 1
    if k > max then
      max = k
    end
  end
  if max ~= count then
    for i = 1, max do
      if rawget(t, i) == nil then
        return nil, "a hole at [" .. i .. "]"
      end
    end
  end
  return count
end

local function set_of(list)
  local set = {}
  for i = 1, #list do
    set[list[i]] = true
  end
  return set
end

-- Same members, ignoring order (both lists are free of duplicates).
local function same_set(a, b)
  if #a ~= #b then
    return false
  end
  local in_b = set_of(b)
  for i = 1, #a do
    if not in_b[a[i]] then
      return false
    end
  end
  return true
end

local function same_list(a, b)
  if #a ~= #b then
    return false
  end
  for i = 1, #a do
    if a[i] ~= b[i] then
      return false
    end
  end
  return true
end

local function shallow_copy(t)
  local c = {}
  if t ~= nil then
    for k, v in next, t do
      c[k] = v
    end
  end
  return c
end

-- Levenshtein distance, for "did you mean" on unknown fields.
local function edit_distance(a, b)
  local prev = {}
  for j = 0, #b do
    prev[j] = j
  end
  for i = 1, #a do
    local cur = { [0] = i }
    for j = 1, #b do
      local cost = a:byte(i) == b:byte(j) and 0 or 1
      cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
    end
    prev = cur
  end
  return prev[#b]
end

local function suggestion(key, known_names)
  if type(key) ~= "string" then
    return ""
  end
  local best, best_d = nil, 3 -- at most two edits away
  for i = 1, #known_names do
    local d = edit_distance(key, known_names[i])
    if d < best_d then
      best, best_d = known_names[i], d
    end
  end
  return best and (" (did you mean '%s'?)"):format(best) or ""
end

-- What the other parts use.
M.quote = quote
M.show = show
M.show_list = show_list
M.join = join
M.field_error = field_error
M.expected = expected
M.sequence_length = sequence_length
M.set_of = set_of
M.same_set = same_set
M.same_list = same_list
M.shallow_copy = shallow_copy
M.suggestion = suggestion

return M
