-- bench/wrk/users.lua: every request carries a user no request before it
-- carried (x-user: u-THREAD-N), so a traffic policy that varies on x-user
-- (examples/policies/canary.lua) misses the proxy's decision cache and runs
-- its Lua on every call. The other contenders get the same requests.
local threads = 0

function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end

local n = 0

function request()
  n = n + 1
  wrk.headers["x-user"] = "u-" .. tid .. "-" .. n
  return wrk.format()
end
