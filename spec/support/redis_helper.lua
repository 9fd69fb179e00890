-- redis_helper.lua: a real redis-server for integration specs, on a free
-- loopback port in a directory of the spec's own, stopped in teardown.
--
-- The server is started outside control_helper's process table on purpose:
-- specs call H.kill_all() in every finally, and the Redis must outlive the
-- control planes a test starts (it is what they share). R.stop_all() is the
-- teardown for everything started here.
local H = require "control_helper"

local R = {}

local servers = {} -- pid -> true

R.available = (select(2, H.sh("command -v redis-server >/dev/null 2>&1")) == 0)

-- A port nobody listens on: random below the kernel's ephemeral range
-- (32768+, where control planes on port 0 and clients land), checked with
-- redis-cli; launch() still retries another one if the bind fails.
math.randomseed(os.time() + math.floor((H.now() % 1) * 1e6))
local function free_port()
  for _ = 1, 50 do
    local port = math.random(20000, 32000)
    local _, rc = H.sh("timeout 2 redis-cli -p " .. port .. " ping >/dev/null 2>&1")
    if rc ~= 0 then
      return port
    end
  end
  error("no free port for redis-server")
end

local function ping(port)
  local out = H.sh("timeout 2 redis-cli -p " .. port .. " ping 2>/dev/null")
  return out:match("PONG") ~= nil
end

local function launch(r)
  local args = string.format(
    "redis-server --port %d --bind 127.0.0.1 --dir %s --save '' --loglevel warning %s",
    r.port, H.q(r.dir),
    r.persist and "--appendonly yes --appendfsync always" or "--appendonly no")
  local pidfile = r.dir .. "/redis.pid"
  os.remove(pidfile)
  os.execute("unset LD_PRELOAD; setsid sh -c " ..
    H.q("exec " .. args .. " >" .. H.q(r.dir .. "/redis.log") .. " 2>&1") ..
    " >/dev/null 2>&1 & echo $! >" .. H.q(pidfile))
  r.pid = H.wait_for(function()
    return tonumber(H.readfile(pidfile):match("%d+"))
  end, 5)
  assert(r.pid, "redis-server did not start")
  servers[r.pid] = true
  local up = H.wait_for(function()
    if ping(r.port) then
      return "up"
    end
    if not H.alive(r.pid) then
      return "exited" -- the port was taken
    end
  end, 5) == "up"
  if not up then
    servers[r.pid] = nil
    H.kill(r.pid, "KILL")
    r.pid = nil
  end
  return up, H.readfile(r.dir .. "/redis.log")
end

--[[
Start a redis-server. opts.persist: append-only file, fsync on every write
(a restart keeps everything). Returns {port, url, dir, pid, persist}.
]]
function R.start(opts)
  opts = opts or {}
  local r = { dir = H.tmpdir(), persist = opts.persist }
  local ok, log
  for _ = 1, 10 do
    r.port = free_port()
    ok, log = launch(r)
    if ok then
      break
    end
  end
  assert(ok, "redis-server did not start: " .. tostring(log))
  r.url = "redis://127.0.0.1:" .. r.port .. "/0"
  return r
end

-- Stop it hard (kill -9: what a crash looks like) and wait until it is gone.
function R.stop(r)
  if r.pid then
    H.kill(r.pid, "KILL")
    H.wait_for(function() return not H.alive(r.pid) end, 5)
    servers[r.pid] = nil
    r.pid = nil
  end
end

-- Start it again on the same port and directory (what persistence kept,
-- if any, is loaded).
function R.restart(r)
  R.stop(r)
  local ok, log = launch(r)
  assert(ok, "redis-server did not restart on port " .. r.port .. ": " .. tostring(log))
end

-- redis-cli against it; the output.
function R.cli(r, args)
  return (H.sh("timeout 5 redis-cli -p " .. r.port .. " " .. args))
end

function R.stop_all()
  for pid in pairs(servers) do
    H.kill(pid, "KILL")
    servers[pid] = nil
  end
end

return R
