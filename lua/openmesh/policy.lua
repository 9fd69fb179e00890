-- openmesh.policy: small helpers a traffic policy composes, so a typical
-- subset() is a few lines.
--
-- Every helper that takes peers returns a NEW array holding some of those
-- same peer tables, in their original order: never a copy of a peer, never
-- a peer that was not given. So whatever a policy builds from them passes
-- the contract's identity check (openmesh.contract.subset). None of them
-- widens: when the peers a helper looks for are absent, the answer is the
-- empty array (the request then fails with `no_peers`), except where a
-- helper's documentation says it spills over.
--
-- Runs inside the policy sandbox: only base functions, string, table, math
-- and the `openmesh` C module.
local om = require "openmesh"
local select_metadata = om.select_metadata

local policy = {}

-- Raise at the policy's call site, not here.
local function misuse(fmt, ...)
  error(fmt:format(...), 3)
end

-- A predicate from a function, or from a table of metadata that must all
-- match ({version = "v2"} means peer.metadata.version == "v2"). The table
-- is read once per call, into arrays: this runs on every request, and a
-- pairs() per peer would dominate the cost of a typical policy.
local function predicate(p)
  if type(p) == "function" then
    return p
  elseif type(p) == "table" then
    local keys, values, n = {}, {}, 0
    for k, v in pairs(p) do
      n = n + 1
      keys[n], values[n] = k, v
    end
    if n == 1 then
      local k1, v1 = keys[1], values[1]
      return function(peer)
        local md = peer.metadata
        return md ~= nil and md[k1] == v1
      end
    end
    return function(peer)
      local md = peer.metadata
      if md == nil then
        return n == 0
      end
      for i = 1, n do
        if md[keys[i]] ~= values[i] then
          return false
        end
      end
      return true
    end
  end
  misuse("predicate expected (a function or a metadata table), got %s", type(p))
end

-- The peers for which pred(peer) is truthy (want = true) or falsy (false),
-- in order. A counter, not #out, per append: this is the hot loop.
local function select_peers(peers, pred, want)
  local out, n = {}, 0
  for i = 1, #peers do
    local peer = peers[i]
    if not pred(peer) ~= want then
      n = n + 1
      out[n] = peer
    end
  end
  return out
end

-- policy.filter(peers, pred) -> the peers for which pred(peer) is truthy.
-- pred may also be a metadata table (see match_metadata).
function policy.filter(peers, pred)
  return select_peers(peers, predicate(pred), true)
end

-- The peers that match and the peers that do not, both in original order.
local function partition(peers, pred)
  return select_peers(peers, pred, true), select_peers(peers, pred, false)
end

-- policy.match_metadata(peers, key, value) -> peers whose metadata[key]
-- equals value.
function policy.match_metadata(peers, key, value)
  return policy.filter(peers, function(peer)
    return peer.metadata ~= nil and peer.metadata[key] == value
  end)
end

-- policy.exclude_metadata(peers, key, value) -> peers whose metadata[key]
-- is anything but value (absent included): "everything except v2".
function policy.exclude_metadata(peers, key, value)
  return policy.filter(peers, function(peer)
    return peer.metadata == nil or peer.metadata[key] ~= value
  end)
end

-- policy.by(peers, key, value [, keep]) -> the peers whose metadata[key]
-- is value (keep true or absent; keep false: all the others). Given the
-- peers a policy was called with, the group is made once per topology and
-- the same table comes back on every call, so a subset that returns it
-- costs the same at 10,000 peers as at 2. The table is shared: never
-- modify it (copy it first). Any other table gets a fresh answer.
policy.by = om.peers_by

-- policy.by_zone(peers, zone) -> peers in that zone (none when zone is nil:
-- a peer without a zone is in no zone).
function policy.by_zone(peers, zone)
  return policy.filter(peers, function(peer)
    return zone ~= nil and peer.zone == zone
  end)
end

-- policy.zone_local(peers, zone [, min_peers]) -> the peers of `zone` when
-- there are at least min_peers (default 1) of them, else all peers: keep
-- traffic in the caller's zone while the zone can carry it, spill over to
-- every zone when it cannot (or when the caller's zone is unknown).
function policy.zone_local(peers, zone, min_peers)
  min_peers = min_peers or 1
  if math.type(min_peers) ~= "integer" or min_peers < 1 then
    misuse("zone_local: min_peers must be an integer >= 1, got %s", tostring(min_peers))
  end
  local here = policy.by_zone(peers, zone)
  if #here >= min_peers then
    return here
  end
  return policy.filter(peers, function()
    return true
  end)
end

-- Stable per-key randomness ---------------------------------------------

-- openmesh.hash is XXH3-64 of the key as a Lua integer, the same in C and
-- Lua, so every proxy of the mesh puts a key in the same bucket.
local hash = om.hash

-- policy.unit(key) -> a number in [0, 1), uniform over keys and the same
-- for the same key on every process: the top 53 bits of the key's hash.
function policy.unit(key)
  if type(key) ~= "string" then
    misuse("unit: key must be a string, got %s", type(key))
  end
  return (hash(key) >> 11) * 0x1p-53 -- >> is logical: 0 <= h >> 11 < 2^53
end

-- policy.split(peers, key, weights [, label_of]) -> the peers of one label,
-- chosen per key in proportion to `weights` (label -> weight >= 0, e.g.
-- {v1 = 90, v2 = 10}) and stable per key. label_of(peer) gives a peer's
-- label; a string names a metadata field; default "version". Labels are
-- laid out on [0, 1) in sorted order, so the same weights always give the
-- same assignment. A nil key goes to the heaviest label (ties: the first in
-- sorted order). Peers whose label has no weight are never chosen, and a
-- chosen label without peers gives the empty array (no spill-over).
function policy.split(peers, key, weights, label_of)
  if type(weights) ~= "table" then
    misuse("split: weights must be a table of label -> weight, got %s", type(weights))
  end
  label_of = label_of or "version"
  if type(label_of) == "string" then
    local field = label_of
    label_of = function(peer)
      return peer.metadata and peer.metadata[field]
    end
  end
  local labels, total = {}, 0
  for label, w in pairs(weights) do
    if type(w) ~= "number" or not (w >= 0 and w < math.huge) then
      misuse("split: weight of %s must be a finite number >= 0, got %s", tostring(label), tostring(w))
    end
    labels[#labels + 1] = label
    total = total + w
  end
  if total <= 0 then
    misuse("split: weights must add up to more than 0")
  end
  table.sort(labels, function(a, b)
    return tostring(a) < tostring(b)
  end)
  local chosen
  if key == nil then
    for _, label in ipairs(labels) do
      if chosen == nil or weights[label] > weights[chosen] then
        chosen = label
      end
    end
  else
    local point, acc = policy.unit(key) * total, 0
    for _, label in ipairs(labels) do
      acc = acc + weights[label]
      if point < acc and weights[label] > 0 then
        chosen = label
        break
      end
    end
    chosen = chosen or labels[#labels] -- rounding at the very top
  end
  return policy.filter(peers, function(peer)
    return label_of(peer) == chosen
  end)
end

-- policy.canary(peers, key, percent, is_canary) -> for `percent` of keys
-- (0..100, stable per key: unit(key) * 100 < percent), the canary peers;
-- for every other key, and for requests without a key, only the other
-- peers. is_canary: a predicate or a metadata table ({version = "v2"}).
-- Raising percent keeps every key that was already in the canary. A canary
-- key while no canary peer exists goes to the stable peers (the canary is
-- simply not deployed); a stable key never reaches a canary peer, even when
-- no stable peer is left (then the answer is empty).
local canary_percent_ok -- the last percent that passed the check

function policy.canary(peers, key, percent, is_canary)
  if percent ~= canary_percent_ok then -- a policy passes the same one each call
    if type(percent) ~= "number" or not (percent >= 0 and percent <= 100) then
      misuse("canary: percent must be a number in [0, 100], got %s", tostring(percent))
    end
    canary_percent_ok = percent
  end
  local select = type(is_canary) == "table" and select_metadata or select_peers
  local pred = select == select_peers and predicate(is_canary) or is_canary
  if key ~= nil and policy.unit(key) * 100 < percent then
    local canary = select(peers, pred, true)
    if #canary > 0 then
      return canary
    end
  end
  return select(peers, pred, false) -- only the side it returns is built
end

-- Request helpers --------------------------------------------------------

-- policy.header(req, name) -> the value of header `name` (any case; the
-- proxy gives lower-case names), or nil when absent or empty.
-- The lower-case form of the names policies ask for. They are constants in
-- policy code, so a few entries serve every request; name:lower() built a
-- new string per lookup. Bounded, in case a policy computes its names.
local lower_of, lower_count = {}, 0

function policy.header(req, name)
  -- The hot path of most policies (called per request, often twice): plain
  -- indexing, with type checks only where a value is unusual.
  local headers = req.headers
  if headers == nil then
    return nil
  end
  local v = headers[name] -- the proxy's names are already lower-case
  if v == nil then
    local lower = lower_of[name]
    if lower == nil then
      lower = name:lower()
      if lower_count < 256 then
        lower_of[name], lower_count = lower, lower_count + 1
      end
    end
    if lower ~= name then
      v = headers[lower]
    end
  end
  if v == "" or v == nil or type(v) ~= "string" then
    return nil
  end
  return v
end

local function is_ows(b)
  return b == 32 or b == 9 -- SP / HTAB
end

-- s without leading and trailing spaces and tabs. A byte loop, not
-- s:match("^%s*(.-)%s*$"), which backtracks quadratically on long runs of
-- spaces inside C code that no instruction budget can interrupt.
local function trim(s)
  local i, j = 1, #s
  while i <= j and is_ows(s:byte(i)) do
    i = i + 1
  end
  while j >= i and is_ows(s:byte(j)) do
    j = j - 1
  end
  return s:sub(i, j)
end

-- policy.cookie(req, name) -> the value of cookie `name` from the Cookie
-- header, or nil when there is no such cookie or its value is empty.
-- Parses "a=1; b=2" (RFC 6265 section 4.2.1, leniently as in section
-- 5.2: whitespace around names and values ignored, pairs without '='
-- skipped), names compared exactly, the first occurrence wins, and one
-- pair of surrounding double quotes is removed (cookie-value, section
-- 4.1.1). Linear in the header's length whatever it holds.
function policy.cookie(req, name)
  local header = policy.header(req, "cookie")
  if header == nil then
    return nil
  end
  local pos, len = 1, #header
  while pos <= len do
    local semi = header:find(";", pos, true) or len + 1
    local pair = header:sub(pos, semi - 1)
    local eq = pair:find("=", 1, true)
    if eq and trim(pair:sub(1, eq - 1)) == name then
      local v = trim(pair:sub(eq + 1))
      if #v >= 2 and v:byte(1) == 34 and v:byte(-1) == 34 then
        v = v:sub(2, -2)
      end
      return v ~= "" and v or nil
    end
    pos = semi + 1
  end
  return nil
end

return policy
