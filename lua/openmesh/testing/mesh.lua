-- openmesh.testing.mesh: a real mesh inside a spec, what Pongo's
-- spec.helpers gives a Kong author, without containers.
--
--   local mesh = testing.mesh{
--     policy = "examples/policies/canary.lua",
--     services = { orders = {
--       { id = "v1", metadata = { version = "v1" } },
--       { id = "v2", metadata = { version = "v2" }, behaviour = "throttled", retry_after = 0 },
--     } },
--   }
--   local r = mesh:get("orders", "/", { headers = { ["x-user"] = "u-7" } })
--   -- r.status, r.body, r.headers (lower-case names), r.peer (the instance id)
--   mesh:close()
--
-- It runs `openmesh up` (OPENMESH_BIN, which `openmesh test` sets to
-- itself) on a generated up.json: the embedded control plane, the proxy
-- with the given traffic policy, and one example service per instance, on
-- loopback ports the kernel picks. Behaviours per instance: ok (default),
-- slow (delay_ms), flaky (fail_every), failing (status, default 503),
-- throttled (429 with Retry-After: retry_after seconds, default 1; "429"
-- is an alias), dying (a 200 stream cut after its first chunk). Every
-- upstream names itself in x-served-by, which is how r.peer is known.
-- Processes are driven through the shell (kill; requests through one
-- python3 client fed by FIFOs, else curl), so the same code runs under
-- stock busted and under `openmesh test`.
local M = {}

local BEHAVIOURS = {
  ok = "ok", fast = "ok", slow = "slow", flaky = "flaky", failing = "failing",
  throttled = "throttled", ["429"] = "throttled", dying = "dying",
}
local FIELDS = {
  id = "string", behaviour = "string", zone = "string", metadata = "table",
  delay_ms = "number", fail_every = "number", status = "number",
  retry_after = "number",
}

local function fail(msg)
  error("testing.mesh: " .. msg, 4)
end

local function q(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

-- Children run without LD_PRELOAD (a sanitizer runtime preloaded into
-- busted deadlocks curl).
local function sh(cmd)
  local f = assert(io.popen("unset LD_PRELOAD; " .. cmd .. '; printf "\\n__rc=%d" $?', "r"))
  local out = f:read("a")
  f:close()
  local rc = tonumber(out:match("__rc=(%d+)$"))
  return (out:gsub("\n?__rc=%d+$", "")), rc
end

local function readfile(path)
  local f = io.open(path, "rb")
  if not f then
    return ""
  end
  local s = f:read("a")
  f:close()
  return s
end

local function writefile(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

local ok_system, system = pcall(require, "system")
local function now()
  if ok_system and system.monotime then
    return system.monotime()
  end
  return os.time()
end
local function nap()
  if ok_system and system.sleep then
    system.sleep(0.005)
  else
    os.execute("sleep 0.01")
  end
end

-- Poll fn until it answers (a positive marker), at most timeout seconds.
local function wait_for(fn, timeout)
  local deadline = now() + timeout
  repeat
    local v = fn()
    if v then
      return v
    end
    nap()
  until now() > deadline
  return nil
end

-- The JSON of up.json: strings, integers, arrays and objects only.
local function json(v)
  local t = type(v)
  if t == "string" then
    return '"' .. v:gsub('[%c"\\]', function(c)
      return string.format("\\u%04x", c:byte())
    end) .. '"'
  elseif t == "number" then
    return string.format("%d", v)
  elseif t == "table" then
    if #v > 0 then
      local parts = {}
      for i, x in ipairs(v) do
        parts[i] = json(x)
      end
      return "[" .. table.concat(parts, ",") .. "]"
    end
    local keys, parts = {}, {}
    for k in pairs(v) do
      keys[#keys + 1] = k
    end
    table.sort(keys)
    for i, k in ipairs(keys) do
      parts[i] = json(k) .. ":" .. json(v[k])
    end
    return "{" .. table.concat(parts, ",") .. "}"
  end
  error("cannot encode " .. t)
end

-- up.json's services array from { name = { instance, ... } }.
local function instances(services)
  if type(services) ~= "table" or next(services) == nil then
    fail("services: a table { NAME = { {id = ...}, ... } } expected")
  end
  local names, list, seen = {}, {}, {}
  for name in pairs(services) do
    if type(name) ~= "string" then
      fail("services: names must be strings")
    end
    names[#names + 1] = name
  end
  table.sort(names)
  for _, name in ipairs(names) do
    local insts = services[name]
    if type(insts) ~= "table" or #insts == 0 then
      fail(("services.%s: a non-empty list of instances expected"):format(name))
    end
    for i, inst in ipairs(insts) do
      local where = ("services.%s[%d]"):format(name, i)
      if type(inst) ~= "table" or type(inst.id) ~= "string" then
        fail(where .. ".id: a string expected")
      end
      for k, v in pairs(inst) do
        if FIELDS[k] == nil then
          fail(("%s.%s: unknown field"):format(where, tostring(k)))
        elseif type(v) ~= FIELDS[k] then
          fail(("%s.%s: %s expected, got %s"):format(where, k, FIELDS[k], type(v)))
        end
      end
      if seen[inst.id] then
        fail(where .. ".id: duplicate instance id '" .. inst.id .. "'")
      end
      seen[inst.id] = true
      local b = BEHAVIOURS[inst.behaviour or "ok"]
      if b == nil then
        fail(("%s.behaviour: unknown '%s' (ok, slow, flaky, failing, throttled, dying)")
          :format(where, inst.behaviour))
      end
      list[#list + 1] = {
        service = name, id = inst.id, port = 0, behaviour = b, zone = inst.zone,
        metadata = inst.metadata, delay_ms = inst.delay_ms, fail_every = inst.fail_every,
        status = inst.status, retry_after = inst.retry_after,
      }
    end
  end
  return list
end

local Mesh = {}
Mesh.__index = Mesh

-- The client a mesh keeps for its requests: one python3 process (a
-- process start per request, curl's, was most of a spec's time), fed
-- through two FIFOs. A request is lines: method, host:port, target, Host,
-- timeout in s, the header count, "name: value" each, the body length,
-- then the body; the answer the same way: status (0 when the call
-- failed, the error as the body), the header count, the headers, the
-- body length, the body.
local CLIENT = [=[
import http.client, sys
req = open(sys.argv[1], "rb")
resp = open(sys.argv[2], "wb", buffering=0)
def line():
    l = req.readline()
    if not l:
        sys.exit(0)
    return l.rstrip(b"\n").decode("latin-1")
while True:
    method, hostport, target, host = line(), line(), line(), line()
    timeout, n = float(line()), int(line())
    headers = [line().split(": ", 1) for _ in range(n)]
    blen = int(line())
    body = req.read(blen) if blen >= 0 else None
    try:
        c = http.client.HTTPConnection(hostport, timeout=timeout)
        c.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
        c.putheader("Host", host)
        for k, v in headers:
            c.putheader(k, v)
        if body is not None:
            c.putheader("Content-Length", str(len(body)))
        c.endheaders(body)
        r = c.getresponse()
        data, status, rh = r.read(), r.status, r.getheaders()
        c.close()
    except Exception as e:
        status, rh, data = 0, [], repr(e).encode()
    head = [str(status), str(len(rh))] + ["%s: %s" % kv for kv in rh] + [str(len(data))]
    resp.write(("\n".join(head) + "\n").encode("latin-1") + data)
]=]

-- Start the client; false when python3 or mkfifo is missing (then each
-- request runs curl).
local function start_client(self)
  local req, resp = self.dir .. "/client.req", self.dir .. "/client.resp"
  writefile(self.dir .. "/client.py", CLIENT)
  local _, rc = sh(("command -v python3 >/dev/null && mkfifo %s %s && " ..
    "(python3 %s %s %s >%s 2>&1 </dev/null &)"):format(q(req), q(resp),
    q(self.dir .. "/client.py"), q(req), q(resp), q(self.dir .. "/client.log")))
  if rc ~= 0 then
    return false
  end
  self.creq = assert(io.open(req, "wb")) -- both ends open in the same order
  self.cresp = assert(io.open(resp, "rb"))
  return true
end

local function client_request(self, method, service, path, headers, body, max_time)
  local hostport = self.url:match("^http://([^/]+)")
  local lines = { method, hostport, path, service, tostring(max_time) }
  local hs = {}
  for name, value in pairs(headers or {}) do
    hs[#hs + 1] = name .. ": " .. value
  end
  lines[#lines + 1] = tostring(#hs)
  for _, h in ipairs(hs) do
    lines[#lines + 1] = h
  end
  lines[#lines + 1] = tostring(body and #body or -1)
  self.creq:write(table.concat(lines, "\n") .. "\n" .. (body or ""))
  self.creq:flush()
  local f = self.cresp
  local status = tonumber(f:read("l"))
  if status == nil then
    fail("the request client stopped: " .. readfile(self.dir .. "/client.log"))
  end
  local got = {}
  for _ = 1, tonumber(f:read("l")) do
    local name, value = f:read("l"):match("^([^:]+):%s*(.*)$")
    got[name:lower()] = value
  end
  local n = tonumber(f:read("l"))
  local data = n > 0 and f:read(n) or ""
  return { status = status, body = data, headers = got, peer = got["x-served-by"] }
end

-- One request; { status, body, headers, peer }.
function Mesh:request(method, service, path, opts)
  opts = opts or {}
  local headers = opts.headers
  if headers == nil and opts.body == nil and opts.max_time == nil then
    headers = opts -- mesh:get("orders", "/", { ["x-user"] = "u-7" })
  end
  if self.creq then
    return client_request(self, method, service, path, headers, opts.body, opts.max_time or 5)
  end
  self.n = self.n + 1
  local bodyfile = ("%s/resp%d"):format(self.dir, self.n)
  local headfile = ("%s/head%d"):format(self.dir, self.n)
  local max_time = opts.max_time or 5
  -- curl's own --max-time bounds the call: no timeout(1) wrapper, one
  -- process less per request (process starts are most of a request's cost)
  local args = {
    ("curl --max-time %d -s -X %s"):format(max_time, q(method)),
    "-o", q(bodyfile), "-D", q(headfile), "-w", q("%{http_code}"), "-H", q("Host: " .. service),
  }
  for name, value in pairs(headers or {}) do
    args[#args + 1] = "-H " .. q(name .. ": " .. value)
  end
  if opts.body then
    local reqfile = ("%s/req%d"):format(self.dir, self.n)
    writefile(reqfile, opts.body)
    args[#args + 1] = "--data-binary @" .. q(reqfile)
  end
  args[#args + 1] = q(self.url .. path)
  local out = sh(table.concat(args, " "))
  local got = {}
  -- the last head only (curl writes every interim 1xx head too)
  local head = readfile(headfile)
  head = head:match(".*\r\n(HTTP/[^\r\n]*\r\n.*)$") or head
  for name, value in head:gmatch("([%w%-]+):%s*([^\r\n]*)") do
    got[name:lower()] = value
  end
  local body = readfile(bodyfile)
  os.remove(bodyfile)
  os.remove(headfile)
  return { status = tonumber(out) or 0, body = body, headers = got, peer = got["x-served-by"] }
end

function Mesh:get(service, path, opts)
  return self:request("GET", service, path or "/", opts)
end

function Mesh:post(service, path, body, opts)
  opts = opts or {}
  opts.body = body or ""
  return self:request("POST", service, path or "/", opts)
end

-- The proxy's /status (text), and its metrics (text).
function Mesh:status()
  return (sh(("curl -s --max-time 5 %s"):format(q(self.admin .. "/status"))))
end

function Mesh:metrics()
  return (sh(("curl -s --max-time 5 %s"):format(q(self.admin .. "/metrics"))))
end

-- Reload the policy now (SIGHUP), as an edit on disk does.
function Mesh:reload()
  sh("kill -HUP " .. self.pid)
end

-- Stop everything: SIGTERM (deregister, drain), then SIGKILL to the whole
-- process group if it has not exited within 5 s. Idempotent.
function Mesh:close()
  if self.closed then
    return
  end
  self.closed = true
  if self.creq then -- the client exits at the end of its input
    self.creq:close()
    self.cresp:close()
    self.creq, self.cresp = nil, nil
  end
  -- One shell for the whole wait: a process start per poll would cost
  -- more than the shutdown itself. The mesh was orphaned at start, so its
  -- exit is seen in /proc (state Z: exited, waiting for whoever reaps
  -- orphans, which may take a while), not by kill -0.
  local pid = self.pid
  sh(([[
kill -TERM %d 2>/dev/null
alive() { read -r st < /proc/%d/stat 2>/dev/null || return 1; case "$st" in *") Z "*) return 1;; esac; }
i=0
while alive && [ $i -lt 500 ]; do sleep 0.01; i=$((i+1)); done
alive && kill -KILL -%d 2>/dev/null
rm -rf %s]]):format(pid, pid, pid, q(self.dir)))
end
Mesh.__close = Mesh.close
Mesh.__gc = Mesh.close

-- testing.mesh{services = {...}, policy = FILE [, bin = PATH]
--              [, timeout = s]} -> a started mesh (see the top of this file).
function M.start(opts)
  if type(opts) ~= "table" then
    fail("a table {services = ..., policy = FILE} expected")
  end
  for k in pairs(opts) do
    if k ~= "services" and k ~= "policy" and k ~= "bin" and k ~= "timeout" then
      fail("unknown field '" .. tostring(k) .. "'")
    end
  end
  local bin = opts.bin or os.getenv("OPENMESH_BIN")
  if bin == nil or bin == "" then
    fail("no openmesh binary: set OPENMESH_BIN, or run the spec with `openmesh test`")
  end
  if opts.policy ~= nil and (type(opts.policy) ~= "string" or not io.open(opts.policy)) then
    fail("policy: a readable file expected, got " .. tostring(opts.policy))
  end
  local list = instances(opts.services)
  local dir = sh("mktemp -d /tmp/om-mesh.XXXXXX"):gsub("%s+$", "")
  local proxy = { port = 0, admin_port = 0 }
  if opts.policy then
    proxy.policy = opts.policy
  end
  writefile(dir .. "/up.json", json({
    control = { host = "127.0.0.1", port = 0 }, proxy = proxy, services = list,
  }))
  local out = dir .. "/up.out"
  -- setsid: the mesh leads its own process group, so close can end all of it
  local pid = tonumber((sh(("setsid %s up %s >%s 2>&1 </dev/null & echo $!")
    :format(q(bin), q(dir), q(out)))))
  local self = setmetatable({ dir = dir, pid = pid, n = 0, out = out }, Mesh)
  local timeout = opts.timeout or 10
  local banner = wait_for(function()
    local text = readfile(out)
    if text:find("OpenMesh is up.", 1, true) then
      return text
    end
    local _, rc = sh("kill -0 " .. pid .. " 2>/dev/null")
    if rc ~= 0 then
      return false
    end
  end, timeout)
  if not banner then
    local log = readfile(out)
    self:close()
    fail("openmesh up did not start:\n" .. log)
  end
  local cp = banner:match("control plane%s+(http://[%d%.]+:%d+)")
  local px, admin = banner:match("proxy%s+(http://[%d%.]+:%d+)%s+%(admin: (http://[%d%.]+:%d+)/status%)")
  self.control, self.url, self.admin = cp, px, admin
  self.log = function()
    return readfile(out)
  end
  -- ready when every service lists all its instances in the registry the
  -- proxy is fed from
  local want = {}
  for _, inst in ipairs(list) do
    want[inst.service] = (want[inst.service] or 0) + 1
  end
  for service, n in pairs(want) do
    local ok = wait_for(function()
      local body = sh(("curl -s --max-time 2 %s"):format(q(cp .. "/v1/services/" .. service)))
      local _, count = body:gsub('"url":', "")
      return count >= n
    end, timeout)
    if not ok then
      local log = readfile(out)
      self:close()
      fail(("service '%s' did not register its %d instances:\n%s"):format(service, n, log))
    end
  end
  start_client(self)
  return self
end

return M
