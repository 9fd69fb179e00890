-- control_helper.lua: drive the real `openmesh control` binary from busted
-- specs: start it on a free port (read back from its start log line), talk
-- to it with curl, watch it with `curl -N`, signal it, and make sure every
-- process a spec started is gone afterwards (kill_all in a finally).
--
-- Everything goes through the shell (io.popen/os.execute), so it runs in
-- stock lua5.4 and inside `openmesh test` alike; every curl has --max-time
-- and runs under timeout(1).
local cjson = require "cjson"

local M = {}

M.bin = os.getenv("OPENMESH_BIN")

local started = {} -- pid -> process group, for kill_all

-- Single-quote s for sh.
local function q(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end
M.q = q

-- Children run without LD_PRELOAD: `make check` with CI=true preloads the
-- sanitizer runtimes into busted, and curl deadlocks under a preloaded ASan
-- (the sanitized openmesh binary is linked with them anyway).
local CLEAN = "unset LD_PRELOAD; "

-- curl with --max-time, and a hard stop a little later should curl itself
-- ever wedge: no spec can hang on a client.
function M.curl(max_time)
  return string.format("timeout -k 1 %d curl --max-time %d", max_time + 5, max_time)
end

-- Run a command; its stdout and exit status.
local function sh(cmd)
  local f = assert(io.popen(CLEAN .. cmd .. '; printf "\\n__rc=%d" $?', "r"))
  local out = f:read("a")
  f:close()
  local rc = tonumber(out:match("__rc=(%d+)$"))
  return out:gsub("\n?__rc=%d+$", ""), rc
end
M.sh = sh

local function readfile(path)
  local f = io.open(path, "rb")
  if not f then
    return ""
  end
  local s = f:read("a")
  f:close()
  return s
end
M.readfile = readfile

local function writefile(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end
M.writefile = writefile

-- Monotonic seconds (luasystem when present, else date).
local ok_system, system = pcall(require, "system")
function M.now()
  if ok_system and system.monotime then
    return system.monotime()
  end
  local out = sh("date +%s.%N")
  return tonumber(out)
end

function M.sleep(s)
  if ok_system and system.sleep then
    system.sleep(s)
  else
    os.execute("sleep " .. s)
  end
end

-- Poll fn() until it returns a truthy value or timeout seconds pass.
function M.wait_for(fn, timeout, step)
  local deadline = M.now() + (timeout or 5)
  repeat
    local v = fn()
    if v then
      return v
    end
    M.sleep(step or 0.02)
  until M.now() > deadline
  return nil
end

function M.tmpdir()
  local out = sh("mktemp -d /tmp/om-control-spec.XXXXXX")
  return (out:gsub("%s+$", ""))
end

function M.alive(pid)
  local _, rc = sh("kill -0 " .. pid .. " 2>/dev/null")
  return rc == 0
end

-- pid may be "-PGID" (dash's kill takes no "--").
function M.kill(pid, sig)
  os.execute("kill -" .. (sig or "KILL") .. " " .. pid .. " 2>/dev/null")
end

-- Every process started through this module, with whatever it started
-- (its process group), killed hard: for finally and teardown.
function M.kill_all()
  for pid, pgid in pairs(started) do
    M.kill("-" .. pgid, "KILL")
    M.kill(pid, "KILL")
    started[pid] = nil
  end
end

--[[
Start a background command in a process group of its own. A small sh
leads the group, is the command's parent and records its exit status in
rcfile (one per spawn), so a spec can check how it exited after a
signal. Returns {pid, pgid, rcfile, out} where out holds its stdout and
stderr.
]]
local spawns = 0
function M.spawn(cmd, dir, name)
  local out = dir .. "/" .. name .. ".out"
  local pidfile = dir .. "/" .. name .. ".pid"
  -- one rc file per spawn: a killed process's sh may still write its
  -- status after a later spawn of the same name started
  spawns = spawns + 1
  local rcfile = dir .. "/" .. name .. "." .. spawns .. ".rc"
  os.remove(rcfile)
  os.remove(pidfile)
  local inner = string.format(
    "pg=$$; %s >%s 2>&1 & echo \"$! $pg\" >%s.tmp; mv %s.tmp %s; wait $!; echo $? >%s",
    cmd, q(out), q(pidfile), q(pidfile), q(pidfile), q(rcfile))
  os.execute(CLEAN .. "setsid sh -c " .. q(inner) .. " >/dev/null 2>&1 &")
  local ids = M.wait_for(function()
    local pid, pgid = readfile(pidfile):match("(%d+) (%d+)")
    return pid and { tonumber(pid), tonumber(pgid) }
  end, 5)
  assert(ids, "could not start: " .. cmd)
  started[ids[1]] = ids[2]
  return { pid = ids[1], pgid = ids[2], rcfile = rcfile, out = out }
end

-- The exit status of a spawned process once it has exited (nil on timeout).
function M.exit_status(p, timeout)
  return M.wait_for(function()
    return tonumber(readfile(p.rcfile):match("%d+"))
  end, timeout or 5)
end

--[[
Start `openmesh control --listen 127.0.0.1:0 --warmup 0 ARGS` and read the
port from its start log line ({"event":"control_listening","url":...}).
Without a warm-up window unless ARGS give one (the last --warmup counts):
a spec that starts a plane with a memory store would otherwise see it warm
up for an hour (docs/CONTROL.md "Warm-up").
]]
local n_started = 0
function M.start_control(dir, args)
  n_started = n_started + 1
  local p = M.spawn(q(M.bin) .. " control --listen 127.0.0.1:0 --warmup 0 " .. (args or ""),
    dir, "control" .. n_started)
  local port = M.wait_for(function()
    local log = readfile(p.out)
    local port = log:match('"event":"control_listening","url":"http://127%.0%.0%.1:(%d+)"')
    if port then
      return tonumber(port)
    end
    if readfile(p.rcfile) ~= "" then
      return -1 -- it exited
    end
  end, 5)
  assert(port and port > 0, "openmesh control did not start: " .. readfile(p.out))
  p.port = port
  p.url = "http://127.0.0.1:" .. port
  return p
end

-- SIGTERM and the exit status.
function M.stop(p)
  M.kill(p.pid, "TERM")
  local rc = M.exit_status(p, 10)
  started[p.pid] = nil
  return rc
end

--[[
One HTTP request with curl. opts: body (string), headers (list of "Name:
value"), max_time (s). Returns status (0 when no answer), body, headers
(lower-cased names).
]]
local n_req = 0
function M.request(dir, method, url, opts)
  opts = opts or {}
  n_req = n_req + 1
  local bodyfile = dir .. "/resp" .. n_req
  local headfile = dir .. "/head" .. n_req
  local args = { M.curl(opts.max_time or 5) .. " -s", "-X", q(method),
    "-o", q(bodyfile), "-D", q(headfile), "-w", q("%{http_code}") }
  for _, h in ipairs(opts.headers or {}) do
    args[#args + 1] = "-H " .. q(h)
  end
  if opts.body then
    local reqfile = dir .. "/req" .. n_req
    writefile(reqfile, opts.body)
    args[#args + 1] = "--data-binary @" .. q(reqfile)
  end
  args[#args + 1] = q(url)
  local out = sh(table.concat(args, " "))
  local headers = {}
  for name, value in readfile(headfile):gmatch("([%w%-]+):%s*([^\r\n]*)") do
    headers[name:lower()] = value
  end
  local body = readfile(bodyfile)
  os.remove(bodyfile)
  os.remove(headfile)
  return tonumber(out) or 0, body, headers
end

-- A revision as decimal text (cjson decodes numbers as floats; revisions
-- are below 2^53, so exact).
function M.rev(n)
  return string.format("%.0f", n)
end

function M.json(body)
  local ok, v = pcall(cjson.decode, body)
  assert(ok, "not JSON: " .. tostring(body))
  return v
end

-- Register one instance; the decoded answer.
function M.register(dir, base, service, id, fields)
  local status, body = M.request(dir, "PUT",
    base .. "/v1/services/" .. service .. "/instances/" .. id,
    { body = cjson.encode(fields) })
  assert(status == 200, "register " .. id .. ": " .. status .. " " .. body)
  return M.json(body)
end

--[[
Parse a text/event-stream (LF line ends, as the server writes them):
events {type, id, data} dispatched on blank lines, comments counted.
]]
function M.parse_sse(text)
  local events, comments, retry = {}, 0, nil
  local ev = { data = {} }
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    if line == "" then
      if #ev.data > 0 then
        events[#events + 1] = { type = ev.type or "message", id = ev.id,
          data = table.concat(ev.data, "\n") }
      end
      ev = { data = {}, id = ev.id }
    elseif line:sub(1, 1) == ":" then
      comments = comments + 1
    else
      local field, value = line:match("^([^:]*):? ?(.*)$")
      if field == "data" then
        ev.data[#ev.data + 1] = value
      elseif field == "event" then
        ev.type = value
      elseif field == "id" then
        ev.id = value
      elseif field == "retry" then
        retry = tonumber(value)
      end
    end
  end
  return events, comments, retry
end

--[[
A watch with `curl -N` in the background: {proc, file}; events(w) parses
what arrived so far. The curl exits by itself after max_time seconds.
]]
local n_watch = 0
function M.watch(dir, url, headers, max_time)
  n_watch = n_watch + 1
  local args = { M.curl(max_time or 20) .. " -sN" }
  for _, h in ipairs(headers or {}) do
    args[#args + 1] = "-H " .. q(h)
  end
  args[#args + 1] = q(url)
  local w = M.spawn(table.concat(args, " "), dir, "watch" .. n_watch)
  w.file = w.out
  return w
end

function M.events(w)
  return M.parse_sse(readfile(w.file))
end

-- Wait until watch w has at least n events; the events.
function M.wait_events(w, n, timeout)
  local evs
  M.wait_for(function()
    evs = M.events(w)
    return #evs >= n
  end, timeout or 5)
  return evs
end

-- Raw bytes to the server over bash's /dev/tcp; what came back within t s.
function M.raw(port, bytes, t)
  local f = os.tmpname()
  writefile(f, bytes)
  local out = sh(string.format(
    "bash -c 'exec 3<>/dev/tcp/127.0.0.1/%d; cat %s >&3; timeout %s cat <&3' 2>/dev/null",
    port, f, t or 2))
  os.remove(f)
  return out
end

--[[
Start `openmesh proxy` (OPENMESH_BIN) on free ports with the extra command
line args, as spawn(cmd, dir, name) does, and wait for its
proxy_listening line. opts.env: a prefix for the command (VAR=value ...);
opts.wrap: a function that turns the command into the one to run (a
ulimit in a subshell, say). Returns spawn's record with port, admin_port,
url and admin added; fails the spec with the proxy's output when it does
not start within 10 s.
]]
function M.start_proxy(dir, name, args, opts)
  opts = opts or {}
  local cmd = (opts.env or "") .. q(M.bin) ..
    " proxy --listen 127.0.0.1:0 --admin 127.0.0.1:0 " .. (args or "")
  if opts.wrap then
    cmd = opts.wrap(cmd)
  end
  local p = M.spawn(cmd, dir, name)
  local ports = M.wait_for(function()
    local a, b = readfile(p.out):match(
      '"event":"proxy_listening","url":"http://127%.0%.0%.1:(%d+)","admin":"http://127%.0%.0%.1:(%d+)"')
    if a then
      return { tonumber(a), tonumber(b) }
    end
    if readfile(p.rcfile) ~= "" then
      return { -1 }
    end
  end, 10)
  assert(ports and ports[1] > 0, "openmesh proxy did not start: " .. readfile(p.out))
  p.port, p.admin_port = ports[1], ports[2]
  p.url = "http://127.0.0.1:" .. ports[1]
  p.admin = "http://127.0.0.1:" .. ports[2]
  return p
end

--[[
Start `openmesh up` (OPENMESH_BIN) with the extra command line args (its
flags and DIR), as spawn(cmd, dir, name) does, and wait up to 10 s for its
"OpenMesh is up." line. Returns spawn's record; or nil when it exited or
did not come up in time (it is killed then) and a line saying which, with
its output, so a caller can report it and try again on other ports.
]]
function M.start_up(dir, name, args)
  local p = M.spawn(q(M.bin) .. " up " .. args, dir, name)
  local state = M.wait_for(function()
    if readfile(p.out):find("OpenMesh is up.", 1, true) then
      return "up"
    end
    if readfile(p.rcfile) ~= "" then
      return "exited"
    end
  end, 10)
  if state == "up" then
    return p
  end
  M.kill(p.pid, "KILL")
  return nil, ("%s after 10 s; its output:\n%s"):format(state or "not up", readfile(p.out))
end

--[[
Start a test fixture binary built beside OPENMESH_BIN (fake_provider,
webhook_sink: each prints "listening http://127.0.0.1:PORT") with args, as
spawn does, and wait up to 5 s for that line. Returns spawn's record with
url added.
]]
function M.start_fixture(dir, name, args)
  local bindir = M.bin:match("^(.*)/[^/]*$")
  local p = M.spawn(q(bindir .. "/" .. name) .. " " .. (args or ""), dir, name .. math.random(1e6))
  local port = M.wait_for(function()
    return tonumber(readfile(p.out):match("listening http://127%.0%.0%.1:(%d+)"))
  end, 5)
  assert(port, name .. " did not start: " .. readfile(p.out))
  p.url = "http://127.0.0.1:" .. port
  return p
end

-- nginx's path, or nil when it is not installed (scripts/deps-bench).
function M.nginx_path()
  for _, p in ipairs({ "/usr/sbin/nginx", "/usr/bin/nginx" }) do
    local f = io.open(p, "r")
    if f then
      f:close()
      return p
    end
  end
end

--[[
Start nginx (NGINX, from M.nginx_path) with the configuration conf(base)
builds for a port base, trying up to four random bases from low (a
multiple of step above it) until one starts: when it is listening on
probe(base), the process (M.spawn's table) and the base are returned;
errors with nginx's log otherwise. The caller's conf writes the pid and
error log under dir.
]]
function M.start_nginx(dir, nginx, low, step, conf, probe)
  math.randomseed(os.time() + tonumber(tostring({}):match("0x(%x+)"), 16) % 1000)
  for _ = 1, 4 do
    local base = low + math.random(0, 400) * step
    M.writefile(dir .. "/nginx.conf", conf(base))
    local p = M.spawn(q(nginx) .. " -p " .. q(dir) .. " -e " .. q(dir .. "/nginx.log") ..
      " -c " .. q(dir .. "/nginx.conf") .. " -g 'daemon off;'", dir, "nginx" .. base)
    local ok = M.wait_for(function()
      if readfile(p.rcfile) ~= "" then
        return "exited"
      end
      local _, rc = M.sh("bash -c 'exec 3<>/dev/tcp/127.0.0.1/" .. probe(base) .. "' 2>/dev/null")
      if rc == 0 then
        return "up"
      end
    end, 10)
    if ok == "up" then
      return p, base
    end
    M.kill("-" .. p.pgid, "KILL")
  end
  error("nginx did not start: " .. readfile(dir .. "/nginx.log"))
end

--[[
Start `openmesh egress --listen 127.0.0.1:0` with the extra command line
args (env: assignments put before the command) and wait up to 10 s for its
egress_listening line. Returns spawn's record with url added; fails the
spec with the gateway's output when it does not start.
]]
function M.start_egress(dir, name, args, env)
  local p = M.spawn((env or "") .. " " .. q(M.bin) .. " egress --listen 127.0.0.1:0 " .. (args or ""), dir, name)
  local port = M.wait_for(function()
    local port = readfile(p.out):match('"event":"egress_listening","url":"http://127%.0%.0%.1:(%d+)"')
    if port then return tonumber(port) end
    if readfile(p.rcfile) ~= "" then return -1 end
  end, 10)
  assert(port and port > 0, "openmesh egress did not start: " .. readfile(p.out))
  p.url = "http://127.0.0.1:" .. port
  return p
end

return M
